//! Field tables, header values and message properties as tests build and read
//! them.

use std::collections::BTreeMap;

pub use lapin;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::BasicProperties;

/// A field table from `(key, value)` pairs.
pub fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// A long-string AMQP value.
pub fn lstr(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A signed 32-bit AMQP value.
pub fn int(n: i32) -> AMQPValue {
    AMQPValue::LongInt(n)
}

/// A signed 64-bit AMQP value.
pub fn long(n: i64) -> AMQPValue {
    AMQPValue::LongLongInt(n)
}

/// A header value as a string, whatever string type the broker used.
pub fn value_str(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// A header value as an integer, whatever integer type the broker used.
pub fn value_int(v: &AMQPValue) -> Option<i64> {
    match *v {
        AMQPValue::ShortShortInt(n) => Some(n.into()),
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortInt(n) => Some(n.into()),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongInt(n) => Some(n.into()),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::LongLongInt(n) => Some(n),
        AMQPValue::Timestamp(n) => i64::try_from(n).ok(),
        _ => None,
    }
}

/// The headers of a delivery as a map (empty when it has none).
pub fn headers_of(props: &BasicProperties) -> BTreeMap<String, AMQPValue> {
    props
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `x-death` header of a dead-lettered message, as a list of tables.
#[track_caller]
pub fn x_death(props: &BasicProperties) -> Vec<BTreeMap<String, AMQPValue>> {
    let headers = headers_of(props);
    let Some(AMQPValue::FieldArray(entries)) = headers.get("x-death") else {
        panic!("no x-death array in headers: {headers:?}");
    };
    entries
        .as_slice()
        .iter()
        .map(|e| match e {
            AMQPValue::FieldTable(t) => t
                .inner()
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            other => panic!("x-death entry is not a table: {other:?}"),
        })
        .collect()
}

/// A field array of long strings.
pub fn str_array(items: &[&str]) -> AMQPValue {
    let mut a = FieldArray::default();
    for i in items {
        a.push(lstr(i));
    }
    AMQPValue::FieldArray(a)
}
