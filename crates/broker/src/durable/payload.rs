//! A persistent message as the broker stores it in a journal record
//! (docs/FORMAT.md, "Message payload"): exchange, routing key, properties
//! and body, with big-endian lengths as on the AMQP wire.
//!
//! Invariants:
//! - [`decode_message`] of [`encode_message`]'s output gives back the
//!   same four parts; a payload that ends early is refused, never misread.
//! - A name is written whole or not at all: one longer than its u8 length
//!   can say is an error, never cut (the entrances refuse such names
//!   first, `names.rs`).

use bytes::{Bytes, BytesMut};

use crate::limits::SHORTSTR_BYTES_MAX;

/// A message whose exchange or routing key does not fit the payload's u8
/// length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the message's {field} is {bytes} bytes long; a stored message holds at most {SHORTSTR_BYTES_MAX}")]
pub struct NameTooLong {
    /// `exchange` or `routing key`.
    pub field: &'static str,
    pub bytes: usize,
}

/// Longest [`MessageHead`]: two names of a shortstr's length, their u8
/// lengths and the properties' u32 length.
pub const MESSAGE_HEAD_BYTES_MAX: usize = 1 + SHORTSTR_BYTES_MAX + 1 + SHORTSTR_BYTES_MAX + 4;

/// The bytes of a stored message before its properties: exchange and
/// routing key (each a u8 length and its bytes) and the properties' u32
/// length. Made on the stack, so that a journal taking a payload in parts
/// ([`MessageParts`]) stores a message without a buffer of its own.
pub struct MessageHead {
    bytes: [u8; MESSAGE_HEAD_BYTES_MAX],
    len: usize,
}

impl MessageHead {
    /// The head of a message with these names and `properties_len` bytes
    /// of properties.
    pub fn new(
        exchange: &str,
        routing_key: &str,
        properties_len: usize,
    ) -> Result<Self, NameTooLong> {
        let mut head = MessageHead {
            bytes: [0; MESSAGE_HEAD_BYTES_MAX],
            len: 0,
        };
        for (field, s) in [("exchange", exchange), ("routing key", routing_key)] {
            let Ok(n) = u8::try_from(s.len()) else {
                return Err(NameTooLong {
                    field,
                    bytes: s.len(),
                });
            };
            head.put(&[n]);
            head.put(s.as_bytes());
        }
        head.put(&(properties_len as u32).to_be_bytes());
        Ok(head)
    }

    fn put(&mut self, b: &[u8]) {
        self.bytes[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A stored message's payload in its three parts, as a journal that can
/// write pieces one after another takes it: `head`, `properties` and
/// `body` in that order are the bytes [`encode_message`] makes.
#[derive(Clone, Copy)]
pub struct MessageParts<'a> {
    pub head: &'a [u8],
    pub properties: &'a Bytes,
    pub body: &'a Bytes,
}

impl MessageParts<'_> {
    /// The payload as one buffer: a copy of every part.
    pub fn to_bytes(&self) -> Bytes {
        join(self.head, self.properties, self.body)
    }
}

fn join(head: &[u8], properties: &[u8], body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(head.len() + properties.len() + body.len());
    b.extend_from_slice(head);
    b.extend_from_slice(properties);
    b.extend_from_slice(body);
    b.freeze()
}

/// Encodes a message for the journal.
pub fn encode_message(
    exchange: &str,
    routing_key: &str,
    properties: &[u8],
    body: &[u8],
) -> Result<Bytes, NameTooLong> {
    let head = MessageHead::new(exchange, routing_key, properties.len())?;
    Ok(join(head.as_bytes(), properties, body))
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
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello").unwrap();
        let (e, k, p, body) = decode_message(&b).unwrap();
        assert_eq!(
            (e.as_str(), k.as_str(), &p[..], &body[..]),
            ("ex", "a.b", &b"\x10\x00\x02"[..], &b"hello"[..])
        );
    }

    /// Issue 16: names were cut at 255 bytes, mid-character even, and the
    /// message then failed to decode at restore.
    #[test]
    fn a_name_past_a_shortstr_is_refused_never_cut() {
        let long = format!("{}€", "a".repeat(253));
        assert_eq!(
            encode_message("ex", &long, b"", b"body"),
            Err(NameTooLong {
                field: "routing key",
                bytes: 256
            })
        );
        assert_eq!(
            encode_message(&long, "k", b"", b"body").unwrap_err().field,
            "exchange"
        );
        let at_limit = format!("{}€", "a".repeat(252));
        let b = encode_message(&at_limit, &at_limit, b"", b"body").unwrap();
        let (e, k, _, body) = decode_message(&b).unwrap();
        assert_eq!(
            (e, k, &body[..]),
            (at_limit.clone(), at_limit, &b"body"[..])
        );
    }

    /// A journal given the parts writes the bytes `encode_message` makes.
    #[test]
    fn the_parts_are_the_encoded_message() {
        let (properties, body) = (
            Bytes::from_static(b"\x10\x00\x02"),
            Bytes::from_static(b"hello"),
        );
        let head = MessageHead::new("ex", "a.b", properties.len()).unwrap();
        let parts = MessageParts {
            head: head.as_bytes(),
            properties: &properties,
            body: &body,
        };
        assert_eq!(
            parts.to_bytes(),
            encode_message("ex", "a.b", &properties, &body).unwrap()
        );
        let long = "k".repeat(SHORTSTR_BYTES_MAX);
        let head = MessageHead::new(&long, &long, 0).unwrap();
        assert_eq!(head.as_bytes().len(), MESSAGE_HEAD_BYTES_MAX);
    }

    #[test]
    fn truncated_message_is_refused_not_misread() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"").unwrap();
        for cut in 0..b.len() - 1 {
            assert!(decode_message(&b.slice(..cut)).is_none(), "cut at {cut}");
        }
    }

    /// docs/FORMAT.md, "Broker payloads": a message as the broker stores it.
    #[test]
    fn golden_bytes_message_payload() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello").unwrap();
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
