//! MQTT 5.0 PUBLISH properties ↔ AMQP 0-9-1 message properties, so an
//! AMQP service answers an MQTT request and the reverse (docs/MQTT.md):
//!
//! | MQTT 5.0 | AMQP 0-9-1 |
//! |---|---|
//! | content type | `content_type` |
//! | message expiry interval (s) | `expiration` (ms) |
//! | response topic `a/b` | `reply_to` `a.b` (a routing key on `amq.topic`) |
//! | correlation data | `correlation_id` if UTF-8 and at most 255 bytes, else header `x-correlation-id` |
//! | user property `k: v` | header `k` = `v` (a long string); names starting with `x-` are not taken |
//! | payload format indicator 1 | header `x-mqtt-payload-format` = 1 |
//!
//! Pure: no I/O, no broker. A 3.1.1 client has none of these; what an
//! AMQP publisher set is given to 5.0 subscribers only.
//!
//! Invariants:
//! - Nothing here fails a publish: a value AMQP cannot hold (a content
//!   type or response topic over 255 bytes) is dropped, not refused.
//! - Headers berth uses itself (`x-…`) never become user properties, and
//!   user properties never overwrite them.

use berth_protocol::{AMQPProperties, AMQPValue, FieldTable, ShortString};
use bytes::Bytes;
use mqtt5_protocol::{Properties, PropertyId, PropertyValue};

use super::topic;

/// The AMQP header carrying the QoS an MQTT client published with, as
/// RabbitMQ's plugin names it.
pub const HEADER_PUBLISH_QOS: &str = "x-mqtt-publish-qos";

/// The AMQP header that marks a message published with the retain flag
/// (a v5 subscription with retain-as-published is sent it with the flag).
pub const HEADER_RETAIN: &str = "x-mqtt-retain";

/// The header holding correlation data that is no AMQP `correlation_id`.
pub const HEADER_CORRELATION: &str = "x-correlation-id";
/// The header holding a 5.0 payload format indicator of 1 (UTF-8).
pub const HEADER_PAYLOAD_FORMAT: &str = "x-mqtt-payload-format";

fn utf8(p: &Properties, id: PropertyId) -> Option<&str> {
    match p.get(id)? {
        PropertyValue::Utf8String(s) => Some(s),
        _ => None,
    }
}

/// Adds a 5.0 PUBLISH's properties to `props` and `headers`.
pub fn to_amqp(
    p: &Properties,
    mut props: AMQPProperties,
    headers: &mut FieldTable,
) -> AMQPProperties {
    if let Some(ct) = p
        .get_content_type()
        .and_then(|c| ShortString::try_new(c).ok())
    {
        props = props.with_content_type(ct);
    }
    if let Some(s) = p.get_message_expiry_interval() {
        let ms = u64::from(s) * 1000;
        if let Ok(e) = ShortString::try_new(ms.to_string()) {
            props = props.with_expiration(e);
        }
    }
    if let Some(t) = utf8(p, PropertyId::ResponseTopic) {
        // A response topic is a topic name: a wildcard in it is the
        // client's error, and it is dropped rather than misrouted.
        if let Some(key) = topic::routing_key(t)
            .ok()
            .and_then(|k| ShortString::try_new(k).ok())
        {
            props = props.with_reply_to(key);
        }
    }
    if let Some(PropertyValue::BinaryData(data)) = p.get(PropertyId::CorrelationData) {
        let id = std::str::from_utf8(data)
            .ok()
            .and_then(|s| ShortString::try_new(s.to_owned()).ok());
        match id {
            Some(id) => props = props.with_correlation_id(id),
            None => {
                headers.insert(
                    HEADER_CORRELATION.into(),
                    AMQPValue::LongString(data.to_vec().into()),
                );
            }
        }
    }
    if let Some(PropertyValue::Byte(1)) = p.get(PropertyId::PayloadFormatIndicator) {
        headers.insert(HEADER_PAYLOAD_FORMAT.into(), AMQPValue::ShortShortUInt(1));
    }
    for v in p.get_all(PropertyId::UserProperty).unwrap_or(&[]) {
        if let PropertyValue::Utf8StringPair(k, v) = v {
            if !k.starts_with("x-") {
                if let Ok(name) = ShortString::try_new(k.clone()) {
                    headers.insert(name, AMQPValue::LongString(v.as_str().into()));
                }
            }
        }
    }
    props
}

/// A header value as a user property's value, if it is text or a number.
fn header_text(v: &AMQPValue) -> Option<String> {
    Some(match v {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok()?,
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        _ => return None,
    })
}

/// Sets a 5.0 PUBLISH's properties from a message's AMQP properties.
pub fn to_mqtt(props: &AMQPProperties, out: &mut Properties) {
    if let Some(ct) = props.content_type() {
        out.set_content_type(ct.as_str().to_owned());
    }
    if let Some(ms) = props
        .expiration()
        .as_ref()
        .and_then(|e| e.as_str().parse::<u64>().ok())
    {
        let s = ms.div_ceil(1000);
        out.set_message_expiry_interval(u32::try_from(s).unwrap_or(u32::MAX));
    }
    if let Some(r) = props.reply_to() {
        out.set_response_topic(topic::topic_name(r.as_str()));
    }
    if let Some(c) = props.correlation_id() {
        out.set_correlation_data(Bytes::copy_from_slice(c.as_str().as_bytes()));
    }
    let Some(headers) = props.headers() else {
        return;
    };
    for (k, v) in headers.inner() {
        match k.as_str() {
            HEADER_CORRELATION if props.correlation_id().is_none() => {
                if let AMQPValue::LongString(s) = v {
                    out.set_correlation_data(Bytes::copy_from_slice(s.as_bytes()));
                }
            }
            HEADER_PAYLOAD_FORMAT => out.set_payload_format_indicator(true),
            name if name.starts_with("x-") => {}
            name => {
                if let Some(text) = header_text(v) {
                    out.add_user_property(name.to_owned(), text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_properties_survive_the_trip_through_amqp() {
        let mut p = Properties::default();
        p.set_content_type("application/json".into());
        p.set_message_expiry_interval(30);
        p.set_response_topic("replies/dev1".into());
        p.set_correlation_data(Bytes::from_static(b"req-7"));
        p.set_payload_format_indicator(true);
        p.add_user_property("site".into(), "north".into());
        p.add_user_property("x-mqtt-publish-qos".into(), "2".into());
        let mut headers = FieldTable::default();
        let props = to_amqp(&p, AMQPProperties::default(), &mut headers);
        assert_eq!(props.reply_to().as_ref().unwrap().as_str(), "replies.dev1");
        assert_eq!(props.correlation_id().as_ref().unwrap().as_str(), "req-7");
        assert_eq!(props.expiration().as_ref().unwrap().as_str(), "30000");
        assert!(
            headers.inner().get("x-mqtt-publish-qos").is_none(),
            "x- names are not taken"
        );
        let props = props.with_headers(headers);
        let mut back = Properties::default();
        to_mqtt(&props, &mut back);
        assert_eq!(back.get_content_type().as_deref(), Some("application/json"));
        assert_eq!(back.get_message_expiry_interval(), Some(30));
        assert_eq!(utf8(&back, PropertyId::ResponseTopic), Some("replies/dev1"));
        assert_eq!(back.get_user_property_value("site"), Some("north"));
        assert!(matches!(
            back.get(PropertyId::CorrelationData),
            Some(PropertyValue::BinaryData(d)) if &d[..] == b"req-7"
        ));
        assert!(matches!(
            back.get(PropertyId::PayloadFormatIndicator),
            Some(PropertyValue::Byte(1))
        ));
    }

    #[test]
    fn binary_correlation_data_goes_in_a_header_and_back() {
        let mut p = Properties::default();
        p.set_correlation_data(Bytes::from_static(&[0xFF, 0x00, 0x01]));
        let mut headers = FieldTable::default();
        let props = to_amqp(&p, AMQPProperties::default(), &mut headers);
        assert!(props.correlation_id().is_none());
        let props = props.with_headers(headers);
        let mut back = Properties::default();
        to_mqtt(&props, &mut back);
        assert!(matches!(
            back.get(PropertyId::CorrelationData),
            Some(PropertyValue::BinaryData(d)) if d[..] == [0xFF, 0x00, 0x01]
        ));
    }
}
