//! A delayed message as a delayed exchange stores it (docs/FORMAT.md,
//! "Delayed message payload"): the time it is due, then the message
//! payload exactly as [`super::encode_message`] writes it.
//!
//! The due time is an absolute wall-clock time, not the `x-delay` that was
//! asked for, so a restart knows when each message is due without knowing
//! when it was published. Records of this kind are only ever stored under
//! a delayed exchange's store id, so their kind is known from where they
//! are and they carry no tag of their own.
//!
//! Invariants:
//! - [`decode_delayed`] of [`encode_delayed`]'s output gives back the due
//!   time and the message payload; a payload too short for its due time
//!   is refused, never misread.

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of the due time in front of the message payload.
pub const DUE_BYTES: usize = 8;

/// The stored form of a delayed message: `due_unix_ms` (u64 big-endian),
/// then `message` (an [`super::encode_message`] payload).
pub fn encode_delayed(due_unix_ms: u64, message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(DUE_BYTES + message.len());
    b.put_u64(due_unix_ms);
    b.extend_from_slice(message);
    b.freeze()
}

/// (due time in Unix milliseconds, message payload), or `None` if the
/// payload is too short to hold a due time.
pub fn decode_delayed(p: &Bytes) -> Option<(u64, Bytes)> {
    let due: [u8; DUE_BYTES] = p.get(..DUE_BYTES)?.try_into().ok()?;
    Some((u64::from_be_bytes(due), p.slice(DUE_BYTES..)))
}

/// The due time alone, from a payload's first [`DUE_BYTES`] (all a
/// restart reads of a pending message), or `None` if it is shorter.
pub fn due_of(head: &[u8]) -> Option<u64> {
    let due: [u8; DUE_BYTES] = head.get(..DUE_BYTES)?.try_into().ok()?;
    Some(u64::from_be_bytes(due))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/FORMAT.md, "Delayed message payload".
    #[test]
    fn golden_bytes_delayed_payload() {
        let msg = super::super::encode_message("d", "k", b"", b"hi").unwrap();
        let b = encode_delayed(0x0102_0304_0506_0708, &msg);
        let expected: &[u8] = &[
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // due: u64 BE Unix ms
            0x01, b'd', // exchange
            0x01, b'k', // routing key
            0x00, 0x00, 0x00, 0x00, // properties length
            b'h', b'i', // body
        ];
        assert_eq!(&b[..], expected);
        let (due, back) = decode_delayed(&b).unwrap();
        assert_eq!((due, &back[..]), (0x0102_0304_0506_0708, &msg[..]));
        assert_eq!(due_of(&b[..DUE_BYTES]), Some(due), "the head alone");
    }

    #[test]
    fn a_payload_shorter_than_its_due_time_is_refused() {
        let b = encode_delayed(5, b"");
        for cut in 0..DUE_BYTES {
            assert!(decode_delayed(&b.slice(..cut)).is_none(), "cut at {cut}");
            assert!(due_of(&b[..cut]).is_none(), "cut at {cut}");
        }
        assert_eq!(decode_delayed(&b), Some((5, Bytes::new())));
    }
}
