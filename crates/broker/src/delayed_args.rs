//! The arguments of delayed messages, as the plugin and LavinMQ read them:
//! `x-delayed-type` on an `x-delayed-message` exchange, `x-delay` on a
//! message.

use berth_protocol::FieldTable;

use crate::args::{as_i128, as_string};
pub use crate::delayed::{DELAYED_EXCHANGE_TYPE, DELAYED_TYPE_ARG};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::ExchangeKind;

/// The header holding a message's delay.
pub const DELAY_HEADER: &str = "x-delay";

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

/// The delay a message asks for, in milliseconds: its `x-delay` header if
/// that is a positive integer; absent, zero, negative or not an integer
/// means no delay (as the plugin and LavinMQ read it).
pub fn delay_ms(headers: Option<&FieldTable>) -> Option<u64> {
    let ms = as_i128(headers?.inner().get(DELAY_HEADER)?)?;
    (ms > 0).then(|| u64::try_from(ms).unwrap_or(u64::MAX))
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
    fn only_a_positive_integer_delay_delays() {
        assert_eq!(delay_ms(None), None);
        assert_eq!(delay_ms(Some(&FieldTable::default())), None);
        assert_eq!(delay_ms(Some(&headers(AMQPValue::LongInt(0)))), None);
        assert_eq!(delay_ms(Some(&headers(AMQPValue::LongInt(-5)))), None);
        assert_eq!(
            delay_ms(Some(&headers(AMQPValue::LongString("100".into())))),
            None
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
