//! A retry mark: what makes a message's delayed-retry wait and its count
//! of returns durable (docs/DELAYED.md "Delayed retry", docs/FORMAT.md
//! "Retry mark payload"). When a stored message of a durable queue with
//! delayed retry is returned, the queue stores a mark — the message's id,
//! its count of returns and when its wait ends — as a message of its own
//! under the queue's retry id ([`retry_id`]); the mark goes when the
//! message leaves the queue or a newer mark replaces it. A restart puts
//! each marked message back with its count, waiting if its wait is not
//! over.
//!
//! Invariants:
//! - [`decode_retry_mark`] of [`encode_retry_mark`]'s output gives back
//!   what was encoded; a payload of any other length is refused, never
//!   misread.
//! - A retry id is never a queue's own id, a paging id or a delayed
//!   exchange's: queue ids come from one sequence far below
//!   [`RETRY_BIT`].

use bytes::{BufMut, Bytes, BytesMut};

use super::PAGING_BIT;

/// Marks a journal queue id as a durable queue's retry id: its records are
/// retry marks ([`encode_retry_mark`]), not messages.
pub const RETRY_BIT: u64 = 1 << 62;

/// Bytes of a retry mark: message id, returns, due time.
pub const RETRY_MARK_BYTES: usize = 8 + 4 + 8;

/// The id a durable queue's retry marks are stored under.
pub fn retry_id(queue: u64) -> u64 {
    queue | RETRY_BIT
}

/// The queue whose retry id `id` is, if it is one.
pub fn retry_id_of(id: u64) -> Option<u64> {
    (id & RETRY_BIT != 0 && id & PAGING_BIT == 0).then_some(id & !RETRY_BIT)
}

/// A stored message's retry state, as a mark holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryMark {
    /// The message's journal id in its queue.
    pub msg: u64,
    /// How many times it was returned.
    pub returns: u32,
    /// When its wait ends, Unix time in milliseconds.
    pub due_unix_ms: u64,
}

/// `msg` u64 BE · `returns` u32 BE · `due_unix_ms` u64 BE.
pub fn encode_retry_mark(m: &RetryMark) -> Bytes {
    let mut b = BytesMut::with_capacity(RETRY_MARK_BYTES);
    b.put_u64(m.msg);
    b.put_u32(m.returns);
    b.put_u64(m.due_unix_ms);
    b.freeze()
}

/// The mark `p` holds, or `None` if it is not [`RETRY_MARK_BYTES`] long.
pub fn decode_retry_mark(p: &[u8]) -> Option<RetryMark> {
    if p.len() != RETRY_MARK_BYTES {
        return None;
    }
    let u64_at = |at: usize| u64::from_be_bytes(p[at..at + 8].try_into().expect("8 bytes"));
    Some(RetryMark {
        msg: u64_at(0),
        returns: u32::from_be_bytes(p[8..12].try_into().expect("4 bytes")),
        due_unix_ms: u64_at(12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/FORMAT.md, "Retry mark payload".
    #[test]
    fn golden_bytes_retry_mark() {
        let m = RetryMark {
            msg: 0x0102,
            returns: 3,
            due_unix_ms: 0x0A0B_0C0D,
        };
        let b = encode_retry_mark(&m);
        let expected: &[u8] = &[
            0, 0, 0, 0, 0, 0, 0x01, 0x02, // msg: u64 BE
            0, 0, 0, 3, // returns: u32 BE
            0, 0, 0, 0, 0x0A, 0x0B, 0x0C, 0x0D, // due: u64 BE Unix ms
        ];
        assert_eq!(&b[..], expected);
        assert_eq!(decode_retry_mark(&b), Some(m));
        for cut in 0..b.len() {
            assert_eq!(decode_retry_mark(&b[..cut]), None, "cut at {cut}");
        }
        assert_eq!(retry_id_of(retry_id(7)), Some(7));
        assert_eq!(retry_id_of(7), None);
        assert_eq!(retry_id_of(7 | PAGING_BIT), None);
    }
}
