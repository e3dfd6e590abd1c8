//! Restore after a restart: the broker's exchanges, queues, bindings and
//! messages rebuilt from what the journal gave back.
//!
//! Invariants:
//! - Exchanges are restored before queues, and queues before bindings: each
//!   needs the former.
//! - Nothing the journal gave back is dropped silently: an entry that
//!   cannot be used stays in the journal and is reported.
//! - Restored messages are flagged redelivered (they may have been
//!   delivered before the crash).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use berth_protocol::{AMQPValue, FieldTable};

use crate::args::{as_i128, as_string, QueueArgs};
use crate::broker::Broker;
use crate::durable;
use crate::exchange::{Destination, Exchange, ExchangeKind};
use crate::message::Message;
use crate::queue::Queue;
use crate::vhost::VHost;

/// What a journal gave back after a restart.
#[derive(Default)]
pub struct Recovered {
    /// Stored definitions (key, value).
    pub meta: Vec<(Vec<u8>, Vec<u8>)>,
    /// Per durable queue id, its messages (journal id, body) in order.
    pub messages: HashMap<u64, Vec<(u64, StoredBody)>>,
}

/// A recovered message as the journal gives it back.
pub enum StoredBody {
    /// The stored payload, already read.
    Payload(bytes::Bytes),
    /// Still only on disk, `len` bytes: read back (with
    /// [`Journal::read`]) when it is delivered.
    OnDisk { len: u32 },
}

impl Recovered {
    /// (next message id, next queue id): one past the largest recovered.
    pub fn next_ids(&self) -> (u64, u64) {
        let msg = self
            .messages
            .values()
            .flatten()
            .map(|(m, _)| *m)
            .max()
            .unwrap_or(0)
            + 1;
        let queue = self
            .meta
            .iter()
            .filter(|(k, _)| k.first() == Some(&b'q'))
            .filter_map(|(_, v)| durable::read_table(v))
            .filter_map(|t| t.inner().get("id").and_then(as_i128))
            .filter_map(|i| u64::try_from(i).ok())
            .max()
            .unwrap_or(0)
            + 1;
        (
            msg,
            queue.max(self.messages.keys().max().map_or(1, |m| m + 1)),
        )
    }
}

/// What [`Broker::restore`] rebuilt.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
    pub messages: usize,
    /// Entries that could not be restored, and why.
    pub skipped: Vec<String>,
    /// Queue ids with stored messages but no definition (the queue was
    /// deleted and the crash came before its purge was durable).
    pub orphaned_queues: Vec<u64>,
}

impl Broker {
    /// Rebuilds durable exchanges, queues, bindings and their messages from
    /// what the journal gave back. Entries that cannot be used are kept in
    /// the journal and reported, never silently dropped.
    pub fn restore(&self, recovered: Recovered, now: Instant) -> RestoreReport {
        let mut report = RestoreReport::default();
        let mut messages = recovered.messages;
        let entries: Vec<(Vec<String>, Vec<u8>)> = recovered
            .meta
            .into_iter()
            .map(|(k, v)| (durable::split_key(&k), v))
            .collect();
        // Exchanges, then queues, then bindings: each needs the former.
        for pass in ["x", "q", "b"] {
            for (parts, value) in entries
                .iter()
                .filter(|(p, _)| p.first().map(String::as_str) == Some(pass))
            {
                let Some(vhost) = parts.get(1).and_then(|v| self.vhost(v)) else {
                    report.skipped.push(format!(
                        "{parts:?}: vhost is not configured (add it to auth.vhosts)"
                    ));
                    continue;
                };
                let outcome = match (pass, parts.len()) {
                    ("x", 3) => vhost
                        .restore_exchange(&parts[2], value)
                        .map(|()| report.exchanges += 1),
                    ("q", 3) => vhost.restore_queue(&parts[2], value, now).map(|(q, id)| {
                        report.queues += 1;
                        for (mid, body) in messages.remove(&id).unwrap_or_default() {
                            // A priority queue needs each message's priority
                            // now; other queues read bodies on delivery.
                            let body = match body {
                                StoredBody::OnDisk { len }
                                    if q.declared_args.max_priority.is_none() =>
                                {
                                    q.restore_paged(mid, len, 0, now);
                                    report.messages += 1;
                                    continue;
                                }
                                StoredBody::OnDisk { .. } => vhost.journal().read(id, mid),
                                StoredBody::Payload(p) => Ok(p),
                            };
                            match body
                                .map_err(|e| e.to_string())
                                .and_then(|p| Message::from_stored(&p))
                            {
                                Ok(m) => {
                                    q.restore(m, mid, now);
                                    report.messages += 1;
                                }
                                Err(why) => report
                                    .skipped
                                    .push(format!("message {mid} of queue '{}': {why}", q.name)),
                            }
                        }
                    }),
                    ("b", 7) => vhost
                        .restore_binding(&parts[2], parts[3] == "q", &parts[4], &parts[5], value)
                        .map(|()| report.bindings += 1),
                    _ => Err("malformed key".to_owned()),
                };
                if let Err(why) = outcome {
                    report.skipped.push(format!("{parts:?}: {why}"));
                }
            }
        }
        for (qid, msgs) in messages {
            if !msgs.is_empty() {
                report
                    .skipped
                    .push(format!("{} messages of unknown queue id {qid}", msgs.len()));
            }
        }
        report
    }
}

impl VHost {
    /// Re-creates a stored exchange after a restart.
    pub fn restore_exchange(&self, name: &str, value: &[u8]) -> Result<(), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let get = |k: &str| t.inner().get(k);
        let kind = get("type").and_then(as_string).ok_or("no type")?;
        let kind = ExchangeKind::parse(&kind).map_err(|e| e.text)?;
        let flag = |k: &str| matches!(get(k), Some(AMQPValue::Boolean(true)));
        let arguments = match get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        self.insert_exchange(Arc::new(Exchange::new(
            name.to_owned(),
            kind,
            true,
            flag("auto_delete"),
            flag("internal"),
            arguments,
        )));
        Ok(())
    }

    /// Re-creates a stored queue after a restart; returns it and its id.
    pub fn restore_queue(
        &self,
        name: &str,
        value: &[u8],
        now: Instant,
    ) -> Result<(Arc<Queue>, u64), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let id = t
            .inner()
            .get("id")
            .and_then(as_i128)
            .and_then(|i| u64::try_from(i).ok())
            .ok_or("no id")?;
        let auto_delete = matches!(t.inner().get("auto_delete"), Some(AMQPValue::Boolean(true)));
        let arguments = match t.inner().get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        let args = QueueArgs::parse(name, &self.name, &arguments).map_err(|e| e.text)?;
        let q = Arc::new(Queue::new(
            name.to_owned(),
            self.queue_env(),
            self.name.clone(),
            true,
            auto_delete,
            None,
            Some(id),
            arguments,
            args,
            now,
        ));
        self.insert_queue(Arc::clone(&q));
        Ok((q, id))
    }

    /// Re-creates a stored binding after a restart.
    pub fn restore_binding(
        &self,
        source: &str,
        to_queue: bool,
        destination: &str,
        routing_key: &str,
        value: &[u8],
    ) -> Result<(), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let arguments = match t.inner().get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        let src = self.exchange(source).map_err(|e| e.text)?;
        if to_queue {
            let q = self
                .find_queue(destination)
                .ok_or_else(|| format!("no queue '{destination}'"))?;
            src.bind(Destination::Queue(Arc::clone(&q)), routing_key, &arguments);
            q.bound_from
                .lock()
                .push((source.to_owned(), routing_key.to_owned(), arguments));
        } else {
            self.exchange(destination).map_err(|e| e.text)?;
            src.bind(
                Destination::Exchange(destination.to_owned()),
                routing_key,
                &arguments,
            );
        }
        Ok(())
    }
}
