//! The frame that every Raft file of a node is made of, and the scan that
//! reads frames back (the recovery decision table). Shared by the log's
//! writer (`log_file`) and its segments (`log_segments`).

use crate::limits::ENTRY_BYTES_MAX_HARD;

pub const FRAME_HEADER_BYTES: usize = 8;
const LEN_AT: usize = 0;
const CRC_AT: usize = 4;
const _: () = assert!(CRC_AT + 4 == FRAME_HEADER_BYTES);

pub const LOG_FILE: &str = "raft.log";

/// Frames one payload.
#[must_use]
pub fn encode_frame(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame payloads are bounded far below 4 GiB");
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Frames a payload that `write` appends to `out`, in place: the same
/// bytes as `out.extend(encode_frame(payload))` without the payload's two
/// copies (a Raft entry carries a whole batch of messages).
pub fn append_frame<E>(
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    if let Err(e) = write(out) {
        out.truncate(start);
        return Err(e);
    }
    let payload = &out[start + FRAME_HEADER_BYTES..];
    let len = u32::try_from(payload.len()).expect("frame payloads are bounded far below 4 GiB");
    let crc = crc32c::crc32c(payload);
    out[start..start + CRC_AT].copy_from_slice(&len.to_le_bytes());
    out[start + CRC_AT..start + FRAME_HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// How a scan of a frame file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// The file ends exactly after its last frame.
    Clean,
    /// The file ends inside a frame (header or payload incomplete): a write
    /// that never completed its fdatasync, so it was never acknowledged.
    /// Safe to cut off.
    Torn { at: u64 },
    /// A complete frame whose checksum does not match: bytes that may have
    /// been acknowledged are damaged. Never cut off silently.
    Damaged { at: u64 },
}

/// The frames of a file, each with its offset, and how the file ended.
#[derive(Debug)]
pub struct Scan<'a> {
    pub frames: Vec<(u64, &'a [u8])>,
    pub tail: Tail,
}

/// The payload of the frame of `frame_len` bytes at offset `at` of
/// `file` (a segment, `path`), checked against its length and CRC: a
/// frame that does not check is an error naming the file and offset,
/// never another frame's bytes.
pub fn read_frame_payload(
    file: &std::fs::File,
    path: &std::path::Path,
    at: u64,
    frame_len: usize,
) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let bad = |what: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "Raft log entry at offset {at} of {}: {what}",
                path.display()
            ),
        )
    };
    if frame_len < FRAME_HEADER_BYTES {
        return Err(bad(format!("a frame of {frame_len} bytes")));
    }
    let mut frame = vec![0u8; frame_len];
    file.read_exact_at(&mut frame, at)?;
    let len = u32::from_le_bytes(frame[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
    if len != frame_len - FRAME_HEADER_BYTES || crc32c::crc32c(&frame[FRAME_HEADER_BYTES..]) != crc
    {
        return Err(bad("its frame does not check (length or CRC)".into()));
    }
    frame.drain(..FRAME_HEADER_BYTES);
    Ok(frame)
}

/// Reads frames from the start of `bytes` until the end or the first bad
/// frame. This is the decision table of recovery:
///
/// | remaining bytes at a frame start          | verdict            |
/// |-------------------------------------------|--------------------|
/// | none                                      | `Clean`            |
/// | only zero bytes (a header claiming 0)     | `Torn`             |
/// | fewer than a header                       | `Torn`             |
/// | header claims more bytes than remain      | `Torn`             |
/// | header claims more than the frame limit   | `Damaged`          |
/// | complete frame, checksum mismatch         | `Damaged`          |
/// | a header claiming 0 bytes, then non-zeros | `Damaged`          |
/// | complete frame, checksum matches          | frame, go on       |
///
/// No payload berth writes is empty, so a header of zeros is never a
/// frame: zeros to the end are an append whose size reached the disk and
/// whose bytes did not (they read as a valid empty frame, CRC 0, and a
/// log of them stopped a member from starting).
#[must_use]
pub fn scan(bytes: &[u8]) -> Scan<'_> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    let tail = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break Tail::Clean;
        }
        if rest.iter().all(|b| *b == 0) {
            break Tail::Torn { at: at as u64 };
        }
        if rest.len() < FRAME_HEADER_BYTES {
            break Tail::Torn { at: at as u64 };
        }
        let len =
            u32::from_le_bytes(rest[LEN_AT..LEN_AT + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
        if len == 0 || len > ENTRY_BYTES_MAX_HARD {
            break Tail::Damaged { at: at as u64 };
        }
        if rest.len() < FRAME_HEADER_BYTES + len {
            break Tail::Torn { at: at as u64 };
        }
        let payload = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len];
        if crc32c::crc32c(payload) != crc {
            break Tail::Damaged { at: at as u64 };
        }
        frames.push((at as u64, payload));
        at += FRAME_HEADER_BYTES + len;
    };
    Scan { frames, tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_after_the_last_frame_are_a_torn_tail_not_empty_frames() {
        let mut bytes = encode_frame(b"an entry");
        let end = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 4096]);
        let s = scan(&bytes);
        assert_eq!(s.frames.len(), 1, "zeros read as frames");
        assert_eq!(s.tail, Tail::Torn { at: end });
        // Zeros of less than a header, too.
        let mut short = encode_frame(b"x");
        short.extend_from_slice(&[0; 3]);
        assert!(matches!(scan(&short).tail, Tail::Torn { .. }));
    }

    #[test]
    fn a_zero_length_header_before_other_bytes_is_damage() {
        let mut bytes = encode_frame(b"an entry");
        let at = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&encode_frame(b"later"));
        let s = scan(&bytes);
        assert_eq!(s.frames.len(), 1);
        assert_eq!(s.tail, Tail::Damaged { at });
    }
}
