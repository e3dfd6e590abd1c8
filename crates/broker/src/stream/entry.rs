//! A stream entry: the payload of the journal record that stores one
//! message of a stream (docs/FORMAT.md, "Stream entry"). No I/O.
//!
//! Layout, integers little-endian (the store's convention):
//!
//! ```text
//!  0         1                9                17
//!  +---------+----------------+----------------+---------------------------+
//!  | version |     offset     |  timestamp_ms  | message payload (FORMAT.md |
//!  |  u8 = 1 |      u64       |      u64       | "Message payload")         |
//!  +---------+----------------+----------------+---------------------------+
//! ```
//!
//! The record's CRC (the store's) covers it all. The message payload is
//! the one classic queues store, and its properties already carry the
//! `x-stream-offset` header, so a delivery sends the stored bytes as
//! they are.
//!
//! Invariants:
//! - [`decode`] of [`encode`]'s output gives back the same parts; a short
//!   entry or an unknown version is refused, never misread.
//! - The offsets below are computed from one another; the header size is
//!   asserted at compile time.

use bytes::{BufMut, Bytes, BytesMut};

pub const OFF_VERSION: usize = 0;
pub const OFF_OFFSET: usize = OFF_VERSION + 1;
pub const OFF_TIMESTAMP_MS: usize = OFF_OFFSET + 8;
/// Bytes before the message payload.
pub const ENTRY_HEADER_BYTES: usize = OFF_TIMESTAMP_MS + 8;
const _: () = assert!(ENTRY_HEADER_BYTES == 17);

/// The one version this build writes and reads.
pub const ENTRY_VERSION: u8 = 1;

/// A decoded entry, borrowing the message payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub message: Bytes,
}

/// Why an entry does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("stream entry is {0} bytes, shorter than its {ENTRY_HEADER_BYTES}-byte header")]
    Short(usize),
    #[error("stream entry version {0} is not one this build reads ({ENTRY_VERSION})")]
    Version(u8),
}

/// Encodes an entry around a message payload (`encode_message`'s output).
pub fn encode(offset: u64, timestamp_ms: u64, message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(ENTRY_HEADER_BYTES + message.len());
    b.put_u8(ENTRY_VERSION);
    b.put_u64_le(offset);
    b.put_u64_le(timestamp_ms);
    b.extend_from_slice(message);
    b.freeze()
}

/// Decodes an entry written by [`encode`].
pub fn decode(p: &Bytes) -> Result<Entry, EntryError> {
    let (offset, timestamp_ms) = decode_header(p)?;
    Ok(Entry {
        offset,
        timestamp_ms,
        message: p.slice(ENTRY_HEADER_BYTES..),
    })
}

/// An entry's offset and timestamp (what the store tools show), checked
/// as [`decode`] checks them.
pub fn decode_header(p: &[u8]) -> Result<(u64, u64), EntryError> {
    if p.len() < ENTRY_HEADER_BYTES {
        return Err(EntryError::Short(p.len()));
    }
    if p[OFF_VERSION] != ENTRY_VERSION {
        return Err(EntryError::Version(p[OFF_VERSION]));
    }
    let u64_at = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&p[at..at + 8]);
        u64::from_le_bytes(a)
    };
    Ok((u64_at(OFF_OFFSET), u64_at(OFF_TIMESTAMP_MS)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_stream_entry() {
        let e = encode(0x0102, 0x0A0B_0C0D, b"msg");
        assert_eq!(
            &e[..],
            &[
                1, // version
                0x02, 0x01, 0, 0, 0, 0, 0, 0, // offset
                0x0D, 0x0C, 0x0B, 0x0A, 0, 0, 0, 0, // timestamp_ms
                b'm', b's', b'g',
            ]
        );
        let d = decode(&e).unwrap();
        assert_eq!((d.offset, d.timestamp_ms), (0x0102, 0x0A0B_0C0D));
        assert_eq!(&d.message[..], b"msg");
    }

    #[test]
    fn short_or_unknown_entries_are_refused() {
        assert_eq!(
            decode(&Bytes::from_static(&[1, 2, 3])),
            Err(EntryError::Short(3))
        );
        let mut v = encode(1, 2, b"").to_vec();
        v[0] = 9;
        assert_eq!(decode(&Bytes::from(v)), Err(EntryError::Version(9)));
    }
}
