//! What a shovel is doing, as RabbitMQ's shovel management shows it
//! (`GET /api/shovels`): `starting` while it connects, `running` while it
//! moves messages, `terminated` with the reason after a failure (until it
//! starts again) or when it stopped for good.
//!
//! Invariants:
//! - A status never holds a password: URIs are shown redacted.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::definition::{redact, Definition, Destination, Kind, Source};

/// The state of one shovel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Starting,
    /// Connected to `src_uri` and `dest_uri` (the ones in use, of the
    /// failover lists).
    Running {
        src_uri: String,
        dest_uri: String,
    },
    Terminated {
        reason: String,
    },
}

/// A state and when it was entered.
#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub since: SystemTime,
    /// Messages moved (acknowledged at the source, or sent under `no-ack`)
    /// since berth started this shovel.
    pub moved: u64,
}

impl Status {
    pub fn new(state: State) -> Self {
        Self {
            state,
            since: SystemTime::now(),
            moved: 0,
        }
    }

    pub fn set(&mut self, state: State) {
        if self.state != state {
            self.state = state;
            self.since = SystemTime::now();
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, as RabbitMQ's `timestamp` field.
fn timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// One entry of `GET /api/shovels`.
pub fn status_json(def: &Definition, status: &Status, node: &str) -> Value {
    let mut out = json!({
        "node": node,
        "timestamp": timestamp(status.since),
        "name": def.name,
        "vhost": def.vhost,
        "type": def.kind.as_str(),
        "berth_messages_moved": status.moved,
    });
    let m = out.as_object_mut().expect("built as an object");
    if def.kind == Kind::Static {
        // A static shovel belongs to no vhost; RabbitMQ shows none.
        m.remove("vhost");
    }
    match &status.state {
        State::Starting => {
            m.insert("state".into(), json!("starting"));
        }
        State::Terminated { reason } => {
            m.insert("state".into(), json!("terminated"));
            m.insert("reason".into(), json!(reason));
        }
        State::Running { src_uri, dest_uri } => {
            m.insert("state".into(), json!("running"));
            m.insert("blocked_status".into(), json!("running"));
            m.insert("src_protocol".into(), json!("amqp091"));
            m.insert("dest_protocol".into(), json!("amqp091"));
            m.insert("src_uri".into(), json!(redact(src_uri)));
            m.insert("dest_uri".into(), json!(redact(dest_uri)));
            match &def.source {
                Source::Queue(q) => {
                    m.insert("src_queue".into(), json!(q));
                }
                Source::Exchange { exchange, key } => {
                    m.insert("src_exchange".into(), json!(exchange));
                    m.insert("src_exchange_key".into(), json!(key));
                }
            }
            match &def.destination {
                Destination::Queue(q) => {
                    m.insert("dest_queue".into(), json!(q));
                }
                Destination::Exchange { exchange, key } => {
                    m.insert("dest_exchange".into(), json!(exchange));
                    if let Some(k) = key {
                        m.insert("dest_exchange_key".into(), json!(k));
                    }
                }
                Destination::AsReceived => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_is_rabbitmqs_utc_format() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(timestamp(t), "2023-11-14 22:13:20");
        assert_eq!(timestamp(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00");
    }
}
