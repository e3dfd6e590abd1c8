//! A stream protocol message (AMQP 1.0 sections, as RabbitMQ's stream
//! clients encode them) to the broker's one message format (AMQP 0-9-1
//! properties and body) and back, so the same stream is read over both
//! protocols from one stored copy.
//!
//! | AMQP 1.0 (stream client)          | AMQP 0-9-1 (stored)          |
//! |-----------------------------------|------------------------------|
//! | first `data` section              | body                         |
//! | properties: message-id, correlation-id (any type, as text), content-type, content-encoding, reply-to | the same properties |
//! | application-properties: string, integers, booleans, binary | `headers` (other types as text) |
//! | anything else (header, annotations, footer, other properties) | dropped |
//!
//! A message that is not AMQP 1.0 with a `data` section (bytes of the
//! client's own, e.g. `rstream`'s `Producer.send(b"...")`, or an
//! `amqp-value` body) is stored whole as the body with the header
//! [`HEADER_RAW`]: a stream client gets back exactly the bytes it sent,
//! an AMQP 0-9-1 consumer gets them as the body.
//!
//! Invariants:
//! - Nothing here fails: bytes that do not decode are stored raw.
//! - A stream client reads, for a message a stream client published, the
//!   same body, properties (of the table) and application properties.

use berth_protocol::{AMQPProperties, AMQPValue, FieldTable, ShortString};
use bytes::Bytes;
use rabbitmq_stream_protocol::codec::{Decoder, Encoder};
use rabbitmq_stream_protocol::message::{Message, SimpleValue};

/// The header of a message stored as the bytes a stream client sent.
pub const HEADER_RAW: &str = "x-stream-raw-message";
/// The header every stream message carries its offset in (the broker's).
pub const HEADER_OFFSET: &str = "x-stream-offset";

/// A published message's 0-9-1 properties and body.
pub fn to_broker(bytes: &Bytes) -> (AMQPProperties, Bytes) {
    let props = AMQPProperties::default().with_delivery_mode(2);
    let parsed = match Message::decode(bytes) {
        Ok(([], m)) => m,
        _ => return raw(props, bytes),
    };
    let Some(data) = parsed.data() else {
        return raw(props, bytes);
    };
    let body = Bytes::copy_from_slice(data);
    let mut props = props;
    if let Some(p) = parsed.properties() {
        let short = |s: String| ShortString::try_new(s).ok();
        if let Some(v) = p.message_id.as_ref().and_then(|i| short(id_text(i))) {
            props = props.with_message_id(v);
        }
        if let Some(v) = p.correlation_id.as_ref().and_then(|i| short(id_text(i))) {
            props = props.with_correlation_id(v);
        }
        if let Some(v) = p.content_type.as_ref().and_then(|s| short(s.to_string())) {
            props = props.with_content_type(v);
        }
        if let Some(v) = p
            .content_encoding
            .as_ref()
            .and_then(|s| short(s.to_string()))
        {
            props = props.with_content_encoding(v);
        }
        if let Some(v) = p.reply_to.as_ref().and_then(|s| short(s.clone())) {
            props = props.with_reply_to(v);
        }
    }
    if let Some(app) = parsed.application_properties() {
        let mut headers = FieldTable::default();
        for (k, v) in app.iter() {
            if let Ok(k) = ShortString::try_new(k.clone()) {
                headers.insert(k, header_value(v));
            }
        }
        props = props.with_headers(headers);
    }
    (props, body)
}

fn raw(props: AMQPProperties, bytes: &Bytes) -> (AMQPProperties, Bytes) {
    let mut headers = FieldTable::default();
    headers.insert(HEADER_RAW.into(), AMQPValue::Boolean(true));
    (props.with_headers(headers), bytes.clone())
}

/// A message or correlation id as text (the crate's id type is not
/// exported by name; its conversions are).
fn id_text<T: std::fmt::Debug>(id: &T) -> String
where
    for<'a> &'a String: TryFrom<&'a T>,
    for<'a> &'a u64: TryFrom<&'a T>,
    for<'a> &'a i64: TryFrom<&'a T>,
{
    if let Ok(s) = <&String>::try_from(id) {
        return s.clone();
    }
    if let Ok(n) = <&u64>::try_from(id) {
        return n.to_string();
    }
    if let Ok(n) = <&i64>::try_from(id) {
        return n.to_string();
    }
    format!("{id:?}")
}

fn header_value(v: &SimpleValue) -> AMQPValue {
    match v {
        SimpleValue::Boolean(b) => AMQPValue::Boolean(*b),
        SimpleValue::Ubyte(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Ushort(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Uint(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Ulong(n) => AMQPValue::LongLongInt(i64::try_from(*n).unwrap_or(i64::MAX)),
        SimpleValue::Byte(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Short(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Int(n) => AMQPValue::LongLongInt(i64::from(*n)),
        SimpleValue::Long(n) => AMQPValue::LongLongInt(*n),
        SimpleValue::String(s) => AMQPValue::LongString(s.as_str().into()),
        SimpleValue::Symbol(s) => AMQPValue::LongString(s.to_string().as_str().into()),
        SimpleValue::Binary(b) => AMQPValue::ByteArray(b.clone().into()),
        SimpleValue::Null => AMQPValue::Void,
        other => AMQPValue::LongString(format!("{other:?}").as_str().into()),
    }
}

/// The bytes a stream client gets for a stored message: the raw bytes
/// it was published as, or an AMQP 1.0 message made from its 0-9-1
/// properties and body.
pub fn to_client(props: &AMQPProperties, body: &Bytes) -> Bytes {
    let headers = props.headers().as_ref();
    if headers.is_some_and(|h| matches!(h.inner().get(HEADER_RAW), Some(AMQPValue::Boolean(true))))
    {
        return body.clone();
    }
    let mut p = Message::builder().properties();
    let mut any = false;
    if let Some(v) = props.message_id() {
        p = p.message_id(v.as_str().to_owned());
        any = true;
    }
    if let Some(v) = props.correlation_id() {
        p = p.correlation_id(v.as_str().to_owned());
        any = true;
    }
    if let Some(v) = props.content_type() {
        p = p.content_type(v.as_str());
        any = true;
    }
    if let Some(v) = props.content_encoding() {
        p = p.content_encoding(v.as_str());
        any = true;
    }
    if let Some(v) = props.reply_to() {
        p = p.reply_to(v.as_str().to_owned());
        any = true;
    }
    let mut b = if any {
        p.message_builder()
    } else {
        Message::builder()
    };
    if let Some(h) = headers {
        let table: Vec<_> = h
            .inner()
            .iter()
            .filter(|(k, _)| k.as_str() != HEADER_OFFSET)
            .collect();
        if !table.is_empty() {
            let mut a = b.application_properties();
            for (k, v) in table {
                a = a.insert(k.as_str(), app_value(v));
            }
            b = a.message_builder();
        }
    }
    let m = b.body(body.to_vec()).build();
    let mut out = Vec::with_capacity(m.encoded_size() as usize);
    if let Err(e) = m.encode(&mut out) {
        tracing::error!(error = ?e, "a message could not be encoded as AMQP 1.0; sent as its body");
        return body.clone();
    }
    Bytes::from(out)
}

fn app_value(v: &AMQPValue) -> SimpleValue {
    match v {
        AMQPValue::Boolean(b) => SimpleValue::Boolean(*b),
        AMQPValue::ShortShortInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::ShortInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::ShortUInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::LongInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::LongUInt(n) => SimpleValue::Long(i64::from(*n)),
        AMQPValue::LongLongInt(n) => SimpleValue::Long(*n),
        AMQPValue::LongString(s) => {
            SimpleValue::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ShortString(s) => SimpleValue::String(s.as_str().to_owned()),
        AMQPValue::ByteArray(b) => SimpleValue::Binary(b.as_slice().to_vec()),
        AMQPValue::Void => SimpleValue::Null,
        other => SimpleValue::String(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amqp_1_0_message_goes_through_0_9_1_and_back() {
        let sent = Message::builder()
            .properties()
            .message_id("m-1".to_owned())
            .content_type("text/plain")
            .message_builder()
            .application_properties()
            .insert("colour", "blue")
            .message_builder()
            .body(b"hello".to_vec())
            .build();
        let mut bytes = Vec::new();
        sent.encode(&mut bytes).unwrap();
        let (props, body) = to_broker(&Bytes::from(bytes));
        assert_eq!(&body[..], b"hello");
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "text/plain"
        );
        let back = to_client(&props, &body);
        let (_, m) = Message::decode(&back).unwrap();
        assert_eq!(m.data(), Some(&b"hello"[..]));
        assert_eq!(
            m.application_properties().unwrap().get("colour"),
            Some(&SimpleValue::String("blue".into()))
        );
    }

    #[test]
    fn bytes_that_are_not_amqp_1_0_come_back_as_they_were() {
        let sent = Bytes::from_static(b"\x00\x53 not really amqp");
        let (props, body) = to_broker(&sent);
        assert_eq!(body, sent);
        assert_eq!(to_client(&props, &body), sent);
    }
}
