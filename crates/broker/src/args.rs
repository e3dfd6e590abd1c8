//! `x-` queue arguments: parsed once at declare time, validated as RabbitMQ
//! validates them, and compared on redeclaration.
//!
//! Unknown `x-` arguments are kept but ignored (as RabbitMQ does); a
//! recognised argument with a value of the wrong type or range is refused with
//! 406 PRECONDITION_FAILED naming the argument and the problem.

use berth_protocol::{AMQPValue, FieldTable};

use crate::error::{AmqpError, AmqpResult};
use crate::name_rules::shortstr_problem;

/// What a full queue does with one more message (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop (dead-letter) the oldest message.
    #[default]
    DropHead,
    /// Refuse the new message (publisher gets basic.nack).
    RejectPublish,
    /// Refuse the new message and dead-letter it.
    RejectPublishDlx,
}

/// `x-queue-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    #[default]
    Classic,
    Quorum,
    /// An append-only log read from any offset (`stream.rs`).
    Stream,
}

/// The queue arguments berth acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueArgs {
    pub message_ttl_ms: Option<u64>,
    pub expires_ms: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    pub delivery_limit: Option<u64>,
    pub consumer_timeout_ms: Option<u64>,
    pub max_priority: Option<u8>,
    pub queue_type: QueueType,
    /// `x-max-age` of a stream, in milliseconds (retention by age).
    pub max_age_ms: Option<u64>,
    /// `x-stream-max-segment-size-bytes` of a stream.
    pub stream_max_segment_size_bytes: Option<u64>,
    /// Delayed retry (`x-delayed-retry-*`, docs/DELAYED.md): a requeued
    /// message waits its backoff before it is ready again.
    pub delayed_retry: RetryArgs,
}

/// `x-delayed-retry-min` / `-multiplier` / `-max` (or their policy keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryArgs {
    /// The first wait, in ms; setting it enables delayed retry.
    pub min_ms: Option<u64>,
    /// Omitted: linear (min × n); 1: constant; ≥ 2: exponential
    /// (min × multiplierⁿ⁻¹).
    pub multiplier: Option<u64>,
    /// The longest wait, in ms.
    pub max_ms: Option<u64>,
}

/// The arguments compared when a queue is declared again (RabbitMQ's list).
const EQUIVALENCE_KEYS: &[&str] = &[
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-delivery-limit",
    "x-max-priority",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-delayed-retry-min",
    "x-delayed-retry-multiplier",
    "x-delayed-retry-max",
];

/// Arguments a stream refuses with 406, as RabbitMQ does (a log cannot
/// honour TTLs, dead-lettering, priorities, a length in messages,
/// overflow, a delivery limit, expiry or a single active consumer), and
/// berth's delayed retry (a stream requeues nothing).
pub const STREAM_REFUSED_ARGUMENTS: &[&str] = &[
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-priority",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-delivery-limit",
    "x-single-active-consumer",
    "x-queue-mode",
    "x-delayed-retry-min",
    "x-delayed-retry-multiplier",
    "x-delayed-retry-max",
];

/// An integer of any AMQP integer type.
pub fn as_i128(v: &AMQPValue) -> Option<i128> {
    Some(match v {
        AMQPValue::ShortShortInt(x) => i128::from(*x),
        AMQPValue::ShortShortUInt(x) => i128::from(*x),
        AMQPValue::ShortInt(x) => i128::from(*x),
        AMQPValue::ShortUInt(x) => i128::from(*x),
        AMQPValue::LongInt(x) => i128::from(*x),
        AMQPValue::LongUInt(x) => i128::from(*x),
        AMQPValue::LongLongInt(x) => i128::from(*x),
        AMQPValue::Timestamp(x) => i128::from(*x),
        _ => return None,
    })
}

/// A string of either AMQP string type.
pub fn as_string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// RabbitMQ's name for a field type, used in error texts.
pub fn type_name(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) => "shortstr",
        AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "bytearray",
        AMQPValue::Void => "void",
    }
}

/// Values compare equal across integer widths and string kinds, as they do
/// in RabbitMQ's equivalence and headers-exchange checks.
pub fn values_equal(a: &AMQPValue, b: &AMQPValue) -> bool {
    if let (Some(x), Some(y)) = (as_i128(a), as_i128(b)) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (as_string(a), as_string(b)) {
        return x == y;
    }
    a == b
}

fn display_value(v: &AMQPValue) -> String {
    as_i128(v)
        .map(|i| i.to_string())
        .or_else(|| as_string(v))
        .unwrap_or_else(|| format!("{v:?}"))
}

impl QueueArgs {
    /// Refuses dead-letter names that do not fit a shortstr: a dead letter
    /// carries them as its exchange and routing key (`name_rules.rs`). Asked
    /// by `queue.declare`, not by a restore, so a queue stored before the
    /// rule still loads.
    pub fn check_names(&self, queue: &str, vhost: &str) -> AmqpResult<()> {
        for (key, value) in [
            ("x-dead-letter-exchange", &self.dead_letter_exchange),
            ("x-dead-letter-routing-key", &self.dead_letter_routing_key),
        ] {
            if let Some(why) = value.as_deref().and_then(shortstr_problem) {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
                )));
            }
        }
        Ok(())
    }

    /// Parses and validates the arguments of `queue.declare`.
    pub fn parse(queue: &str, vhost: &str, table: &FieldTable) -> AmqpResult<Self> {
        let invalid = |key: &str, why: String| {
            AmqpError::precondition_failed(format!(
                "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
            ))
        };
        let int = |key: &str, min: i128| -> AmqpResult<Option<u64>> {
            match table.inner().get(key) {
                None => Ok(None),
                Some(v) => match as_i128(v) {
                    None => Err(invalid(
                        key,
                        format!("{{unacceptable_type,{}}}", type_name(v)),
                    )),
                    Some(i) if i < 0 => Err(invalid(key, format!("{{value_negative,{i}}}"))),
                    Some(i) if i < min => Err(invalid(key, format!("{{value_zero,{i}}}"))),
                    Some(i) => Ok(Some(u64::try_from(i).unwrap_or(u64::MAX))),
                },
            }
        };
        let string = |key: &str| -> AmqpResult<Option<String>> {
            match table.inner().get(key) {
                None => Ok(None),
                Some(v) => as_string(v)
                    .map(Some)
                    .ok_or_else(|| invalid(key, format!("{{unacceptable_type,{}}}", type_name(v)))),
            }
        };
        let overflow = match string("x-overflow")?.as_deref() {
            None | Some("drop-head") => Overflow::DropHead,
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            Some(other) => {
                return Err(invalid(
                    "x-overflow",
                    format!("{{invalid_overflow,<<\"{other}\">>}}"),
                ))
            }
        };
        let queue_type = match string("x-queue-type")?.as_deref() {
            None | Some("classic") => QueueType::Classic,
            Some("quorum") => QueueType::Quorum,
            Some("stream") => QueueType::Stream,
            Some(other) => {
                return Err(invalid(
                    "x-queue-type",
                    format!(
                        "unknown queue type '{other}', expected 'classic', 'quorum' or 'stream'"
                    ),
                ))
            }
        };
        if queue_type == QueueType::Stream {
            if let Some(key) = STREAM_REFUSED_ARGUMENTS
                .iter()
                .find(|k| table.inner().contains_key(**k))
            {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}'"
                )));
            }
        }
        let max_age_ms = match string("x-max-age")? {
            None => None,
            Some(v) => Some(crate::interval::parse_ms(&v).ok_or_else(|| {
                invalid(
                    "x-max-age",
                    format!("{{invalid_max_age,<<\"{v}\">>}}; expected an integer and a unit Y, M, D, h, m or s, e.g. 7D"),
                )
            })?),
        };
        let max_priority = match int("x-max-priority", 0)? {
            None => None,
            Some(p) if p > 255 => {
                return Err(invalid(
                    "x-max-priority",
                    format!("{{value_too_large,{p},255}}"),
                ))
            }
            Some(p) => Some(p as u8),
        };
        let dead_letter_exchange = string("x-dead-letter-exchange")?;
        let dead_letter_routing_key = string("x-dead-letter-routing-key")?;
        if dead_letter_routing_key.is_some() && dead_letter_exchange.is_none() {
            return Err(invalid(
                "x-dead-letter-routing-key",
                "routing_key_but_no_dlx_defined; set x-dead-letter-exchange too".to_owned(),
            ));
        }
        let delayed_retry = RetryArgs {
            min_ms: int("x-delayed-retry-min", 1)?,
            multiplier: int("x-delayed-retry-multiplier", 1)?,
            max_ms: int("x-delayed-retry-max", 1)?,
        };
        if let (Some(min), Some(max)) = (delayed_retry.min_ms, delayed_retry.max_ms) {
            if max < min {
                return Err(invalid(
                    "x-delayed-retry-max",
                    format!(
                        "{{value_below_min,{max},{min}}}: must be at least x-delayed-retry-min"
                    ),
                ));
            }
        }
        if delayed_retry.min_ms.is_none()
            && (delayed_retry.multiplier.is_some() || delayed_retry.max_ms.is_some())
        {
            return Err(invalid(
                "x-delayed-retry-min",
                "missing: x-delayed-retry-multiplier and -max need x-delayed-retry-min, which enables delayed retry".to_owned(),
            ));
        }
        Ok(Self {
            message_ttl_ms: int("x-message-ttl", 0)?,
            expires_ms: int("x-expires", 1)?,
            max_length: int("x-max-length", 0)?,
            max_length_bytes: int("x-max-length-bytes", 0)?,
            overflow,
            dead_letter_exchange,
            dead_letter_routing_key,
            delivery_limit: int("x-delivery-limit", 0)?,
            consumer_timeout_ms: int("x-consumer-timeout", 0)?,
            max_priority: max_priority.filter(|p| *p > 0),
            queue_type,
            max_age_ms,
            stream_max_segment_size_bytes: int("x-stream-max-segment-size-bytes", 1)?,
            delayed_retry,
        })
    }
}

/// Checks that a redeclaration's arguments match the queue's, as RabbitMQ
/// does for the arguments it considers part of a queue's identity.
pub fn check_equivalent(
    queue: &str,
    vhost: &str,
    current: &FieldTable,
    received: &FieldTable,
) -> AmqpResult<()> {
    for key in EQUIVALENCE_KEYS {
        let (c, r) = (current.inner().get(*key), received.inner().get(*key));
        let same = match (c, r) {
            (None, None) => true,
            (Some(a), Some(b)) => values_equal(a, b),
            // x-queue-type classic is the default, so absent == classic
            (None, Some(v)) | (Some(v), None) if *key == "x-queue-type" => {
                as_string(v).as_deref() == Some("classic")
            }
            _ => false,
        };
        if !same {
            let shown = |v: Option<&AMQPValue>| match v {
                None => "none".to_owned(),
                Some(v) => format!(
                    "the value '{}' of type '{}'",
                    display_value(v),
                    type_name(v)
                ),
            };
            return Err(AmqpError::precondition_failed(format!(
                "inequivalent arg '{key}' for queue '{queue}' in vhost '{vhost}': received {} but current is {}",
                shown(r),
                shown(c)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn known_arguments_are_parsed() {
        let a = QueueArgs::parse(
            "q",
            "/",
            &table(&[
                ("x-message-ttl", AMQPValue::LongInt(1000)),
                ("x-max-length", AMQPValue::ShortShortUInt(3)),
                ("x-overflow", AMQPValue::LongString("reject-publish".into())),
                (
                    "x-dead-letter-exchange",
                    AMQPValue::LongString("dlx".into()),
                ),
                ("x-max-priority", AMQPValue::LongLongInt(10)),
                ("x-whatever", AMQPValue::Boolean(true)),
            ]),
        )
        .unwrap();
        assert_eq!(a.message_ttl_ms, Some(1000));
        assert_eq!(a.max_length, Some(3));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        assert_eq!(a.dead_letter_exchange.as_deref(), Some("dlx"));
        assert_eq!(a.max_priority, Some(10));
    }

    #[test]
    fn negative_ttl_is_refused_with_406() {
        let e = QueueArgs::parse(
            "q",
            "/",
            &table(&[("x-message-ttl", AMQPValue::LongInt(-1))]),
        )
        .unwrap_err();
        assert_eq!(e.reply_code, 406);
        assert!(e.text.contains("x-message-ttl"), "{}", e.text);
    }

    #[test]
    fn zero_expires_and_wrong_types_are_refused() {
        for t in [
            table(&[("x-expires", AMQPValue::LongInt(0))]),
            table(&[("x-max-length", AMQPValue::LongString("ten".into()))]),
            table(&[("x-overflow", AMQPValue::LongString("explode".into()))]),
            table(&[("x-max-priority", AMQPValue::LongInt(256))]),
            table(&[("x-queue-type", AMQPValue::LongString("lazy".into()))]),
        ] {
            assert_eq!(QueueArgs::parse("q", "/", &t).unwrap_err().reply_code, 406);
        }
    }

    #[test]
    fn stream_arguments_are_parsed() {
        let t = table(&[
            ("x-queue-type", AMQPValue::LongString("stream".into())),
            ("x-max-age", AMQPValue::LongString("30m".into())),
            ("x-max-length-bytes", AMQPValue::LongLongInt(1_000_000)),
            ("x-stream-max-segment-size-bytes", AMQPValue::LongInt(4096)),
        ]);
        let a = QueueArgs::parse("q", "/", &t).unwrap();
        assert_eq!(a.queue_type, QueueType::Stream);
        assert_eq!(a.max_age_ms, Some(30 * 60 * 1000));
        assert_eq!(a.max_length_bytes, Some(1_000_000));
        assert_eq!(a.stream_max_segment_size_bytes, Some(4096));
        let bad = table(&[
            ("x-queue-type", AMQPValue::LongString("stream".into())),
            ("x-max-age", AMQPValue::LongString("30 minutes".into())),
        ]);
        assert_eq!(
            QueueArgs::parse("q", "/", &bad).unwrap_err().reply_code,
            406
        );
    }

    #[test]
    fn stream_refuses_the_arguments_rabbitmq_refuses() {
        for key in [
            "x-message-ttl",
            "x-expires",
            "x-max-priority",
            "x-dead-letter-exchange",
            "x-delivery-limit",
            "x-overflow",
            "x-max-length",
            "x-single-active-consumer",
            "x-delayed-retry-min",
        ] {
            let t = table(&[
                ("x-queue-type", AMQPValue::LongString("stream".into())),
                (key, AMQPValue::LongInt(1)),
            ]);
            let e = QueueArgs::parse("q", "/", &t).unwrap_err();
            assert_eq!(e.reply_code, 406, "{key}");
            assert!(
                e.text
                    .contains(&format!("invalid arg '{key}' for queue 'q' in vhost '/'")),
                "{}",
                e.text
            );
        }
    }

    #[test]
    fn equivalence_ignores_integer_width_but_not_values() {
        let a = table(&[("x-message-ttl", AMQPValue::LongInt(5))]);
        let b = table(&[("x-message-ttl", AMQPValue::LongLongInt(5))]);
        let c = table(&[("x-message-ttl", AMQPValue::LongLongInt(6))]);
        assert!(check_equivalent("q", "/", &a, &b).is_ok());
        assert_eq!(
            check_equivalent("q", "/", &a, &c).unwrap_err().reply_code,
            406
        );
        assert_eq!(
            check_equivalent("q", "/", &a, &FieldTable::default())
                .unwrap_err()
                .reply_code,
            406
        );
    }
}
