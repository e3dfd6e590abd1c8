//! The broker: vhosts, exchanges, bindings, queues, consumers, acks, TTL,
//! dead-lettering and limits. It owns the rules of AMQP 0-9-1 as RabbitMQ
//! implements them, and does no networking: the server feeds it decoded
//! methods and gives it an [`channel::Outlet`] to write deliveries to.
//!
//! Persistent messages in durable queues go to a [`durable::Journal`]; a
//! deep queue keeps only compact entries for them and reads bodies back
//! from the journal when it delivers them.

pub mod args;
pub mod channel;
pub mod durable;
pub mod error;
pub mod exchange;
pub mod message;
pub mod queue;
pub mod vhost;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use durable::{Journal, NoJournal};
pub use error::{AmqpError, AmqpResult};
use message::Message;
use vhost::{Durability, Timers, VHost};

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
            .filter_map(|t| t.inner().get("id").and_then(args::as_i128))
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

/// The whole broker: the vhosts and the timer service they share.
pub struct Broker {
    vhosts: HashMap<String, Arc<VHost>>,
    timers: Arc<Timers>,
    dur: Arc<Durability>,
}

impl Broker {
    /// A broker with the given vhosts (at least `/` in the default setup)
    /// that keeps everything in memory.
    pub fn new<'a>(vhosts: impl IntoIterator<Item = &'a str>) -> Arc<Self> {
        Self::with_journal(vhosts, Arc::new(NoJournal), 1, 1)
    }

    /// A broker whose durable entities and persistent messages go to
    /// `journal`; ids continue from the given values (one past the largest
    /// recovered).
    pub fn with_journal<'a>(
        vhosts: impl IntoIterator<Item = &'a str>,
        journal: Arc<dyn Journal>,
        next_msg_id: u64,
        next_queue_id: u64,
    ) -> Arc<Self> {
        let timers = Arc::new(Timers::default());
        let dur = Arc::new(Durability {
            journal,
            next_msg_id: AtomicU64::new(next_msg_id),
            next_queue_id: AtomicU64::new(next_queue_id),
            resident_messages_max: AtomicUsize::new(vhost::RESIDENT_MESSAGES_MAX_DEFAULT),
        });
        let vhosts = vhosts
            .into_iter()
            .map(|n| {
                (
                    n.to_owned(),
                    VHost::new(n, Arc::clone(&timers), Arc::clone(&dur)),
                )
            })
            .collect();
        Arc::new(Self {
            vhosts,
            timers,
            dur,
        })
    }

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
                                StoredBody::OnDisk { len } if q.args.max_priority.is_none() => {
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

    /// Ready messages per queue kept in memory; bodies of stored messages
    /// beyond it are read back from the journal when needed.
    pub fn set_resident_messages_max(&self, n: usize) {
        self.dur.resident_messages_max.store(n, Ordering::Relaxed);
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.get(name).cloned()
    }

    pub fn vhosts(&self) -> impl Iterator<Item = &Arc<VHost>> {
        self.vhosts.values()
    }

    /// Runs due timers (TTL expiry, `x-expires`); the server calls this
    /// periodically.
    pub fn run_timers(&self, now: Instant) {
        self.timers.run_due(now);
    }

    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }
}
