//! A persistent message as the broker stores it in a journal record
//! (docs/FORMAT.md, "Message payload"): optionally its times (when it was
//! enqueued, its own `expiration`), then exchange, routing key, properties
//! and body, with big-endian lengths as on the AMQP wire.
//!
//! Invariants:
//! - [`decode_message`] of [`encode_message`]'s output gives back the
//!   same four parts; a payload that ends early is refused, never misread.
//! - The times, when present, are the first [`TIMES_BYTES`] bytes, behind
//!   a marker no payload without them can start with (`FF FF`: a 255-byte
//!   exchange name starting with byte `FF`, which is never UTF-8), so a
//!   restart reads them with the record's head ([`times_of`]), never the
//!   body, and a payload written before them reads as it always did.
//! - A name is written whole or not at all: one longer than its u8 length
//!   can say is an error, never cut (the entrances refuse such names
//!   first, `name_rules.rs`).

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

/// The two bytes that open a payload carrying [`StoredTimes`].
pub const TIMES_MARKER: [u8; 2] = [0xFF, 0xFF];
/// Offset of `enqueued_unix_ms` (u64 BE) in a timed payload.
pub const TIMES_OFF_ENQUEUED: usize = TIMES_MARKER.len();
/// Offset of `expiration_ms` (u64 BE; `u64::MAX`: none) in a timed payload.
pub const TIMES_OFF_EXPIRATION: usize = TIMES_OFF_ENQUEUED + 8;
/// Bytes of the times before the message: what a restart reads of a
/// stored message to learn when it expires.
pub const TIMES_BYTES: usize = TIMES_OFF_EXPIRATION + 8;
const _: () = assert!(TIMES_BYTES == 18);

/// The absolute times a stored message carries, so that its TTL counts
/// from when it was enqueued on the broker that took it, not from a
/// restart or a failover (issue 42).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredTimes {
    /// Wall-clock time (ms since the Unix epoch) when the broker routed it
    /// to its queues: the leader's clock, in a cluster.
    pub enqueued_unix_ms: u64,
    /// Its own `expiration` property, parsed (ms), if it had one.
    pub expiration_ms: Option<u64>,
}

impl StoredTimes {
    fn encode(&self) -> [u8; TIMES_BYTES] {
        let mut b = [0u8; TIMES_BYTES];
        b[..TIMES_OFF_ENQUEUED].copy_from_slice(&TIMES_MARKER);
        b[TIMES_OFF_ENQUEUED..TIMES_OFF_EXPIRATION]
            .copy_from_slice(&self.enqueued_unix_ms.to_be_bytes());
        let exp = self.expiration_ms.unwrap_or(u64::MAX);
        b[TIMES_OFF_EXPIRATION..TIMES_BYTES].copy_from_slice(&exp.to_be_bytes());
        b
    }
}

/// The times at the start of a stored payload (or of its first
/// [`TIMES_BYTES`] bytes, all a restart reads): `None` for a payload
/// written without them (before they existed, a paging copy, a delayed
/// exchange's or a stream's message).
pub fn times_of(head: &[u8]) -> Option<StoredTimes> {
    if head.len() < TIMES_BYTES || head[..TIMES_OFF_ENQUEUED] != TIMES_MARKER {
        return None;
    }
    let u64_at = |at: usize| u64::from_be_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let exp = u64_at(TIMES_OFF_EXPIRATION);
    Some(StoredTimes {
        enqueued_unix_ms: u64_at(TIMES_OFF_ENQUEUED),
        expiration_ms: (exp != u64::MAX).then_some(exp),
    })
}

/// Longest [`MessageHead`]: the times, two names of a shortstr's length,
/// their u8 lengths and the properties' u32 length.
pub const MESSAGE_HEAD_BYTES_MAX: usize =
    TIMES_BYTES + 1 + SHORTSTR_BYTES_MAX + 1 + SHORTSTR_BYTES_MAX + 4;

/// The bytes of a stored message before its properties: its times (if
/// given), exchange and routing key (each a u8 length and its bytes) and the properties' u32
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
        Self::timed(None, exchange, routing_key, properties_len)
    }

    /// [`MessageHead::new`] of a message that carries its `times`.
    pub fn timed(
        times: Option<StoredTimes>,
        exchange: &str,
        routing_key: &str,
        properties_len: usize,
    ) -> Result<Self, NameTooLong> {
        let mut head = MessageHead {
            bytes: [0; MESSAGE_HEAD_BYTES_MAX],
            len: 0,
        };
        if let Some(t) = times {
            head.put(&t.encode());
        }
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

/// Decodes a message written by [`encode_message`] (or by a journal given
/// [`MessageParts`], times and all: they are skipped here, see
/// [`times_of`]); `None` if it is not well formed (the caller reports it
/// with the queue and message id).
pub fn decode_message(p: &Bytes) -> Option<StoredMessage> {
    let mut at = if times_of(p).is_some() {
        TIMES_BYTES
    } else {
        0
    };
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
        assert_eq!(head.as_bytes().len(), MESSAGE_HEAD_BYTES_MAX - TIMES_BYTES);
    }

    /// Issue 42: a message's times ride at the head of its payload, read
    /// without its body, and the rest decodes as a payload without them.
    #[test]
    fn times_ride_ahead_of_the_message_and_are_read_from_the_head() {
        let times = StoredTimes {
            enqueued_unix_ms: 1_700_000_000_123,
            expiration_ms: Some(3_000),
        };
        let (properties, body) = (
            Bytes::from_static(b"\x10\x00\x02"),
            Bytes::from_static(b"hi"),
        );
        let head = MessageHead::timed(Some(times), "ex", "k", properties.len()).unwrap();
        let p = MessageParts {
            head: head.as_bytes(),
            properties: &properties,
            body: &body,
        }
        .to_bytes();
        assert_eq!(times_of(&p[..TIMES_BYTES]), Some(times));
        assert_eq!(times_of(&p[..TIMES_BYTES - 1]), None, "a head cut short");
        let (e, k, pr, b) = decode_message(&p).unwrap();
        assert_eq!(
            (e.as_str(), k.as_str(), pr, b),
            ("ex", "k", properties, body)
        );
        let untimed = encode_message("ex", "k", b"", b"hi").unwrap();
        assert_eq!(times_of(&untimed), None, "payloads written before times");
        let none = StoredTimes {
            expiration_ms: None,
            ..times
        };
        let head = MessageHead::timed(Some(none), "", "", 0).unwrap();
        assert_eq!(times_of(head.as_bytes()), Some(none));
        let long = "k".repeat(SHORTSTR_BYTES_MAX);
        let head = MessageHead::timed(Some(none), &long, &long, 0).unwrap();
        assert_eq!(head.as_bytes().len(), MESSAGE_HEAD_BYTES_MAX);
    }

    /// No payload written without times starts with the marker: read
    /// without times, `FF FF` opens a 255-byte exchange name whose first
    /// byte is `FF`, which is never UTF-8, so was never written.
    #[test]
    fn no_untimed_payload_starts_with_the_marker() {
        let mut name = vec![0xFF];
        name.extend_from_slice(&[b'a'; 254]);
        assert!(String::from_utf8(name).is_err());
    }

    proptest::proptest! {
        /// Any times and message come back whole, the times from the head
        /// alone.
        #[test]
        fn timed_payloads_round_trip(
            enqueued in proptest::prelude::any::<u64>(),
            expiration in proptest::option::of(0..u64::MAX),
            exchange in "[a-z.]{0,20}",
            key in "\\PC{0,20}",
            properties in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let times = StoredTimes { enqueued_unix_ms: enqueued, expiration_ms: expiration };
            let (properties, body) = (Bytes::from(properties), Bytes::from(body));
            let head = MessageHead::timed(Some(times), &exchange, &key, properties.len()).unwrap();
            let p = MessageParts { head: head.as_bytes(), properties: &properties, body: &body }.to_bytes();
            proptest::prop_assert_eq!(times_of(&p[..TIMES_BYTES]), Some(times));
            let decoded = decode_message(&p).unwrap();
            proptest::prop_assert_eq!(decoded, (exchange, key, properties, body));
        }
    }

    /// docs/FORMAT.md, "Message payload": the times ahead of a message.
    #[test]
    fn golden_bytes_timed_message_payload() {
        let times = StoredTimes {
            enqueued_unix_ms: 0x0102_0304_0506_0708,
            expiration_ms: Some(3_000),
        };
        let head = MessageHead::timed(Some(times), "ex", "a.b", 3).unwrap();
        let p = MessageParts {
            head: head.as_bytes(),
            properties: &Bytes::from_static(b"\x10\x00\x02"),
            body: &Bytes::from_static(b"hello"),
        }
        .to_bytes();
        let expected: &[u8] = &[
            0xFF, 0xFF, // marker
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // enqueued_unix_ms: u64 BE
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0b, 0xb8, // expiration_ms: u64 BE
            0x02, b'e', b'x', 0x03, b'a', b'.', b'b', 0x00, 0x00, 0x00, 0x03, // as before
            0x10, 0x00, 0x02, b'h', b'e', b'l', b'l', b'o',
        ];
        assert_eq!(&p[..], expected);
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
