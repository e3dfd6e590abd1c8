//! A connection's pending output: encoded frames, with large message
//! bodies left where they are (shared with the message) instead of copied
//! into the buffer, and the vectored write that sends it.
//!
//! A 16 KB delivery used to be copied twice in user space: into the
//! output buffer, and again whenever that buffer grew (it starts empty
//! after every write). The kernel copies it once more into the socket.
//! Now the buffer holds the frame headers and small bodies; a body piece
//! of at least [`SHARED_BODY_BYTES_MIN`] goes out from the message's own
//! memory in the same `writev`.
//!
//! Invariants:
//! - The bytes on the wire are `parts` in order, then `tail`: the frames in
//!   the order they were appended.
//! - `len` is the number of those bytes, shared or not: limits and the
//!   memory count see a shared body as buffered output, as they did when
//!   it was copied (the message keeps it alive until it is written).
//! - A write sends everything or fails: partial writes resume where the
//!   socket stopped, at most [`WRITE_SLICES_MAX`] slices per call.

use std::io::IoSlice;

use berth_protocol::codec;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::limits::{SHARED_BODY_BYTES_MIN, WRITE_SLICES_MAX};

/// Output waiting for the socket.
#[derive(Default)]
pub struct Output {
    /// Runs of encoded frames and shared body pieces, before `tail`.
    parts: Vec<Bytes>,
    /// Frames appended since the last shared piece.
    tail: BytesMut,
    len: usize,
}

impl Output {
    /// Bytes to send.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends whole frames encoded by `f`.
    pub fn append(&mut self, f: impl FnOnce(&mut BytesMut)) {
        let before = self.tail.len();
        f(&mut self.tail);
        self.len += self.tail.len() - before;
    }

    /// Appends frames encoded by `method` and the content of a message
    /// (`properties`, `body`): its large body pieces are shared, not copied.
    pub fn append_content(
        &mut self,
        method: impl FnOnce(&mut BytesMut),
        channel: u16,
        properties: &[u8],
        body: &Bytes,
        frame_max: u32,
    ) {
        let Output { parts, tail, len } = self;
        let before = tail.len();
        method(tail);
        // Runs split off the tail (with the `before` bytes already
        // counted) and pieces shared.
        let mut moved = 0;
        codec::encode_content_shared(
            tail,
            channel,
            properties,
            body,
            frame_max,
            SHARED_BODY_BYTES_MIN,
            |tail, piece| {
                let run = tail.split().freeze();
                moved += run.len() + piece.len();
                parts.push(run);
                parts.push(piece);
            },
        );
        *len += moved + tail.len() - before;
    }

    /// Empties the output for reuse, keeping the tail's memory when it is
    /// at most `keep_bytes` (a busy connection appends to the memory it
    /// just wrote instead of growing a fresh buffer from nothing).
    pub fn recycle(mut self, keep_bytes: usize) -> Output {
        self.parts.clear();
        self.tail.clear();
        if self.tail.capacity() > keep_bytes {
            self.tail = BytesMut::new();
        }
        self.len = 0;
        self
    }

    /// Writes everything to `wr`, resuming partial writes.
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, wr: &mut W) -> std::io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = self
            .parts
            .iter()
            .map(|p| &p[..])
            .chain(std::iter::once(&self.tail[..]))
            .filter(|s| !s.is_empty())
            .map(IoSlice::new)
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let upto = rest.len().min(WRITE_SLICES_MAX);
            let n = wr.write_vectored(&rest[..upto]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A socket that takes at most `per_call` bytes per write and checks
    /// the slice count of each vectored write.
    struct Trickle {
        got: Vec<u8>,
        per_call: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            assert!(bufs.len() <= WRITE_SLICES_MAX, "{} slices", bufs.len());
            self.calls += 1;
            let mut room = self.per_call;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(room);
                self.got.extend_from_slice(&b[..take]);
                room -= take;
                n += take;
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write_all(out: &Output, per_call: usize) -> Trickle {
        let mut t = Trickle {
            got: Vec::new(),
            per_call,
            calls: 0,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(out.write_to(&mut t)).expect("written");
        t
    }

    fn body(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    }

    fn heartbeat_and_content(out: &mut Output, expected: &mut BytesMut, body: &Bytes) {
        let props = [0x10, 0, 2];
        out.append(codec::encode_heartbeat);
        codec::encode_heartbeat(expected);
        let deliver = |b: &mut BytesMut| codec::encode_deliver(b, 1, "ctag", 7, false, "x", "rk");
        out.append_content(deliver, 1, &props, body, 131_072);
        deliver(expected);
        codec::encode_content(expected, 1, &props, body, 131_072);
    }

    #[test]
    fn a_large_body_goes_out_from_the_message_memory_in_the_frames_a_copy_would_give() {
        let big = body(16_384, 1);
        let small = body(SHARED_BODY_BYTES_MIN - 1, 2);
        let mut out = Output::default();
        let mut expected = BytesMut::new();
        heartbeat_and_content(&mut out, &mut expected, &big);
        heartbeat_and_content(&mut out, &mut expected, &small);
        heartbeat_and_content(&mut out, &mut expected, &big);
        assert_eq!(out.len(), expected.len());
        let shared: Vec<&Bytes> = out
            .parts
            .iter()
            .filter(|p| p.as_ptr() == big.as_ptr())
            .collect();
        assert_eq!(
            shared.len(),
            2,
            "each 16 KB body is sent from its own memory"
        );
        assert!(
            !out.parts.iter().any(|p| p.as_ptr() == small.as_ptr()),
            "a body below the threshold is copied"
        );
        assert_eq!(write_all(&out, usize::MAX).got, expected.to_vec());
    }

    #[test]
    fn partial_writes_and_more_slices_than_one_writev_takes_resume_where_they_stopped() {
        let mut out = Output::default();
        let mut expected = BytesMut::new();
        let bodies: Vec<Bytes> = (0..600)
            .map(|i| body(SHARED_BODY_BYTES_MIN, i as u8))
            .collect();
        for b in &bodies {
            heartbeat_and_content(&mut out, &mut expected, b);
        }
        assert!(
            out.parts.len() > WRITE_SLICES_MAX,
            "{} parts",
            out.parts.len()
        );
        let t = write_all(&out, 10_007);
        assert_eq!(t.got.len(), expected.len());
        assert!(
            t.got == expected.to_vec(),
            "the bytes differ from the copied frames"
        );
        assert!(t.calls > expected.len() / 10_007, "{} calls", t.calls);
    }

    #[test]
    fn a_recycled_output_is_empty_and_keeps_only_a_small_tail() {
        let mut out = Output::default();
        out.append(|b| b.extend_from_slice(&[7; 1000]));
        let kept = out.recycle(4096);
        assert!(kept.is_empty() && kept.parts.is_empty() && kept.tail.is_empty());
        assert!(
            kept.tail.capacity() >= 1000,
            "the written buffer's memory is reused"
        );
        let mut big = Output::default();
        big.append(|b| b.extend_from_slice(&[7; 10_000]));
        assert_eq!(
            big.recycle(4096).tail.capacity(),
            0,
            "a large buffer is freed"
        );
    }
}
