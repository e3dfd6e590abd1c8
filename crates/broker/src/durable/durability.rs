//! The journal and the id counters every vhost and queue shares, the
//! removals waiting for another write to be durable, and the event log.
//!
//! Invariants:
//! - Message and queue ids are never reused: they continue from one past
//!   the largest the journal gave back.
//! - A deferred removal is journaled only after the write it waited for
//!   completed with `Ok`, and from a broker thread (never from a
//!   completion, which runs on the journal's thread).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::placement::{id_in_group, Placement};
use super::{all_of, complete, Done, EventSink, Journal, JournalError};

/// Marks a journal queue id, or a queued message's journal id, as a
/// paging copy: a body written only to leave memory (a transient message,
/// or any message of a non-durable queue). Such copies never survive a
/// restart: the journal's queues with this bit are purged at startup.
pub const PAGING_BIT: u64 = 1 << 63;

/// The journal and the id counters every vhost and queue shares.
pub struct Durability {
    pub journal: Arc<dyn Journal>,
    /// Next journal message id (never reused: restored from the journal).
    next_msg_id: AtomicU64,
    /// Next journal queue id (durable queues and paging ids).
    next_queue_id: AtomicU64,
    /// Live durable queues per log group: a new one goes to the emptiest.
    placement: Placement,
    /// Ready messages per queue whose bodies stay in memory; beyond it,
    /// bodies already written to the journal are read back when needed.
    resident_messages_max: AtomicUsize,
    /// Body bytes per queue that stay in memory, whatever the count allows.
    resident_bytes_max: AtomicU64,
    /// Removals waiting to be journaled: (queue, message, completion).
    /// Filled from journal completions (a store thread, which must not
    /// call back into the store), emptied by [`Durability::flush_removals`]
    /// from broker threads.
    deferred: Mutex<Vec<(u64, u64, Option<Done>)>>,
    /// The event log, once set at startup; unset (the default) every
    /// event hook is one branch.
    events: OnceLock<Arc<dyn EventSink>>,
}

impl Durability {
    /// Ids continue from the given values (one past the largest recovered).
    pub fn new(journal: Arc<dyn Journal>, next_msg_id: u64, next_queue_id: u64) -> Self {
        Self {
            placement: Placement::new(journal.groups()),
            journal,
            next_msg_id: AtomicU64::new(next_msg_id),
            next_queue_id: AtomicU64::new(next_queue_id),
            resident_messages_max: AtomicUsize::new(crate::limits::RESIDENT_MESSAGES_MAX_DEFAULT),
            resident_bytes_max: AtomicU64::new(crate::limits::RESIDENT_BYTES_MAX_DEFAULT),
            deferred: Mutex::new(Vec::new()),
            events: OnceLock::new(),
        }
    }

    /// A completion for a write that `msg`'s removal from `queue` must wait
    /// for: once that write is durable, the removal is queued for the next
    /// [`Durability::flush_removals`]; if it failed, the message stays
    /// (it returns after a restart) and `done` gets the error.
    pub fn defer_removal(self: &Arc<Self>, queue: u64, msg: u64, done: Option<Done>) -> Done {
        let me = Arc::downgrade(self);
        Box::new(move |r: Result<(), JournalError>| match (r, me.upgrade()) {
            (Ok(()), Some(dur)) => dur.deferred.lock().push((queue, msg, done)),
            (Ok(()), None) => {
                complete(
                    done,
                    Err(JournalError::new(
                        "the broker stopped before the removal was journaled",
                    )),
                );
            }
            (Err(e), _) => {
                tracing::error!(queue, msg, error = %e, "a dead-lettered copy was not stored; the message stays in its queue and returns after a restart");
                complete(done, Err(e));
            }
        })
    }

    /// Journals the removals whose prerequisite writes are durable.
    pub fn flush_removals(&self) {
        let due = std::mem::take(&mut *self.deferred.lock());
        if due.is_empty() {
            return;
        }
        let mut by_queue: BTreeMap<u64, (Vec<u64>, Vec<Done>)> = BTreeMap::new();
        for (q, m, d) in due {
            let e = by_queue.entry(q).or_default();
            e.0.push(m);
            e.1.extend(d);
        }
        for (q, (msgs, dones)) in by_queue {
            self.journal.remove(q, &msgs, all_of(dones));
        }
    }

    /// Turns the event log on (once, at startup).
    pub fn set_events(&self, sink: Arc<dyn EventSink>) {
        if self.events.set(sink).is_err() {
            tracing::warn!("the event log was already set; keeping the first");
        }
    }

    /// The event log, if it is on, shared.
    pub fn event_sink(&self) -> Option<Arc<dyn EventSink>> {
        self.events.get().cloned()
    }

    /// The event log, if it is on.
    #[inline]
    pub fn events(&self) -> Option<&dyn EventSink> {
        self.events.get().map(|s| s.as_ref())
    }

    pub fn journal(&self) -> &dyn Journal {
        self.journal.as_ref()
    }

    /// The journal, shared (for a completion that writes again).
    pub fn journal_shared(&self) -> Arc<dyn Journal> {
        Arc::clone(&self.journal)
    }

    /// A fresh journal message id.
    pub fn new_message_id(&self) -> u64 {
        self.next_msg_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh journal queue id for a durable queue (or a durable delayed
    /// exchange's pending messages), in the log group holding the fewest
    /// live durable queues.
    pub fn new_queue_id(&self) -> u64 {
        if self.journal.groups() <= 1 {
            return self.next_id();
        }
        let want = self.placement.emptiest();
        id_in_group(self.journal.as_ref(), want, || self.next_id())
    }

    /// A fresh journal queue id for a queue's paging copies (wherever it
    /// falls: paging copies never outlive the process).
    pub fn new_paging_id(&self) -> u64 {
        self.next_id() | PAGING_BIT
    }

    fn next_id(&self) -> u64 {
        self.next_queue_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A durable queue with this journal id is live (declared, restored
    /// or applied); see [`Placement`].
    pub fn queue_added(&self, id: u64) {
        self.placement.added(self.journal.group_of(id));
    }

    /// A durable queue with this journal id is gone.
    pub fn queue_removed(&self, id: u64) {
        self.placement.removed(self.journal.group_of(id));
    }

    pub fn resident_messages_max(&self) -> usize {
        self.resident_messages_max.load(Ordering::Relaxed)
    }

    pub fn set_resident_messages_max(&self, n: usize) {
        self.resident_messages_max.store(n, Ordering::Relaxed);
    }

    pub fn resident_bytes_max(&self) -> u64 {
        self.resident_bytes_max.load(Ordering::Relaxed)
    }

    pub fn set_resident_bytes_max(&self, n: u64) {
        self.resident_bytes_max.store(n, Ordering::Relaxed);
    }
}
