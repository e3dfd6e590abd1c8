//! Static shovels: the `[shovels.NAME]` tables of `berth.toml`, RabbitMQ's
//! `{rabbitmq_shovel, [{shovels, [...]}]}` clause of `advanced.config`
//! written in TOML (docs/SHOVELS.md, "Static shovels").
//!
//! They are not settings of the table (a shovel has no flag and no
//! default): each one is translated key by key into the JSON value a
//! dynamic shovel takes and checked by the same parser
//! ([`crate::shovel::definition::parse`]), so both kinds accept and refuse
//! the same things; an error names the TOML key it comes from.
//!
//! Invariants:
//! - Every key of a static shovel is either translated, refused as "not
//!   supported by berth yet" (a key RabbitMQ knows), or refused as
//!   unknown: nothing is ignored.
//! - An error names `shovels.NAME.<key>` as written in the file.

use serde_json::{Map, Value};

use crate::limits::SHOVEL_STATIC_RECONNECT_DELAY_S_DEFAULT;
use crate::shovel::definition::{self, Definition, Kind};

/// A key of the file and the dynamic shovel field it becomes (values
/// other than tables pass through unchanged unless [`translate`] says).
const FIELDS: [(&str, &str); 13] = [
    ("source.protocol", "src-protocol"),
    ("source.uris", "src-uri"),
    ("source.queue", "src-queue"),
    ("source.prefetch_count", "src-prefetch-count"),
    ("source.delete_after", "src-delete-after"),
    ("destination.protocol", "dest-protocol"),
    ("destination.uris", "dest-uri"),
    ("destination.publish_fields.exchange", "dest-exchange"),
    (
        "destination.publish_fields.routing_key",
        "dest-exchange-key",
    ),
    (
        "destination.add_forward_headers",
        "dest-add-forward-headers",
    ),
    (
        "destination.add_timestamp_header",
        "dest-add-timestamp-header",
    ),
    ("ack_mode", "ack-mode"),
    ("reconnect_delay", "reconnect-delay"),
];

/// Keys RabbitMQ's static shovels know that berth does not run yet.
const NOT_YET: [&str; 4] = [
    "source.declarations",
    "source.consumer_args",
    "destination.declarations",
    "destination.publish_properties",
];

/// Keys of RabbitMQ's older static shovel format (before `source` and
/// `destination` tables).
const OLDER_FORMAT: [&str; 7] = [
    "sources",
    "destinations",
    "queue",
    "prefetch_count",
    "publish_fields",
    "publish_properties",
    "delete_after",
];

/// The tables a static shovel may have.
const TABLES: [&str; 3] = ["source", "destination", "destination.publish_fields"];

/// Reads the static shovel `[shovels.NAME]` (its table as TOML gave it)
/// into a checked definition; the error is a sentence naming the key.
pub fn read(name: &str, table: toml::Value) -> Result<Definition, String> {
    let at = |key: &str| format!("shovels.{name}.{key}");
    if name.is_empty() || name.len() > 255 {
        return Err(format!(
            "shovels.\"{name}\": a static shovel's name is 1 to 255 bytes"
        ));
    }
    let toml::Value::Table(table) = table else {
        return Err(format!(
            "shovels.{name} must be a table ([shovels.{name}] with source and destination)"
        ));
    };
    let mut flat = Vec::new();
    flatten("", toml::Value::Table(table), &mut flat, &at)?;
    let mut value = Map::new();
    for (key, v) in flat {
        if let Some(older) = OLDER_FORMAT.iter().find(|k| **k == key) {
            return Err(format!(
                "{}: this is RabbitMQ's older static shovel format; berth reads the current \
                 one: [shovels.{name}.source] and [shovels.{name}.destination] tables",
                at(older)
            ));
        }
        if NOT_YET.contains(&key.as_str()) {
            return Err(format!("{} is not supported by berth yet", at(&key)));
        }
        let Some((_, field)) = FIELDS.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = FIELDS.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "{} is not a static shovel key (known: {})",
                at(&key),
                known.join(", ")
            ));
        };
        value.insert((*field).to_owned(), translate(&key, v, &at)?);
    }
    if !value.contains_key("src-queue") {
        return Err(format!(
            "{} is required (berth's static shovels consume from a queue)",
            at("source.queue")
        ));
    }
    value
        .entry("reconnect-delay")
        .or_insert(Value::from(SHOVEL_STATIC_RECONNECT_DELAY_S_DEFAULT));
    let mut def = definition::parse("", name, &Value::Object(value))
        .map_err(|why| in_file_terms(name, &why))?;
    def.kind = Kind::Static;
    Ok(def)
}

/// `table`'s keys as dotted paths (`source.uris`), each with its value;
/// only the [`TABLES`] may be tables.
fn flatten(
    prefix: &str,
    value: toml::Value,
    out: &mut Vec<(String, toml::Value)>,
    at: &dyn Fn(&str) -> String,
) -> Result<(), String> {
    let toml::Value::Table(table) = value else {
        unreachable!("only tables are flattened");
    };
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k
        } else {
            format!("{prefix}.{k}")
        };
        let is_table = matches!(v, toml::Value::Table(_));
        if TABLES.contains(&key.as_str()) {
            if !is_table {
                return Err(format!("{} must be a table", at(&key)));
            }
            flatten(&key, v, out, at)?;
        } else {
            out.push((key, v));
        }
    }
    Ok(())
}

/// One value, as the dynamic field takes it: RabbitMQ's static shovels
/// spell `ack_mode` and `delete_after` with underscores.
fn translate(key: &str, v: toml::Value, at: &dyn Fn(&str) -> String) -> Result<Value, String> {
    let words = |v: &toml::Value, allowed: &[&str]| -> Result<Option<String>, String> {
        match v.as_str() {
            Some(s) if allowed.contains(&s) => Ok(Some(s.replace('_', "-"))),
            Some(s) => Err(format!(
                "{} must be {}, got \"{s}\"",
                at(key),
                allowed.join(", ")
            )),
            None => Ok(None),
        }
    };
    match key {
        "ack_mode" => {
            let modes = ["on_confirm", "on_publish", "no_ack"];
            match words(&v, &modes)? {
                Some(s) => return Ok(Value::String(s)),
                None => return Err(format!("{} must be one of {}", at(key), modes.join(", "))),
            }
        }
        "source.delete_after" => {
            if let Some(s) = words(&v, &["never", "queue_length"])? {
                return Ok(Value::String(s));
            }
        }
        _ => {}
    }
    if let toml::Value::Datetime(d) = &v {
        return Err(format!("{} cannot be a date ({d})", at(key)));
    }
    serde_json::to_value(&v).map_err(|e| format!("{}: {e}", at(key)))
}

/// `why` (the dynamic parser's words) with each field named by its key
/// in the file.
pub fn in_file_terms(name: &str, why: &str) -> String {
    let why = why.trim();
    let why = why.strip_prefix("Validation failed").unwrap_or(why).trim();
    // Longest field first, so `dest-exchange-key` is not read as
    // `dest-exchange`; one pass, so a replacement is never replaced.
    let mut fields: Vec<(&str, &str)> = FIELDS.iter().map(|(k, f)| (*f, *k)).collect();
    fields.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let mut out = String::with_capacity(why.len() + 32);
    let mut rest = why;
    'scan: while !rest.is_empty() {
        for (field, key) in &fields {
            if let Some(after) = rest.strip_prefix(field) {
                out.push_str(&format!("shovels.{name}.{key}"));
                rest = after;
                continue 'scan;
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shovel::definition::{AckMode, DeleteAfter, Destination, Source};

    fn table(text: &str) -> toml::Value {
        let mut t: toml::Table = text.parse().expect("valid TOML");
        t.remove("s").expect("a table [s]")
    }

    const MINIMAL: &str = r#"
        [s.source]
        uris = ["amqp://u:p@a:5672/%2f"]
        queue = "in"
        [s.destination]
        uris = "amqp://u:p@b:5672/%2f"
    "#;

    #[test]
    fn a_static_shovel_reads_rabbitmqs_keys_and_defaults() {
        let d = read("s", table(MINIMAL)).unwrap();
        assert_eq!(d.kind, Kind::Static);
        assert_eq!(d.vhost, "");
        assert_eq!(d.src_uris, ["amqp://u:p@a:5672/%2f"]);
        assert_eq!(d.source, Source::Queue("in".into()));
        assert_eq!(d.destination, Destination::AsReceived);
        assert_eq!(d.ack_mode, AckMode::OnConfirm);
        // RabbitMQ's static shovels wait 5 s, not the dynamic 1 s.
        assert_eq!(d.reconnect_delay_ms, 5_000);

        let full = format!(
            "{MINIMAL}
            publish_fields = {{ exchange = \"amq.direct\", routing_key = \"k\" }}
            add_forward_headers = true
            add_timestamp_header = true
            [s]
            ack_mode = \"on_publish\"
            reconnect_delay = 2.5
            "
        );
        let full = full.replace(
            "queue = \"in\"",
            "queue = \"in\"\nprefetch_count = 10\ndelete_after = \"queue_length\"",
        );
        let d = read("s", table(&full)).unwrap();
        assert_eq!(
            d.destination,
            Destination::Exchange {
                exchange: "amq.direct".into(),
                key: Some("k".into())
            }
        );
        assert_eq!(d.ack_mode, AckMode::OnPublish);
        assert_eq!(d.reconnect_delay_ms, 2_500);
        assert_eq!(d.prefetch_count, 10);
        assert_eq!(d.delete_after, DeleteAfter::QueueLength);
        assert!(d.add_forward_headers && d.add_timestamp_header);
    }

    #[test]
    fn errors_name_the_key_in_the_file() {
        let cases = [
            (
                MINIMAL.replace("queue = \"in\"", "queue = \"in\"\nprefetch_count = 0"),
                "shovels.s.source.prefetch_count must be an integer from 1 to 65535",
            ),
            (
                MINIMAL.replace("amqp://u:p@a", "http://u:p@a"),
                "shovels.s.source.uris: \"http://u@a:5672/%2f\" is not a valid URI",
            ),
            (
                MINIMAL.replace("queue = \"in\"", ""),
                "shovels.s.source.queue is required",
            ),
            (
                format!("{MINIMAL}\n[s]\nack_mode = \"on-confirm\""),
                "shovels.s.ack_mode must be on_confirm, on_publish, no_ack",
            ),
            (
                format!("{MINIMAL}\npublish_properties = {{ delivery_mode = 2 }}"),
                "shovels.s.destination.publish_properties is not supported by berth yet",
            ),
            (
                format!("{MINIMAL}\nqueue = \"q\""),
                "shovels.s.destination.queue is not a static shovel key",
            ),
            (
                format!("{MINIMAL}\n[s]\nsources = {{}}"),
                "shovels.s.sources: this is RabbitMQ's older static shovel format",
            ),
            (
                MINIMAL.replace("amqp://u:p@b:5672/%2f", "amqps://u:p@b/%2f"),
                "shovels.s.destination.uris: verify_peer (the default) needs cacertfile",
            ),
            (
                format!("{MINIMAL}\npublish_fields = \"x\""),
                "shovels.s.destination.publish_fields must be a table",
            ),
        ];
        for (text, want) in cases {
            let e = read("s", table(&text)).unwrap_err();
            assert!(e.contains(want), "{text}\n=> {e}");
            assert!(!e.contains("u:p@"), "a password is never echoed: {e}");
        }
    }

    #[test]
    fn dynamic_field_names_are_rewritten_longest_first_in_one_pass() {
        assert_eq!(
            in_file_terms(
                "x",
                "Validation failed\n\ndest-exchange-key and dest-exchange\n"
            ),
            "shovels.x.destination.publish_fields.routing_key and \
             shovels.x.destination.publish_fields.exchange"
        );
    }
}
