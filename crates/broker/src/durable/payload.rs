//! A persistent message as the broker stores it in a journal record
//! (docs/FORMAT.md, "Message payload"): exchange, routing key, properties
//! and body, with big-endian lengths as on the AMQP wire.
//!
//! Invariants:
//! - [`decode_message`] of [`encode_message`]'s output gives back the
//!   same four parts; a payload that ends early is refused, never misread.

use bytes::{BufMut, Bytes, BytesMut};

/// Encodes a message for the journal.
pub fn encode_message(exchange: &str, routing_key: &str, properties: &[u8], body: &[u8]) -> Bytes {
    let ex = &exchange.as_bytes()[..exchange.len().min(255)];
    let rk = &routing_key.as_bytes()[..routing_key.len().min(255)];
    let mut b =
        BytesMut::with_capacity(2 + ex.len() + rk.len() + 4 + properties.len() + body.len());
    b.put_u8(ex.len() as u8);
    b.extend_from_slice(ex);
    b.put_u8(rk.len() as u8);
    b.extend_from_slice(rk);
    b.put_u32(properties.len() as u32);
    b.extend_from_slice(properties);
    b.extend_from_slice(body);
    b.freeze()
}

/// A decoded journal message: (exchange, routing key, properties, body).
pub type StoredMessage = (String, String, Bytes, Bytes);

/// Decodes a message written by [`encode_message`]; `None` if it is not
/// well formed (the caller reports it with the queue and message id).
pub fn decode_message(p: &Bytes) -> Option<StoredMessage> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<Bytes> {
        let end = at.checked_add(n)?;
        if end > p.len() {
            return None;
        }
        let out = p.slice(at..end);
        at = end;
        Some(out)
    };
    let exl = take(1)?[0] as usize;
    let exchange = String::from_utf8(take(exl)?.to_vec()).ok()?;
    let rkl = take(1)?[0] as usize;
    let routing_key = String::from_utf8(take(rkl)?.to_vec()).ok()?;
    let pl = u32::from_be_bytes(take(4)?[..].try_into().ok()?) as usize;
    let properties = take(pl)?;
    let body = p.slice(at..);
    Some((exchange, routing_key, properties, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_encoding_roundtrips() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello");
        let (e, k, p, body) = decode_message(&b).unwrap();
        assert_eq!(
            (e.as_str(), k.as_str(), &p[..], &body[..]),
            ("ex", "a.b", &b"\x10\x00\x02"[..], &b"hello"[..])
        );
    }

    #[test]
    fn truncated_message_is_refused_not_misread() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"");
        for cut in 0..b.len() - 1 {
            assert!(decode_message(&b.slice(..cut)).is_none(), "cut at {cut}");
        }
    }

    /// docs/FORMAT.md, "Broker payloads": a message as the broker stores it.
    #[test]
    fn golden_bytes_message_payload() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello");
        let expected: &[u8] = &[
            0x02, b'e', b'x', // exchange: u8 length, bytes
            0x03, b'a', b'.', b'b', // routing key: u8 length, bytes
            0x00, 0x00, 0x00, 0x03, // properties length: u32 big-endian
            0x10, 0x00, 0x02, // properties as on the wire
            b'h', b'e', b'l', b'l', b'o', // body: the rest
        ];
        assert_eq!(&b[..], expected);
    }
}
