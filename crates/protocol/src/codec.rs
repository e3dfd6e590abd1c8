//! Method and content frames: typed values in, bytes out, and back.
//!
//! Most methods go through `amq-protocol`'s generated codec. The methods on
//! the message hot path (`basic.publish` in; `basic.deliver`, `basic.get-ok`,
//! `basic.return`, `basic.ack`, `basic.nack` out) are coded here by hand
//! because they are a few fixed fields and run once per message. Content
//! headers stay raw: properties are decoded only when routing or a queue
//! argument needs them, and a delivery re-sends the publisher's bytes.
//!
//! Invariants:
//! - Every `encode_*` appends whole frames; a partial frame is never left in
//!   the output buffer.
//! - Body frames never exceed the negotiated `frame_max`.

use amq_protocol::protocol::{basic::AMQPProperties, AMQPClass};
use amq_protocol::types::FieldTable;
use bytes::{BufMut, Bytes, BytesMut};

use crate::frame::{
    put_frame_header, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    FRAME_OVERHEAD,
};

/// AMQP class id of `connection`.
pub const CLASS_CONNECTION: u16 = 10;
pub const METHOD_CONNECTION_START_OK: u16 = 11;
pub const METHOD_CONNECTION_TUNE_OK: u16 = 31;
pub const METHOD_CONNECTION_OPEN: u16 = 40;
/// AMQP class id of `basic`, the only content class.
pub const CLASS_BASIC: u16 = 60;
pub const METHOD_BASIC_QOS: u16 = 10;
pub const METHOD_BASIC_PUBLISH: u16 = 40;
pub const METHOD_BASIC_RETURN: u16 = 50;
pub const METHOD_BASIC_DELIVER: u16 = 60;
pub const METHOD_BASIC_GET_OK: u16 = 71;
pub const METHOD_BASIC_ACK: u16 = 80;
pub const METHOD_BASIC_NACK: u16 = 120;
/// AMQP class id of `tx`.
pub const CLASS_TX: u16 = 90;
pub const METHOD_TX_COMMIT: u16 = 20;
/// class-id, weight, body-size: the fixed prefix of a content header payload.
const CONTENT_HEADER_FIXED_SIZE: usize = 2 + 2 + 8;

/// Why a frame payload could not be understood. Each maps to one AMQP
/// connection exception in the server.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// A method we do not know (540 NOT_IMPLEMENTED).
    #[error("unknown method {class_id}.{method_id}")]
    UnknownMethod { class_id: u16, method_id: u16 },
    /// A known method whose arguments do not parse (502 SYNTAX_ERROR).
    #[error("malformed arguments for method {class_id}.{method_id}")]
    Malformed { class_id: u16, method_id: u16 },
    /// A payload too short to hold even its ids (502 SYNTAX_ERROR).
    #[error("frame payload of {0} bytes is too short")]
    Truncated(usize),
    /// A content header that is not well formed (502 SYNTAX_ERROR).
    #[error("malformed content header: {0}")]
    BadContentHeader(&'static str),
}

/// A decoded method frame payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// `basic.publish`, decoded by hand: it is the hot path.
    Publish(Publish),
    /// Every other method.
    Other(AMQPClass),
}

/// The arguments of `basic.publish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub exchange: String,
    pub routing_key: String,
    pub mandatory: bool,
    pub immediate: bool,
}

/// Class and method ids of a method frame payload, if it has them.
pub fn method_ids(payload: &[u8]) -> Option<(u16, u16)> {
    (payload.len() >= 4).then(|| {
        (
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        )
    })
}

/// `basic.qos`'s `prefetch-size`, which the generated codec drops; berth
/// refuses a non-zero value with 540 as RabbitMQ does.
pub fn qos_prefetch_size(payload: &[u8]) -> Option<u32> {
    payload
        .get(4..8)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
}

/// Decodes a method frame payload.
pub fn decode_method(payload: &[u8]) -> Result<Method, DecodeError> {
    let (class_id, method_id) = method_ids(payload).ok_or(DecodeError::Truncated(payload.len()))?;
    if (class_id, method_id) == (CLASS_BASIC, METHOD_BASIC_PUBLISH) {
        return decode_publish(&payload[4..])
            .map(Method::Publish)
            .ok_or(DecodeError::Malformed {
                class_id,
                method_id,
            });
    }
    if !is_known_method(class_id, method_id) {
        return Err(DecodeError::UnknownMethod {
            class_id,
            method_id,
        });
    }
    match amq_protocol::protocol::parse_class(payload) {
        Ok((_, class)) => Ok(Method::Other(class)),
        Err(_) => Err(DecodeError::Malformed {
            class_id,
            method_id,
        }),
    }
}

fn is_known_method(class_id: u16, method_id: u16) -> bool {
    let known: &[u16] = match class_id {
        10 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61, 70, 71],
        20 => &[10, 11, 20, 21, 40, 41],
        30 => &[10, 11],
        40 => &[10, 11, 20, 21, 30, 31, 40, 51],
        50 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51],
        60 => &[
            10, 11, 20, 21, 30, 31, 40, 50, 60, 70, 71, 72, 80, 90, 100, 110, 111, 120,
        ],
        85 => &[10, 11],
        90 => &[10, 11, 20, 21, 30, 31],
        _ => &[],
    };
    known.contains(&method_id)
}

fn decode_publish(mut p: &[u8]) -> Option<Publish> {
    let _reserved = take(&mut p, 2)?;
    let exchange = take_shortstr(&mut p)?;
    let routing_key = take_shortstr(&mut p)?;
    let bits = *take(&mut p, 1)?.first()?;
    Some(Publish {
        exchange,
        routing_key,
        mandatory: bits & 1 != 0,
        immediate: bits & 2 != 0,
    })
}

fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if p.len() < n {
        return None;
    }
    let (head, rest) = p.split_at(n);
    *p = rest;
    Some(head)
}

fn take_shortstr(p: &mut &[u8]) -> Option<String> {
    let len = *take(p, 1)?.first()? as usize;
    let bytes = take(p, len)?;
    String::from_utf8(bytes.to_vec()).ok()
}

/// A content header with its properties still raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentHeader {
    pub class_id: u16,
    pub body_size: u64,
    /// Property flags and property list, exactly as the publisher sent them.
    pub properties: Bytes,
}

/// Reads the fixed part of a content header; the properties stay raw but are
/// checked to parse, so a malformed header is refused at the door instead of
/// poisoning a queue.
pub fn decode_content_header(payload: &Bytes) -> Result<ContentHeader, DecodeError> {
    if payload.len() < CONTENT_HEADER_FIXED_SIZE + 2 {
        return Err(DecodeError::BadContentHeader(
            "shorter than its fixed fields",
        ));
    }
    let class_id = u16::from_be_bytes([payload[0], payload[1]]);
    let body_size = u64::from_be_bytes(payload[4..12].try_into().expect("8 bytes"));
    let properties = payload.slice(CONTENT_HEADER_FIXED_SIZE..);
    decode_properties(&properties)?;
    Ok(ContentHeader {
        class_id,
        body_size,
        properties,
    })
}

/// Decodes raw property bytes (flags + list).
pub fn decode_properties(raw: &[u8]) -> Result<AMQPProperties, DecodeError> {
    match amq_protocol::protocol::basic::parse_properties(raw) {
        Ok(([], props)) => Ok(props),
        Ok(_) => Err(DecodeError::BadContentHeader(
            "trailing bytes after properties",
        )),
        Err(_) => Err(DecodeError::BadContentHeader("properties do not parse")),
    }
}

/// Encodes properties to raw bytes (flags + list).
pub fn encode_properties(props: &AMQPProperties) -> Bytes {
    let buf = cookie_factory::gen_simple(
        amq_protocol::protocol::basic::gen_properties(props),
        Vec::new(),
    )
    .expect("writing to a Vec cannot fail");
    Bytes::from(buf)
}

/// Encodes a field table as it appears in a method argument (u32 length +
/// entries); useful for tests and sizing.
pub fn encode_field_table(table: &FieldTable) -> Vec<u8> {
    cookie_factory::gen_simple(
        amq_protocol::types::generation::gen_field_table(table),
        Vec::new(),
    )
    .expect("writing to a Vec cannot fail")
}

/// Decodes a length-prefixed field table (as in AMQPLAIN responses once the
/// length is prepended).
pub fn decode_field_table(bytes: &[u8]) -> Option<FieldTable> {
    match amq_protocol::types::parsing::parse_field_table(bytes) {
        Ok(([], t)) => Some(t),
        _ => None,
    }
}

/// Appends a method frame for any method.
pub fn encode_method(out: &mut BytesMut, channel: u16, method: &AMQPClass) {
    let payload = cookie_factory::gen_simple(amq_protocol::protocol::gen_class(method), Vec::new())
        .expect("writing to a Vec cannot fail");
    put_frame_header(out, FRAME_METHOD, channel, payload.len() as u32);
    out.extend_from_slice(&payload);
    out.put_u8(FRAME_END);
}

fn put_shortstr(out: &mut BytesMut, s: &str) {
    // Names that reach here were accepted as shortstr on the way in (≤ 255).
    let bytes = &s.as_bytes()[..s.len().min(255)];
    out.put_u8(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

/// Writes a method frame whose payload is produced by `body`, patching the
/// size afterwards.
fn hand_method(out: &mut BytesMut, channel: u16, method_id: u16, body: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    put_frame_header(out, FRAME_METHOD, channel, 0);
    out.put_u16(CLASS_BASIC);
    out.put_u16(method_id);
    body(out);
    let size = (out.len() - start - 7) as u32;
    out[start + 3..start + 7].copy_from_slice(&size.to_be_bytes());
    out.put_u8(FRAME_END);
}

/// Appends `basic.deliver`.
pub fn encode_deliver(
    out: &mut BytesMut,
    channel: u16,
    consumer_tag: &str,
    delivery_tag: u64,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
) {
    hand_method(out, channel, METHOD_BASIC_DELIVER, |o| {
        put_shortstr(o, consumer_tag);
        o.put_u64(delivery_tag);
        o.put_u8(u8::from(redelivered));
        put_shortstr(o, exchange);
        put_shortstr(o, routing_key);
    });
}

/// Appends `basic.get-ok`.
pub fn encode_get_ok(
    out: &mut BytesMut,
    channel: u16,
    delivery_tag: u64,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
    message_count: u32,
) {
    hand_method(out, channel, METHOD_BASIC_GET_OK, |o| {
        o.put_u64(delivery_tag);
        o.put_u8(u8::from(redelivered));
        put_shortstr(o, exchange);
        put_shortstr(o, routing_key);
        o.put_u32(message_count);
    });
}

/// Appends `basic.return`.
pub fn encode_return(
    out: &mut BytesMut,
    channel: u16,
    reply_code: u16,
    reply_text: &str,
    exchange: &str,
    routing_key: &str,
) {
    hand_method(out, channel, METHOD_BASIC_RETURN, |o| {
        o.put_u16(reply_code);
        put_shortstr(o, reply_text);
        put_shortstr(o, exchange);
        put_shortstr(o, routing_key);
    });
}

/// Appends `basic.ack` (publisher confirm).
pub fn encode_ack(out: &mut BytesMut, channel: u16, delivery_tag: u64, multiple: bool) {
    hand_method(out, channel, METHOD_BASIC_ACK, |o| {
        o.put_u64(delivery_tag);
        o.put_u8(u8::from(multiple));
    });
}

/// Appends `basic.nack` (negative publisher confirm).
pub fn encode_nack(out: &mut BytesMut, channel: u16, delivery_tag: u64, multiple: bool) {
    hand_method(out, channel, METHOD_BASIC_NACK, |o| {
        o.put_u64(delivery_tag);
        // multiple = bit 0, requeue = bit 1 (meaningless from a server)
        o.put_u8(u8::from(multiple));
    });
}

/// Appends a content header frame and the body frames, each at most
/// `frame_max` bytes on the wire.
pub fn encode_content(
    out: &mut BytesMut,
    channel: u16,
    properties: &[u8],
    body: &[u8],
    frame_max: u32,
) {
    put_content_header(out, channel, properties, body.len());
    let chunk = body_chunk_bytes(frame_max);
    out.reserve(body.len() + (body.len() / chunk + 1) * FRAME_OVERHEAD);
    put_body_frames(out, channel, body.len(), frame_max, |out, piece| {
        out.extend_from_slice(&body[piece]);
    });
}

/// [`encode_content`] for a body held in [`Bytes`]: each body frame's
/// payload of at least `share_min` bytes is not copied but handed to
/// `share`, as a slice of `body`, with the output written so far; `share`
/// must send it next, before anything appended after it (a writer that
/// sends the pieces with one vectored write). Smaller pieces are copied.
/// The bytes on the wire are those [`encode_content`] gives.
pub fn encode_content_shared(
    out: &mut BytesMut,
    channel: u16,
    properties: &[u8],
    body: &Bytes,
    frame_max: u32,
    share_min: usize,
    mut share: impl FnMut(&mut BytesMut, Bytes),
) {
    put_content_header(out, channel, properties, body.len());
    put_body_frames(out, channel, body.len(), frame_max, |out, piece| {
        if piece.len() >= share_min {
            share(out, body.slice(piece));
        } else {
            out.extend_from_slice(&body[piece]);
        }
    });
}

/// Frames a body of `body_len` bytes: for each body frame, its header,
/// then `put_piece` with the range of the body it carries, then the end
/// octet.
fn put_body_frames(
    out: &mut BytesMut,
    channel: u16,
    body_len: usize,
    frame_max: u32,
    mut put_piece: impl FnMut(&mut BytesMut, std::ops::Range<usize>),
) {
    let chunk = body_chunk_bytes(frame_max);
    for start in (0..body_len).step_by(chunk) {
        let piece = start..(start + chunk).min(body_len);
        put_frame_header(out, FRAME_BODY, channel, piece.len() as u32);
        put_piece(out, piece);
        out.put_u8(FRAME_END);
    }
}

fn put_content_header(out: &mut BytesMut, channel: u16, properties: &[u8], body_len: usize) {
    let header_size = CONTENT_HEADER_FIXED_SIZE + properties.len();
    put_frame_header(out, FRAME_HEADER, channel, header_size as u32);
    out.put_u16(CLASS_BASIC);
    out.put_u16(0);
    out.put_u64(body_len as u64);
    out.extend_from_slice(properties);
    out.put_u8(FRAME_END);
}

/// The largest body frame payload within `frame_max` (at least 1).
fn body_chunk_bytes(frame_max: u32) -> usize {
    (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1)
}

/// Appends a heartbeat frame.
pub fn encode_heartbeat(out: &mut BytesMut) {
    put_frame_header(out, FRAME_HEARTBEAT, 0, 0);
    out.put_u8(FRAME_END);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::decode_frame;
    use amq_protocol::protocol::basic;

    fn roundtrip_method(m: &AMQPClass) -> AMQPClass {
        let mut out = BytesMut::new();
        encode_method(&mut out, 7, m);
        let f = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(f.channel, 7);
        match decode_method(&f.payload).unwrap() {
            Method::Other(c) => c,
            Method::Publish(_) => panic!("not a publish"),
        }
    }

    #[test]
    fn generated_methods_roundtrip() {
        let m = AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
            prefetch_count: 10,
            global: true,
        }));
        assert_eq!(roundtrip_method(&m), m);
    }

    #[test]
    fn publish_is_decoded_by_hand_like_the_generated_codec_encodes_it() {
        let m = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "amq.topic".into(),
            routing_key: "a.b.c".into(),
            mandatory: true,
            immediate: false,
        }));
        let mut out = BytesMut::new();
        encode_method(&mut out, 1, &m);
        let f = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(
            decode_method(&f.payload).unwrap(),
            Method::Publish(Publish {
                exchange: "amq.topic".into(),
                routing_key: "a.b.c".into(),
                mandatory: true,
                immediate: false
            })
        );
    }

    #[test]
    fn hand_coded_deliver_parses_with_the_generated_codec() {
        let mut out = BytesMut::new();
        encode_deliver(&mut out, 5, "ctag", 42, true, "ex", "rk");
        let f = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        let (_, class) = amq_protocol::protocol::parse_class(&f.payload[..]).unwrap();
        assert_eq!(
            class,
            AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                consumer_tag: "ctag".into(),
                delivery_tag: 42,
                redelivered: true,
                exchange: "ex".into(),
                routing_key: "rk".into(),
            }))
        );
    }

    #[test]
    fn hand_coded_get_ok_return_ack_nack_parse_with_the_generated_codec() {
        let mut out = BytesMut::new();
        encode_get_ok(&mut out, 1, 9, false, "", "q", 3);
        encode_return(&mut out, 1, 312, "NO_ROUTE", "x", "k");
        encode_ack(&mut out, 1, 77, true);
        encode_nack(&mut out, 1, 78, false);
        let expected = [
            AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                delivery_tag: 9,
                redelivered: false,
                exchange: "".into(),
                routing_key: "q".into(),
                message_count: 3,
            })),
            AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
                exchange: "x".into(),
                routing_key: "k".into(),
            })),
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                delivery_tag: 77,
                multiple: true,
            })),
            AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
                delivery_tag: 78,
                multiple: false,
                requeue: false,
            })),
        ];
        for e in expected {
            let f = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
            let (_, class) = amq_protocol::protocol::parse_class(&f.payload[..]).unwrap();
            assert_eq!(class, e);
        }
        assert!(out.is_empty());
    }

    #[test]
    fn content_is_split_into_frames_within_frame_max() {
        let props = encode_properties(&AMQPProperties::default().with_delivery_mode(2));
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut out = BytesMut::new();
        encode_content(&mut out, 2, &props, &body, 4096);
        let h = decode_frame(&mut out, 4096).unwrap().unwrap();
        let header = decode_content_header(&h.payload).unwrap();
        assert_eq!(header.body_size, 10_000);
        assert_eq!(
            decode_properties(&header.properties)
                .unwrap()
                .delivery_mode(),
            &Some(2)
        );
        let mut got = Vec::new();
        while let Some(f) = decode_frame(&mut out, 4096).unwrap() {
            assert_eq!(f.kind, FRAME_BODY);
            got.extend_from_slice(&f.payload);
        }
        assert_eq!(got, body);
    }

    #[test]
    fn shared_content_is_the_copied_content_with_large_pieces_left_in_the_body() {
        let body = Bytes::from((0..10_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let props = [0x10, 0x00, 2];
        // frame_max 4096: body frames of 4088, 4088 and 1824 bytes.
        for (share_min, shared_pieces) in [(1, 3), (2000, 2), (5000, 0)] {
            let mut copied = BytesMut::new();
            encode_content(&mut copied, 3, &props, &body, 4096);
            let mut wire = Vec::new();
            let mut pieces = Vec::new();
            let mut out = BytesMut::new();
            encode_content_shared(&mut out, 3, &props, &body, 4096, share_min, |o, piece| {
                wire.extend_from_slice(&o.split());
                pieces.push(piece.clone());
                wire.extend_from_slice(&piece);
            });
            wire.extend_from_slice(&out);
            assert_eq!(wire, copied.to_vec(), "share_min {share_min}");
            assert_eq!(pieces.len(), shared_pieces, "share_min {share_min}");
            for p in &pieces {
                let at = p.as_ptr() as usize - body.as_ptr() as usize;
                assert!(
                    at + p.len() <= body.len(),
                    "a shared piece is the body's memory"
                );
                assert!(p.len() >= share_min);
            }
        }
    }

    #[test]
    fn unknown_method_is_reported_with_its_ids() {
        assert_eq!(
            decode_method(&[0, 60, 0, 99]),
            Err(DecodeError::UnknownMethod {
                class_id: 60,
                method_id: 99
            })
        );
    }

    #[test]
    fn truncated_known_method_is_malformed() {
        assert_eq!(
            decode_method(&[0, 50, 0, 10, 0]),
            Err(DecodeError::Malformed {
                class_id: 50,
                method_id: 10
            })
        );
    }
}
