//! The arguments of delayed messages, as the plugin and LavinMQ read them:
//! `x-delayed-type` on an `x-delayed-message` exchange, `x-delay` on a
//! message.

use std::sync::Arc;

use berth_protocol::{AMQPValue, FieldTable};

use crate::args::{as_i128, as_string};
pub use crate::delayed::{DELAYED_EXCHANGE_TYPE, DELAYED_TYPE_ARG};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::ExchangeKind;
use crate::message::Message;

/// The header holding a message's delay.
pub const DELAY_HEADER: &str = "x-delay";

/// The longest delay held, in ms (2^32 − 1, ~49.7 days: the plugin's
/// timer limit); a longer one is no delay, as with the plugin.
pub const DELAY_MS_MAX: u64 = 4_294_967_295;

/// How a delayed exchange routes, from its `x-delayed-type` argument; the
/// plugin's error (406) when it is missing or names no exchange type berth
/// routes with.
pub fn delayed_type(exchange: &str, vhost: &str, args: &FieldTable) -> AmqpResult<ExchangeKind> {
    let named = args.inner().get(DELAYED_TYPE_ARG).and_then(as_string);
    match named.as_deref().map(ExchangeKind::parse) {
        Some(Ok(kind)) => Ok(kind),
        _ => Err(AmqpError::precondition_failed(format!(
            "Invalid argument, '{DELAYED_TYPE_ARG}' must be an existing exchange type (direct, fanout, topic or headers) for exchange '{exchange}' in vhost '{vhost}'"
        ))),
    }
}

/// How an `exchange.declare` of type `kind` routes, and whether it is a
/// delayed exchange: `x-delayed-message` routes as its `x-delayed-type`.
pub fn declared_kind(
    exchange: &str,
    vhost: &str,
    kind: &str,
    args: &FieldTable,
) -> AmqpResult<(ExchangeKind, bool)> {
    if kind == DELAYED_EXCHANGE_TYPE {
        return Ok((delayed_type(exchange, vhost, args)?, true));
    }
    Ok((ExchangeKind::parse(kind)?, false))
}

/// The delay a message asks for, in milliseconds, read as the plugin
/// reads its `x-delay` header: an integer of any AMQP type, a string of
/// decimal digits (an optional sign first), or a float or decimal
/// truncated toward zero. Absent, unreadable, zero, negative or above
/// [`DELAY_MS_MAX`] means no delay.
pub fn delay_ms(headers: Option<&FieldTable>) -> Option<u64> {
    let ms = header_ms(headers?.inner().get(DELAY_HEADER)?)?;
    u64::try_from(ms)
        .ok()
        .filter(|ms| (1..=DELAY_MS_MAX).contains(ms))
}

/// An `x-delay` value as whole milliseconds, if it reads as a number.
fn header_ms(v: &AMQPValue) -> Option<i128> {
    /// Past this a float is far outside any delay; it is refused before
    /// the cast (which would saturate).
    const FLOAT_MS_MAX: f64 = 1e30;
    let truncated = |f: f64| (f.is_finite() && f.abs() < FLOAT_MS_MAX).then(|| f.trunc() as i128);
    match v {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        AMQPValue::ShortString(s) => s.as_str().parse().ok(),
        AMQPValue::Float(f) => truncated(f64::from(*f)),
        AMQPValue::Double(f) => truncated(*f),
        AMQPValue::DecimalValue(d) => {
            let scale = 10_i128.checked_pow(u32::from(d.scale))?;
            Some(i128::from(d.value) / scale)
        }
        other => as_i128(other),
    }
}

/// `msg` once a delayed exchange routed it: `x-delay` negated (the
/// plugin's rule), so a later delayed exchange or delayed dead-letter
/// exchange routes it at once, while a consumer still sees by how much
/// it was delayed. A message that asks for no delay comes back as it is.
pub fn negated(msg: &Arc<Message>) -> AmqpResult<Arc<Message>> {
    let Some(ms) = delay_ms(msg.headers().as_ref()) else {
        return Ok(Arc::clone(msg));
    };
    let minus = -i64::try_from(ms).expect("at most 2^32 - 1");
    let value = i32::try_from(minus).map_or(AMQPValue::LongLongInt(minus), AMQPValue::LongInt);
    msg.rewritten(msg.exchange.clone(), msg.routing_key.clone(), |p| {
        let mut h = p.headers().clone().unwrap_or_default();
        h.insert(DELAY_HEADER.into(), value);
        *p = p.clone().with_headers(h);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::AMQPValue;

    fn headers(v: AMQPValue) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert(DELAY_HEADER.into(), v);
        t
    }

    #[test]
    fn only_a_positive_delay_up_to_2_pow_32_minus_1_delays() {
        assert_eq!(delay_ms(None), None);
        assert_eq!(delay_ms(Some(&FieldTable::default())), None);
        assert_eq!(delay_ms(Some(&headers(AMQPValue::LongInt(0)))), None);
        assert_eq!(delay_ms(Some(&headers(AMQPValue::LongInt(-5)))), None);
        assert_eq!(
            delay_ms(Some(&headers(AMQPValue::LongLongInt(1 << 32)))),
            None
        );
        assert_eq!(
            delay_ms(Some(&headers(AMQPValue::LongUInt(u32::MAX)))),
            Some(DELAY_MS_MAX)
        );
        assert_eq!(
            delay_ms(Some(&headers(AMQPValue::ShortInt(100)))),
            Some(100)
        );
        assert_eq!(
            delay_ms(Some(&headers(AMQPValue::LongLongInt(5_000)))),
            Some(5_000)
        );
    }

    #[test]
    fn string_float_and_decimal_delays_read_as_the_plugin_reads_them() {
        let ms = |v: AMQPValue| delay_ms(Some(&headers(v)));
        assert_eq!(ms(AMQPValue::LongString("100".into())), Some(100));
        assert_eq!(ms(AMQPValue::ShortString("+7".into())), Some(7));
        assert_eq!(ms(AMQPValue::LongString("-100".into())), None);
        assert_eq!(ms(AMQPValue::LongString("1.5".into())), None);
        assert_eq!(ms(AMQPValue::LongString(" 100".into())), None);
        assert_eq!(ms(AMQPValue::LongString("".into())), None);
        assert_eq!(ms(AMQPValue::Double(99.99)), Some(99));
        assert_eq!(ms(AMQPValue::Float(0.5)), None, "truncated to 0");
        assert_eq!(ms(AMQPValue::Double(f64::NAN)), None);
        assert_eq!(ms(AMQPValue::Double(f64::INFINITY)), None);
        assert_eq!(ms(AMQPValue::Double(1e300)), None);
        let d = berth_protocol::DecimalValue {
            scale: 2,
            value: 12_345,
        };
        assert_eq!(ms(AMQPValue::DecimalValue(d)), Some(123));
        let d = berth_protocol::DecimalValue {
            scale: 255,
            value: 1,
        };
        assert_eq!(ms(AMQPValue::DecimalValue(d)), None, "scale past i128");
    }

    #[test]
    fn a_negated_delay_delays_no_more() {
        let p = berth_protocol::AMQPProperties::default()
            .with_headers(headers(AMQPValue::LongString("3000000000".into())));
        let raw = berth_protocol::codec::encode_properties(&p);
        let m = Message::new("d".into(), "k".into(), raw, "b".into()).unwrap();
        let n = negated(&m).unwrap();
        let h = n.headers().unwrap();
        assert_eq!(
            h.inner().get(DELAY_HEADER),
            Some(&AMQPValue::LongLongInt(-3_000_000_000)),
            "past i32: a long long"
        );
        assert_eq!(delay_ms(Some(&h)), None);
        assert!(Arc::ptr_eq(&negated(&n).unwrap(), &n), "nothing to negate");
    }

    #[test]
    fn delayed_type_must_name_a_routing_type() {
        let mut args = FieldTable::default();
        let e = delayed_type("d", "/", &args).unwrap_err();
        assert_eq!(e.reply_code, berth_protocol::reply::PRECONDITION_FAILED);
        args.insert(
            DELAYED_TYPE_ARG.into(),
            AMQPValue::LongString("x-delayed-message".into()),
        );
        assert!(delayed_type("d", "/", &args).is_err());
        args.insert(
            DELAYED_TYPE_ARG.into(),
            AMQPValue::LongString("topic".into()),
        );
        assert_eq!(delayed_type("d", "/", &args).unwrap(), ExchangeKind::Topic);
    }
}
