//! AMQP field values and tables as JSON and back, in the shapes
//! RabbitMQ's management API uses (client properties, queue and exchange
//! arguments, policy definitions, message headers).
//!
//! Invariants:
//! - Pure conversions: no I/O and no server state, so both the AMQP side
//!   (`connection`, for the registry's client properties) and the HTTP
//!   side may use them.
//! - Integers become JSON numbers when they fit in an `i64`; JSON
//!   integers come back as signed 64-bit values (as RabbitMQ stores them).
//! - A JSON key that cannot be a field name (longer than a shortstr) is
//!   an error naming it, never a panic.

use berth_protocol::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{json, Value};

/// An AMQP field value as JSON.
pub fn value_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::LongString(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::ShortString(s) => json!(s.as_str()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_json).collect()),
        AMQPValue::FieldTable(t) => table_json(t),
        AMQPValue::Float(f) => json!(f),
        AMQPValue::Double(f) => json!(f),
        AMQPValue::Void => Value::Null,
        other => berth_broker::args::as_i128(other)
            .and_then(|i| i64::try_from(i).ok())
            .map_or_else(|| json!(format!("{other:?}")), |i| json!(i)),
    }
}

/// An AMQP field table as a JSON object.
pub fn table_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), value_json(v)))
            .collect(),
    )
}

/// A JSON value as an AMQP field value (integers as signed 64-bit, as
/// RabbitMQ's API stores them), or why it cannot be one.
pub fn json_value(v: &Value) -> Result<AMQPValue, String> {
    Ok(match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => n.as_i64().map_or_else(
            || AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
            AMQPValue::LongLongInt,
        ),
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter().map(json_value).collect::<Result<Vec<_>, _>>()?,
        )),
        Value::Object(_) => AMQPValue::FieldTable(json_table(v)?),
    })
}

/// A JSON object as an AMQP field table; anything else is an empty table.
/// The error names a key that cannot be a field name and what to do.
pub fn json_table(v: &Value) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    if let Value::Object(m) = v {
        for (k, x) in m {
            let Ok(name) = ShortString::try_new(k.as_str()) else {
                let why = berth_broker::name_rules::shortstr_problem(k).unwrap_or_default();
                let start: String = k.chars().take(32).collect();
                return Err(format!("the key '{start}…' is {why}"));
            };
            let value =
                json_value(x).map_err(|e| format!("in '{name}': {e}", name = name.as_str()))?;
            t.insert(name, value);
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 16: such a key panicked in `ShortString::from`, and the HTTP
    /// connection was reset instead of answered.
    #[test]
    fn a_key_longer_than_a_shortstr_is_an_error_naming_it() {
        let v = json!({"a": [{"k".repeat(300): 1}]});
        let e = json_table(&v).unwrap_err();
        assert!(e.starts_with("in 'a': the key 'kkkk"), "{e}");
        assert!(
            e.contains("is 300 bytes long, but at most 255 bytes"),
            "{e}"
        );
        let v = json!({"k".repeat(255): "x"});
        assert_eq!(json_table(&v).unwrap().inner().len(), 1);
    }
}
