//! A shovel's definition: the `value` of RabbitMQ's
//! `/api/parameters/shovel/{vhost}/{name}` (a static shovel of the config
//! file is translated into one first), checked field by field and
//! turned into a [`Definition`] the worker runs. Pure: no I/O (the
//! certificate files an `amqps://` URI names are read by
//! `shovel::check_files`).
//!
//! Invariants:
//! - Every key of the value is either one berth runs, one RabbitMQ knows
//!   that berth refuses with "not supported by berth yet", or unknown and
//!   refused: nothing is accepted and then silently ignored.
//! - A definition that parses keeps the value as given (`value`), so an
//!   export returns what was put, as RabbitMQ's does.

use serde_json::{Map, Value};

use crate::limits::{SHOVEL_PREFETCH_COUNT_DEFAULT, SHOVEL_RECONNECT_DELAY_S_DEFAULT};

/// What the shovel consumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A queue, declared durable if it does not exist (as RabbitMQ does).
    Queue(String),
    /// An exchange: the shovel binds a server-named exclusive queue to it
    /// with `key`.
    Exchange { exchange: String, key: String },
}

/// Where the shovel publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A queue (through the default exchange), declared durable if it
    /// does not exist.
    Queue(String),
    /// An exchange; `key` replaces the message's routing key when set.
    Exchange {
        exchange: String,
        key: Option<String>,
    },
    /// Neither given: the exchange and routing key the message arrived
    /// with.
    AsReceived,
}

/// When the source is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// After the destination confirmed the publish: nothing is lost,
    /// duplicates are possible after a failure.
    OnConfirm,
    /// Once the publish is written to the destination's socket.
    OnPublish,
    /// Consumed with `no_ack`: a failure can lose what was in flight.
    NoAck,
}

impl AckMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::OnConfirm => "on-confirm",
            AckMode::OnPublish => "on-publish",
            AckMode::NoAck => "no-ack",
        }
    }
}

/// When the shovel deletes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAfter {
    Never,
    /// After moving as many messages as the source queue held when the
    /// shovel first started.
    QueueLength,
    /// After moving this many messages.
    Count(u64),
}

/// Where a shovel was defined, as RabbitMQ's `type` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Through the API (a runtime parameter of a vhost), kept in
    /// `shovels.json`.
    Dynamic,
    /// In the config file (`[shovels.NAME]`): no vhost, not kept on disk
    /// by berth, not changed or deleted through the API.
    Static,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Dynamic => "dynamic",
            Kind::Static => "static",
        }
    }
}

/// A checked shovel definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub kind: Kind,
    /// The vhost of a dynamic shovel; empty for a static one.
    pub vhost: String,
    pub name: String,
    /// Tried in turn: the first that connects is used (failover).
    pub src_uris: Vec<String>,
    pub source: Source,
    pub dest_uris: Vec<String>,
    pub destination: Destination,
    pub ack_mode: AckMode,
    pub prefetch_count: u16,
    pub delete_after: DeleteAfter,
    /// Wait before reconnecting after a failure; 0: never restart (as in
    /// RabbitMQ).
    pub reconnect_delay_ms: u64,
    /// `x-shovelled`: who moved the message, from where, to where.
    pub add_forward_headers: bool,
    /// `x-shovelled-timestamp`: when it was moved, in seconds.
    pub add_timestamp_header: bool,
    /// The value as it was given.
    pub value: Value,
}

/// Keys RabbitMQ 3.10 knows that berth does not run yet.
const NOT_YET: [&str; 9] = [
    "src-consumer-args",
    "dest-publish-properties",
    "publish-properties",
    "src-address",
    "dest-address",
    "dest-application-properties",
    "dest-properties",
    "dest-message-annotations",
    "src-predeclared",
];

fn invalid(why: impl std::fmt::Display) -> String {
    format!("Validation failed\n\n{why}\n")
}

fn string(m: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!("{key} must be a string, got {other}"))),
    }
}

/// A name or routing key: a string of at most 255 bytes (an AMQP short
/// string).
fn short(m: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    let s = string(m, key)?;
    if s.as_ref().is_some_and(|s| s.len() > 255) {
        return Err(invalid(format!("{key} is longer than 255 bytes")));
    }
    Ok(s)
}

fn flag(m: &Map<String, Value>, keys: &[&str]) -> Result<bool, String> {
    for key in keys {
        match m.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => return Ok(*b),
            Some(Value::String(s)) if s == "true" => return Ok(true),
            Some(Value::String(s)) if s == "false" => return Ok(false),
            Some(other) => {
                return Err(invalid(format!("{key} must be true or false, got {other}")))
            }
        }
    }
    Ok(false)
}

/// The first of `keys` present (the 3.10 name, then the older one).
fn first<'a>(m: &'a Map<String, Value>, keys: &[&str]) -> Option<(&'a Value, String)> {
    keys.iter().find_map(|k| {
        m.get(*k)
            .filter(|v| !v.is_null())
            .map(|v| (v, (*k).to_owned()))
    })
}

/// One URI, checked: `amqp://` or `amqps://` with a host, and for
/// `amqps://` RabbitMQ's TLS query parameters (their files are read by
/// `shovel::check_files`, not here). RabbitMQ's host-less `amqp://`
/// (a direct connection inside the node) is refused with what to write
/// instead.
pub fn check_uri(key: &str, uri: &str) -> Result<(), String> {
    let Some(rest) = uri
        .strip_prefix("amqp://")
        .or_else(|| uri.strip_prefix("amqps://"))
    else {
        return Err(invalid(format!(
            "{key}: \"{}\" is not a valid URI: it must start with amqp:// or amqps://",
            redact(uri)
        )));
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if host.is_empty() {
        return Err(invalid(format!(
            "{key}: \"{}\" names no host: berth does not support RabbitMQ's direct local \
             connection yet; give berth's own address, e.g. amqp://user:password@127.0.0.1:5672/%2f",
            redact(uri)
        )));
    }
    uri.parse::<lapin::uri::AMQPUri>().map_err(|e| {
        invalid(format!(
            "{key}: \"{}\" is not a valid URI: {e}",
            redact(uri)
        ))
    })?;
    super::tls::Params::of(key, uri).map_err(invalid)?;
    Ok(())
}

/// `uri` without its password, for status and error text.
pub fn redact(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => uri.to_owned(),
    }
}

fn uris(m: &Map<String, Value>, key: &str) -> Result<Vec<String>, String> {
    let list = match m.get(key) {
        None | Some(Value::Null) => return Err(invalid(format!("{key} is required"))),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|u| {
                u.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(format!("{key}: every URI must be a string, got {u}")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(invalid(format!(
                "{key} must be a URI or a non-empty list of URIs, got {other}"
            )))
        }
    };
    for u in &list {
        check_uri(key, u)?;
    }
    Ok(list)
}

fn protocol(m: &Map<String, Value>, key: &str) -> Result<(), String> {
    match string(m, key)?.as_deref() {
        None | Some("amqp091") => Ok(()),
        Some("amqp10") => Err(invalid(format!(
            "{key}: AMQP 1.0 shovels are not supported by berth yet (use amqp091)"
        ))),
        Some(other) => Err(invalid(format!(
            "{key} must be amqp091 or amqp10, got \"{other}\""
        ))),
    }
}

fn source(m: &Map<String, Value>) -> Result<Source, String> {
    match (short(m, "src-queue")?, short(m, "src-exchange")?) {
        (Some(_), Some(_)) => Err(invalid("Cannot specify 'src-exchange' and 'src-queue'")),
        (None, None) => Err(invalid("Must specify 'src-exchange' or 'src-queue'")),
        (Some(q), None) => {
            if m.get("src-exchange-key").is_some_and(|v| !v.is_null()) {
                return Err(invalid("src-exchange-key needs src-exchange"));
            }
            Ok(Source::Queue(q))
        }
        (None, Some(exchange)) => Ok(Source::Exchange {
            exchange,
            key: short(m, "src-exchange-key")?.unwrap_or_default(),
        }),
    }
}

fn destination(m: &Map<String, Value>) -> Result<Destination, String> {
    let key = short(m, "dest-exchange-key")?;
    match (short(m, "dest-queue")?, short(m, "dest-exchange")?) {
        (Some(_), Some(_)) => Err(invalid("Cannot specify 'dest-exchange' and 'dest-queue'")),
        (Some(_), None) if key.is_some() => Err(invalid(
            "dest-exchange-key cannot be given with dest-queue (the queue's name is the key)",
        )),
        (Some(q), None) => Ok(Destination::Queue(q)),
        (None, Some(exchange)) => Ok(Destination::Exchange { exchange, key }),
        (None, None) if key.is_some() => Ok(Destination::Exchange {
            exchange: String::new(),
            key,
        }),
        (None, None) => Ok(Destination::AsReceived),
    }
}

fn ack_mode(m: &Map<String, Value>) -> Result<AckMode, String> {
    match string(m, "ack-mode")?.as_deref() {
        None | Some("on-confirm") => Ok(AckMode::OnConfirm),
        Some("on-publish") => Ok(AckMode::OnPublish),
        Some("no-ack") => Ok(AckMode::NoAck),
        Some(other) => Err(invalid(format!(
            "ack-mode must be on-confirm, on-publish or no-ack, got \"{other}\""
        ))),
    }
}

fn prefetch_count(m: &Map<String, Value>) -> Result<u16, String> {
    let Some((v, key)) = first(m, &["src-prefetch-count", "prefetch-count"]) else {
        return Ok(SHOVEL_PREFETCH_COUNT_DEFAULT);
    };
    v.as_u64()
        .filter(|n| (1..=u64::from(u16::MAX)).contains(n))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| invalid(format!("{key} must be an integer from 1 to 65535, got {v}")))
}

fn delete_after(m: &Map<String, Value>, ack: AckMode) -> Result<DeleteAfter, String> {
    let Some((v, key)) = first(m, &["src-delete-after", "delete-after"]) else {
        return Ok(DeleteAfter::Never);
    };
    let d = match v {
        Value::String(s) if s == "never" => DeleteAfter::Never,
        Value::String(s) if s == "queue-length" => DeleteAfter::QueueLength,
        Value::Number(n) if n.as_u64().is_some() => DeleteAfter::Count(n.as_u64().unwrap_or(0)),
        other => {
            return Err(invalid(format!(
                "{key} should be a number, \"never\" or \"queue-length\", actually was {other}"
            )))
        }
    };
    if ack == AckMode::NoAck && d != DeleteAfter::Never {
        return Err(invalid(format!(
            "Cannot specify 'no-ack' and '{key}' (berth counts moved messages by their acks)"
        )));
    }
    Ok(d)
}

fn reconnect_delay_ms(m: &Map<String, Value>) -> Result<u64, String> {
    let s = match m.get("reconnect-delay") {
        None | Some(Value::Null) => SHOVEL_RECONNECT_DELAY_S_DEFAULT,
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite() && (0.0..=86_400.0).contains(s))
            .ok_or_else(|| {
                invalid(format!(
                    "reconnect-delay must be a number of seconds from 0 to 86400, got {v}"
                ))
            })?,
    };
    // Within 0..=86_400_000 after the check above.
    Ok((s * 1000.0).round() as u64)
}

/// Checks `value` (the `value` of a PUT body or of a definitions entry)
/// and builds the definition of shovel `name` in `vhost`; the error is a
/// message for a 400.
pub fn parse(vhost: &str, name: &str, value: &Value) -> Result<Definition, String> {
    let Value::Object(m) = value else {
        return Err(invalid("value must be a JSON object of shovel fields"));
    };
    if name.is_empty() {
        return Err(invalid("a shovel needs a name"));
    }
    for key in m.keys() {
        if NOT_YET.contains(&key.as_str()) {
            return Err(invalid(format!("{key} is not supported by berth yet")));
        }
        if !KNOWN.contains(&key.as_str()) {
            return Err(invalid(format!(
                "{key} is not a shovel field (known: {})",
                KNOWN.join(", ")
            )));
        }
    }
    protocol(m, "src-protocol")?;
    protocol(m, "dest-protocol")?;
    let ack_mode = ack_mode(m)?;
    Ok(Definition {
        kind: Kind::Dynamic,
        vhost: vhost.to_owned(),
        name: name.to_owned(),
        src_uris: uris(m, "src-uri")?,
        source: source(m)?,
        dest_uris: uris(m, "dest-uri")?,
        destination: destination(m)?,
        ack_mode,
        prefetch_count: prefetch_count(m)?,
        delete_after: delete_after(m, ack_mode)?,
        reconnect_delay_ms: reconnect_delay_ms(m)?,
        add_forward_headers: flag(m, &["dest-add-forward-headers", "add-forward-headers"])?,
        add_timestamp_header: flag(m, &["dest-add-timestamp-header"])?,
        value: value.clone(),
    })
}

/// The keys berth runs (3.10 names and the older ones RabbitMQ still
/// takes).
const KNOWN: [&str; 19] = [
    "src-uri",
    "src-protocol",
    "src-queue",
    "src-exchange",
    "src-exchange-key",
    "src-prefetch-count",
    "prefetch-count",
    "src-delete-after",
    "delete-after",
    "dest-uri",
    "dest-protocol",
    "dest-queue",
    "dest-exchange",
    "dest-exchange-key",
    "dest-add-forward-headers",
    "add-forward-headers",
    "dest-add-timestamp-header",
    "ack-mode",
    "reconnect-delay",
];

#[cfg(test)]
mod tests;
