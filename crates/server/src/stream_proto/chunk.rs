//! A Deliver frame: one osiris chunk of consecutive messages, in the
//! layout RabbitMQ's stream clients parse (PROTOCOL.adoc "Deliver";
//! osiris `osiris_log.erl`). No I/O.
//!
//! ```text
//! Deliver (version 1) => Size Key=0x0008 Version=1 SubscriptionId Chunk
//! Chunk header, 48 bytes, big-endian:
//!   0  MagicVersion  int8   0x50 (magic 5, version 0)
//!   1  ChunkType     int8   0 = user data
//!   2  NumEntries    uint16 entries in Data
//!   4  NumRecords    uint32 messages (= entries: berth writes no sub-batches)
//!   8  Timestamp     int64  ms since the Unix epoch (the first message's)
//!  16  Epoch         uint64
//!  24  ChunkFirstId  uint64 offset of the first message; entry i is offset first + i
//!  32  ChunkCrc      int32  zlib CRC-32 of Data (clients check it)
//!  36  DataLength    uint32
//!  40  TrailerLength uint32 0
//!  44  BloomSize     uint8  0, then 3 reserved bytes
//! Data: per entry, uint32 with the high bit 0 (a simple entry) and the
//!   message's length in the low 31 bits, then the message.
//! ```
//!
//! berth stores a stream as single messages, not chunks: a chunk is cut
//! at delivery from the messages a subscription has pending, so its
//! entries must have consecutive offsets (a client numbers them from the
//! chunk id), which [`Chunk::push`] checks.

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::{key, Frame};

pub const MAGIC_VERSION: u8 = 0x50;
pub const CHUNK_TYPE_USER: u8 = 0;
/// Epoch of every chunk: a berth stream has one writer per log group,
/// and no leader changes inside a stream's history that a client sees.
pub const EPOCH: u64 = 1;
pub const OFF_CRC: usize = 32;
pub const HEADER_BYTES: usize = 48;
/// Bytes of an entry before its message.
pub const ENTRY_HEAD_BYTES: usize = 4;
/// The longest message a simple entry can hold (31 bits).
pub const ENTRY_BYTES_MAX: usize = 0x7fff_ffff;

/// The messages of one chunk, gathered before it is written.
#[derive(Debug, Default)]
pub struct Chunk {
    first_offset: u64,
    timestamp_ms: i64,
    entries: u16,
    data: BytesMut,
}

impl Chunk {
    /// The offset the next message must have to join this chunk.
    pub fn next_offset(&self) -> Option<u64> {
        (self.entries > 0).then(|| self.first_offset + u64::from(self.entries))
    }

    pub fn len(&self) -> usize {
        usize::from(self.entries)
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn data_bytes(&self) -> usize {
        self.data.len()
    }

    /// Adds a message at `offset`; false (nothing added) if it does not
    /// follow the last one, the chunk is full, or it is too long.
    pub fn push(&mut self, offset: u64, timestamp_ms: i64, message: &[u8]) -> bool {
        if self.entries == u16::MAX || message.len() > ENTRY_BYTES_MAX {
            return false;
        }
        match self.next_offset() {
            Some(next) if next != offset => return false,
            Some(_) => {}
            None => {
                self.first_offset = offset;
                self.timestamp_ms = timestamp_ms;
            }
        }
        self.data.put_u32(message.len() as u32);
        self.data.extend_from_slice(message);
        self.entries += 1;
        true
    }

    /// Writes the Deliver frame for `subscription_id` and empties the
    /// chunk.
    pub fn write_deliver(&mut self, subscription_id: u8, out: &mut BytesMut) {
        let data = std::mem::take(&mut self.data).freeze();
        let mut f = Frame::begin(out, key::DELIVER, 1);
        f.u8(subscription_id);
        write_header(
            &mut f,
            self.entries,
            self.timestamp_ms,
            self.first_offset,
            &data,
        );
        f.raw(&data);
        f.finish();
        self.entries = 0;
    }
}

fn write_header(f: &mut Frame<'_>, entries: u16, timestamp_ms: i64, first: u64, data: &Bytes) {
    f.u8(MAGIC_VERSION)
        .u8(CHUNK_TYPE_USER)
        .u16(entries)
        .u32(u32::from(entries))
        .u64(timestamp_ms as u64)
        .u64(EPOCH)
        .u64(first)
        .u32(crc32fast::hash(data))
        .u32(data.len() as u32)
        .u32(0) // trailer
        .u32(0); // bloom size 0, reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_of_a_deliver_frame() {
        let mut c = Chunk::default();
        assert!(c.push(7, 1_000, b"ab"));
        assert!(c.push(8, 2_000, b"c"));
        assert!(!c.push(10, 3_000, b"gap"), "entries are consecutive");
        let mut out = BytesMut::new();
        c.write_deliver(3, &mut out);
        let data: &[u8] = &[0, 0, 0, 2, b'a', b'b', 0, 0, 0, 1, b'c'];
        // CRC-32 (zlib's, as Python's zlib.crc32 and Erlang's crc32).
        let crc = crc32fast::hash(data);
        let mut want = vec![];
        want.extend_from_slice(&((4 + 1 + HEADER_BYTES + data.len()) as u32).to_be_bytes());
        want.extend_from_slice(&[0, 8, 0, 1, 3]); // key, version, subscription
        want.extend_from_slice(&[0x50, 0, 0, 2, 0, 0, 0, 2]);
        want.extend_from_slice(&1_000u64.to_be_bytes());
        want.extend_from_slice(&1u64.to_be_bytes());
        want.extend_from_slice(&7u64.to_be_bytes());
        want.extend_from_slice(&crc.to_be_bytes());
        want.extend_from_slice(&(data.len() as u32).to_be_bytes());
        want.extend_from_slice(&[0; 8]);
        want.extend_from_slice(data);
        assert_eq!(&out[..], &want[..]);
        assert_eq!(
            crc32fast::hash(b"123456789"),
            0xCBF4_3926,
            "the IEEE CRC-32"
        );
        assert!(c.is_empty());
    }
}
