//! Where a stream consumer starts: the `x-stream-offset` argument of
//! `basic.consume`, read as RabbitMQ reads it
//! (`rabbit_stream_queue:parse_offset_arg`).
//!
//! | value                          | start                                  |
//! |--------------------------------|----------------------------------------|
//! | absent, `"next"`               | after the last message (new ones only) |
//! | `"first"`                      | the first message retention kept       |
//! | `"last"`                       | the last message                       |
//! | an integer                     | that offset (clamped to first..=next)  |
//! | a timestamp (AMQP `T`, seconds)| the first message stored at or after it|
//! | an interval string (`"30m"`)   | as a timestamp, that long ago          |
//!
//! RabbitMQ's `last` is the first message of the last chunk (a batch the
//! writer made); berth's chunk is one message, so `last` is the last
//! message.

use berth_protocol::{AMQPValue, FieldTable};

use crate::args::{as_i128, type_name};
use crate::error::{AmqpError, AmqpResult};

/// Where a consumer attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    First,
    Last,
    Next,
    /// An absolute offset.
    Offset(u64),
    /// The first message whose timestamp is at or after this Unix time
    /// in milliseconds.
    TimestampMs(u64),
}

/// Reads `x-stream-offset` from consume arguments; `now_unix_ms` turns
/// an interval into a timestamp.
pub fn parse(
    queue: &str,
    vhost: &str,
    args: &FieldTable,
    now_unix_ms: u64,
) -> AmqpResult<OffsetSpec> {
    let invalid = |shown: String| {
        AmqpError::precondition_failed(format!(
            "invalid x-stream-offset {shown} for queue '{queue}' in vhost '{vhost}': expected first, last, next, an offset, a timestamp or an interval such as 30m"
        ))
    };
    let Some(v) = args.inner().get("x-stream-offset") else {
        return Ok(OffsetSpec::Next);
    };
    match v {
        AMQPValue::Timestamp(s) => Ok(OffsetSpec::TimestampMs(s.saturating_mul(1000))),
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) => {
            let s = crate::args::as_string(v).unwrap_or_default();
            match s.as_str() {
                "first" => Ok(OffsetSpec::First),
                "last" => Ok(OffsetSpec::Last),
                "next" => Ok(OffsetSpec::Next),
                other => match crate::interval::parse_ms(other) {
                    Some(ms) => Ok(OffsetSpec::TimestampMs(now_unix_ms.saturating_sub(ms))),
                    None => Err(invalid(format!("'{other}'"))),
                },
            }
        }
        other => match as_i128(other) {
            Some(n) if n >= 0 => Ok(OffsetSpec::Offset(u64::try_from(n).unwrap_or(u64::MAX))),
            Some(n) => Err(invalid(n.to_string())),
            None => Err(invalid(format!("of type {}", type_name(other)))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Option<AMQPValue>) -> AmqpResult<OffsetSpec> {
        let mut t = FieldTable::default();
        if let Some(v) = v {
            t.insert("x-stream-offset".into(), v);
        }
        parse("s", "/", &t, 10_000_000)
    }

    #[test]
    fn every_form_rabbitmq_accepts_is_read() {
        let text = |s: &str| Some(AMQPValue::LongString(s.into()));
        assert_eq!(spec(None).unwrap(), OffsetSpec::Next);
        assert_eq!(spec(text("first")).unwrap(), OffsetSpec::First);
        assert_eq!(spec(text("last")).unwrap(), OffsetSpec::Last);
        assert_eq!(spec(text("next")).unwrap(), OffsetSpec::Next);
        assert_eq!(
            spec(Some(AMQPValue::LongLongInt(42))).unwrap(),
            OffsetSpec::Offset(42)
        );
        assert_eq!(
            spec(Some(AMQPValue::ShortShortUInt(7))).unwrap(),
            OffsetSpec::Offset(7)
        );
        assert_eq!(
            spec(Some(AMQPValue::Timestamp(1_700))).unwrap(),
            OffsetSpec::TimestampMs(1_700_000)
        );
        assert_eq!(
            spec(text("10s")).unwrap(),
            OffsetSpec::TimestampMs(10_000_000 - 10_000)
        );
    }

    #[test]
    fn anything_else_is_refused_with_406() {
        for v in [
            AMQPValue::LongString("middle".into()),
            AMQPValue::LongLongInt(-1),
            AMQPValue::Boolean(true),
        ] {
            assert_eq!(spec(Some(v)).unwrap_err().reply_code, 406);
        }
    }
}
