//! Reading a connection's socket into its read buffer, in steps that grow
//! while the peer streams (issue 20).
//!
//! Frames are split off the front of the buffer and their payloads kept
//! (message bodies are slices of it), so a buffer is never reused once it
//! is full: the next step is a new buffer, and the partial frame at the end
//! of the full one is copied into it. The fewer steps per byte, the fewer
//! such copies; but a large step is memory that every slow connection
//! would hold, so only a connection whose last read filled all its room
//! (more was waiting in the socket) takes a larger one.

use berth_protocol::frame::frame_bytes_missing;
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::End;
use crate::limits;

/// How much room a connection's next buffer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadStep(usize);

impl Default for ReadStep {
    fn default() -> Self {
        ReadStep(limits::READ_CHUNK_BYTES)
    }
}

impl ReadStep {
    /// After a read of `read` bytes into `room`: doubled (up to
    /// [`limits::READ_CHUNK_BYTES_MAX`]) when it filled the room, back to
    /// the smallest step when it did not.
    fn after(self, read: usize, room: usize) -> ReadStep {
        if read == room {
            ReadStep((self.0 * 2).min(limits::READ_CHUNK_BYTES_MAX))
        } else {
            ReadStep::default()
        }
    }
}

/// Reads more bytes from `rd` into `rbuf`, first making room for the rest
/// of a partial frame at its front (at most one largest step) or for one
/// step when it has less than [`limits::READ_FREE_BYTES_MIN`] left. EOF is
/// an error (the peer went away).
pub(super) async fn read_into<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    step: &mut ReadStep,
) -> Result<(), End> {
    // The frame's size is the peer's claim (checked against frame_max only
    // when decoded): it bounds nothing here beyond the largest step.
    let missing = frame_bytes_missing(rbuf).min(limits::READ_CHUNK_BYTES_MAX);
    let wanted = missing.max(limits::READ_FREE_BYTES_MIN);
    if rbuf.capacity() - rbuf.len() < wanted {
        rbuf.reserve(wanted.max(step.0));
    }
    let room = rbuf.capacity() - rbuf.len();
    let n = rd.read_buf(rbuf).await?;
    if n == 0 {
        return Err(End::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed the connection",
        )));
    }
    *step = step.after(n, room);
    Ok(())
}

#[cfg(test)]
mod tests {
    use berth_protocol::frame::{decode_frame, put_frame_header, FRAME_BODY, FRAME_END};
    use bytes::Bytes;
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    fn body_frames(count: usize, size: usize) -> Vec<u8> {
        let mut b = BytesMut::new();
        for _ in 0..count {
            put_frame_header(&mut b, FRAME_BODY, 1, u32::try_from(size).expect("small"));
            b.extend_from_slice(&vec![7; size]);
            b.extend_from_slice(&[FRAME_END]);
        }
        b.to_vec()
    }

    /// Reads `bytes` (written by the peer in `writes` pieces, each after the
    /// previous one was read) as the connection does, keeping every payload
    /// as a queued body would; returns the frames and the largest buffer.
    async fn read_all(bytes: Vec<u8>, writes: usize) -> (usize, usize) {
        let total = bytes.len();
        let (mut peer, mut rd) = tokio::io::duplex(total + 1);
        let piece = total.div_ceil(writes);
        let mut rbuf = BytesMut::with_capacity(limits::READ_CHUNK_BYTES);
        let mut step = ReadStep::default();
        let mut kept: Vec<Bytes> = Vec::new();
        let mut largest = rbuf.capacity();
        let mut sent = 0;
        let mut received = 0;
        while received < total {
            if sent == received && sent < total {
                let end = (sent + piece).min(total);
                peer.write_all(&bytes[sent..end]).await.expect("write");
                sent = end;
            }
            let before = rbuf.len();
            read_into(&mut rd, &mut rbuf, &mut step)
                .await
                .map_err(|_| "read")
                .expect("read");
            received += rbuf.len() - before;
            largest = largest.max(rbuf.capacity());
            while let Some(f) = decode_frame(&mut rbuf, 1 << 20).expect("valid frames") {
                kept.push(f.payload);
            }
        }
        (kept.len(), largest)
    }

    #[tokio::test]
    async fn a_peer_streaming_large_bodies_is_read_in_larger_steps() {
        let (frames, largest) = read_all(body_frames(64, 16 * 1024), 1).await;
        assert_eq!(frames, 64);
        assert!(
            largest > 2 * limits::READ_CHUNK_BYTES,
            "a buffer of {largest} bytes: the step never grew"
        );
    }

    #[tokio::test]
    async fn a_peer_whose_writes_are_read_as_they_come_keeps_the_small_step() {
        let (frames, largest) = read_all(body_frames(256, 1000), 256).await;
        assert_eq!(frames, 256);
        assert!(
            largest <= limits::READ_CHUNK_BYTES + 1024,
            "a buffer of {largest} bytes for 1 KB frames read one at a time"
        );
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_room_left_gets_room_for_all_of_it() {
        let (frames, largest) = read_all(body_frames(1, 200 * 1024), 4).await;
        assert_eq!(frames, 1);
        assert!(largest >= 200 * 1024, "{largest}");
    }

    #[test]
    fn a_step_doubles_while_reads_fill_it_up_to_the_largest_and_resets_after() {
        let mut s = ReadStep::default();
        for _ in 0..10 {
            s = s.after(1000, 1000);
        }
        assert_eq!(s, ReadStep(limits::READ_CHUNK_BYTES_MAX));
        assert_eq!(s.after(999, 1000), ReadStep::default());
    }
}
