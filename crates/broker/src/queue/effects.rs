//! Effects: the work a queue operation leaves for after its lock is
//! released — dead letters to republish, stored messages whose removal to
//! journal, a completion to run, a timer to set, the queue's own deletion
//! — and the one place that carries them out.
//!
//! Invariants:
//! - Effects are collected under the queue's lock and carried out after it
//!   is released: a queue never holds its lock while it publishes to
//!   another queue, calls the journal or deletes itself through its vhost.
//! - A transaction's completion runs only once every removal it caused is
//!   durable, dead-lettered ones included.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use smallvec::SmallVec;

use crate::dead_letter::DeadLetter;
use crate::durable::{retry_id, split_done, Done, PAGING_BIT};
use crate::events::Origin;
use crate::limits::FLOW_READY_MAX;
use crate::timers::TimerTarget;

use super::{Queue, QueueState};

/// Journal ids, inline up to four.
pub type Removed = SmallVec<[u64; 4]>;

/// Work a queue operation leaves for after its lock is released.
#[derive(Default)]
pub struct Effects {
    pub dead: Vec<DeadLetter>,
    /// Stored messages that left the queue: journal their removal. Inline
    /// for a few (an ack of one delivery allocates no list).
    pub removed: Removed,
    /// Completion to run once the removals are durable (transactions).
    pub done: Option<Done>,
    /// The queue should be deleted (auto-delete or x-expires).
    pub delete: bool,
    /// The queue's paging id, for removals of paging copies.
    pub paging_id: Option<u64>,
    pub timer_at: Option<Instant>,
    /// Who caused the operation (the events it causes name them).
    pub origin: Origin,
    /// Retry marks to store (mark id, payload) and to remove (mark ids),
    /// under the queue's retry id (`queue/retry.rs`).
    pub marks_written: Vec<(u64, bytes::Bytes)>,
    pub marks_removed: Removed,
}

impl Queue {
    /// Runs `f` under the lock, then carries out the effects it collected.
    pub(super) fn with_state<R>(
        self: &Arc<Self>,
        now: Instant,
        f: impl FnOnce(&Arc<Self>, &mut QueueState, &mut Effects) -> R,
    ) -> R {
        let mut fx = Effects::default();
        let r = {
            let mut s = self.state.lock();
            let r = f(self, &mut s, &mut fx);
            if !s.retrying.marks.is_empty() {
                // A message that leaves the queue takes its mark along.
                let gone = fx.removed.iter().copied();
                let gone: Removed = gone
                    .chain(fx.dead.iter().filter_map(|d| d.stored))
                    .collect();
                for id in gone {
                    fx.marks_removed.extend(s.retrying.marks.remove(&id));
                }
            }
            if !s.deleted {
                fx.timer_at = self.schedule(&mut s, now);
            }
            fx.paging_id = s.pager.paging_id;
            let backlogged = s.ready.len > FLOW_READY_MAX && Self::busy(&s, now);
            if backlogged != self.backlogged.load(Ordering::Relaxed) {
                self.backlogged.store(backlogged, Ordering::Relaxed);
            }
            self.report_locked(&mut s);
            r
        };
        self.apply(fx, now);
        r
    }

    fn apply(self: &Arc<Self>, fx: Effects, now: Instant) {
        if let Some(at) = fx.timer_at {
            let me: Weak<dyn TimerTarget> = Arc::downgrade(self) as Weak<dyn TimerTarget>;
            self.env.timers.schedule(at, me);
        }
        let journal = self.env.dur.journal();
        if let Some(qid) = self.store_id {
            let rid = retry_id(qid);
            for (id, mark) in fx.marks_written {
                journal.publish(id, &[rid], mark, None);
            }
            if !fx.marks_removed.is_empty() {
                journal.remove(rid, &fx.marks_removed, None);
            }
        }
        // Paging copies (PAGING_BIT) go to the queue's paging id; their
        // removal is never waited for.
        let (paging, removed): (Removed, Removed) =
            fx.removed.into_iter().partition(|id| id & PAGING_BIT != 0);
        if let (Some(pid), false) = (fx.paging_id, paging.is_empty()) {
            let ids: Vec<u64> = paging.iter().map(|id| id & !PAGING_BIT).collect();
            journal.remove(pid, &ids, None);
        }
        let mut dead = fx.dead;
        // A transaction's completion waits for the deferred removals too.
        let deferred = dead.iter().filter(|d| d.stored.is_some()).count();
        let mut done = fx.done;
        if deferred > 0 {
            if let Some(d) = done.take() {
                let mut parts = split_done(d, deferred + 1).into_iter();
                done = parts.next();
                for (letter, part) in dead.iter_mut().filter(|d| d.stored.is_some()).zip(parts) {
                    letter.done = Some(part);
                }
            }
        }
        match (self.store_id, removed.is_empty()) {
            (Some(qid), false) => journal.remove(qid, &removed, done),
            _ => {
                if let Some(d) = done {
                    d(Ok(()));
                }
            }
        }
        let Some(owner) = self.env.owner.upgrade() else {
            // No vhost to republish through: remove as if dropped.
            for d in dead {
                if let (Some(qid), Some(id)) = (self.store_id, d.stored) {
                    journal.remove(qid, &[id], d.done);
                }
            }
            return;
        };
        if !dead.is_empty() {
            owner.dead_letter(self, dead, now, &fx.origin);
        }
        if fx.delete {
            owner.delete_queue(&self.name);
        }
    }
}
