//! A queue's ready messages: compact entries whose bodies are in memory or
//! only in the journal, one FIFO per priority level.
//!
//! Invariants:
//! - `Ready::len`, `bytes`, `resident` and `resident_bytes` always equal what the levels
//!   hold: every entry goes in and out through `count_in`/`count_out`.
//! - Within a level, entries are in publish order (`seq` ascending), except
//!   a message handed back at the head by a consumer that refused it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::durable::StoredTimes;
use crate::message::Message;

mod compact;
pub(crate) use compact::{Deadline, StoredId};

/// A message in a queue: the shared message plus this queue's bookkeeping.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub msg: Arc<Message>,
    /// Position in publish order, for requeueing to the original place.
    pub seq: u64,
    /// Times it came back unacknowledged (nack/reject with requeue, channel
    /// closed); drives `redelivered` and `x-delivery-limit`.
    pub returns: u32,
    /// Delivered at least once before.
    pub redelivered: bool,
    /// When it expires (queue TTL or per-message expiration).
    pub expires_at: Option<Instant>,
    /// Its id in the journal, if it is stored there (persistent message in
    /// a durable queue); its removal must then be journaled too.
    pub stored: Option<u64>,
}

/// What a ready entry holds of its message.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Resident(Arc<Message>),
    /// Only in the journal (under the entry's `stored` id): read back when
    /// it is delivered, fetched or dead-lettered.
    Paged {
        /// Body bytes (for restored messages: the stored payload's length).
        bytes: u32,
        priority: u8,
        /// Restored at startup without being read: what is known of its
        /// times (see [`Restored`]).
        restored: Restored,
    },
}

/// What a paged entry restored at startup says of when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restored {
    /// Not restored, or its stored times were read: its deadline is exact.
    No,
    /// Put back without being read: its deadline is an upper bound (the
    /// queue's TTL from the restart) until the times stored at the head of
    /// its payload are read (`Queue::settle_head_times`, or its load).
    Unread,
    /// Stored without times (by a berth before them): its own
    /// `expiration` counts from the restart, checked when it is read, and
    /// the queue's TTL from the restart stands.
    Untimed,
}

/// A ready message: its body (in memory or only in the journal) and this
/// queue's bookkeeping. Kept small: a deep queue holds millions of these
/// (48 bytes; the optional fields in their 8-byte forms).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) body: Body,
    pub(crate) seq: u64,
    pub(crate) returns: u32,
    pub(crate) redelivered: bool,
    pub(crate) expires_at: Deadline,
    pub(crate) stored: StoredId,
}

impl Entry {
    pub(crate) fn resident(m: QueuedMessage) -> Self {
        Self {
            body: Body::Resident(m.msg),
            seq: m.seq,
            returns: m.returns,
            redelivered: m.redelivered,
            expires_at: Deadline::new(m.expires_at),
            stored: StoredId::new(m.stored),
        }
    }

    pub(crate) fn priority(&self) -> u8 {
        match &self.body {
            Body::Resident(m) => m.priority,
            Body::Paged { priority, .. } => *priority,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        match &self.body {
            Body::Resident(m) => m.body_bytes(),
            Body::Paged { bytes, .. } => u64::from(*bytes),
        }
    }

    pub(crate) fn with_message(self, msg: Arc<Message>) -> QueuedMessage {
        QueuedMessage {
            msg,
            seq: self.seq,
            returns: self.returns,
            redelivered: self.redelivered,
            expires_at: self.expires_at.get(),
            stored: self.stored.get(),
        }
    }
}

/// The clocks a restored message's deadline is computed with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestoreClock {
    /// Monotonic now, and the wall clock's reading of it (ms since the
    /// Unix epoch).
    pub(crate) now: Instant,
    pub(crate) now_unix_ms: u64,
    /// When the queue's messages were put back (no deadline is set further
    /// than a whole TTL from it).
    pub(crate) restored_at: Instant,
    /// The queue's message TTL in force.
    pub(crate) ttl_ms: Option<u64>,
}

/// A restored message's deadline from the times stored with it (issue
/// 42): the queue's TTL and its own `expiration` each count from when it
/// was enqueued, as they did before the restart or failover. Wall-clock
/// times cross the restart, so a wall clock set back in between could
/// stretch a life; each deadline is therefore capped at a whole TTL from
/// the restart: a message never lives longer than its TTL by more than
/// the step back (nor, as before times, by more than the time it spent
/// before the restart). A clock set forward shortens it by the step.
pub(crate) fn timed_deadline(t: StoredTimes, c: &RestoreClock) -> Option<Instant> {
    let due = |ms: u64| {
        let at_ms = t.enqueued_unix_ms.saturating_add(ms);
        match at_ms.checked_sub(c.now_unix_ms) {
            Some(left) => {
                (c.now + Duration::from_millis(left)).min(c.restored_at + Duration::from_millis(ms))
            }
            // Due while berth was down: already past, so it expires at
            // once (a deadline equal to now would wait for the next tick).
            None => {
                let late = Duration::from_millis(c.now_unix_ms - at_ms);
                c.now.checked_sub(late).unwrap_or(c.now)
            }
        }
    };
    [c.ttl_ms, t.expiration_ms]
        .into_iter()
        .flatten()
        .map(due)
        .min()
}

/// A restored message's expiry: its `expiration` counts from the restart
/// (the earlier of that and `current`, the queue TTL's deadline). For a
/// message stored without times; see [`timed_deadline`].
pub(crate) fn restored_expiry(
    current: Option<Instant>,
    msg: &Message,
    restored_at: Option<Instant>,
) -> Option<Instant> {
    let own = msg
        .expiration_ms
        .zip(restored_at)
        .map(|(ms, at)| at + Duration::from_millis(ms));
    match (current, own) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Ready messages, one FIFO per priority level (one level without
/// `x-max-priority`).
pub(crate) struct Ready {
    pub(crate) levels: Vec<VecDeque<Entry>>,
    pub(crate) len: usize,
    pub(crate) bytes: u64,
    /// Entries whose body is in memory.
    pub(crate) resident: usize,
    /// Their body bytes.
    pub(crate) resident_bytes: u64,
}

impl Ready {
    pub(crate) fn new(max_priority: Option<u8>) -> Self {
        let n = max_priority.map_or(1, |p| usize::from(p) + 1);
        Self {
            levels: (0..n).map(|_| VecDeque::new()).collect(),
            len: 0,
            bytes: 0,
            resident: 0,
            resident_bytes: 0,
        }
    }

    pub(crate) fn level_of(&self, e: &Entry) -> usize {
        usize::from(e.priority()).min(self.levels.len() - 1)
    }

    fn count_in(&mut self, e: &Entry) {
        self.len += 1;
        self.bytes += e.bytes();
        if matches!(e.body, Body::Resident(_)) {
            self.resident += 1;
            self.resident_bytes += e.bytes();
        }
    }

    fn count_out(&mut self, e: &Entry) {
        self.len -= 1;
        self.bytes -= e.bytes();
        if matches!(e.body, Body::Resident(_)) {
            self.resident -= 1;
            self.resident_bytes -= e.bytes();
        }
    }

    /// Room for `n` more entries of priority level `level`.
    pub(crate) fn reserve(&mut self, level: usize, n: usize) {
        let l = level.min(self.levels.len() - 1);
        self.levels[l].reserve(n);
    }

    pub(crate) fn push_back(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        self.levels[l].push_back(e);
    }

    /// Puts a message back at its publish-order position.
    pub(crate) fn insert_by_seq(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        let q = &mut self.levels[l];
        let at = q.partition_point(|x| x.seq < e.seq);
        q.insert(at, e);
    }

    pub(crate) fn push_front(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        self.levels[l].push_front(e);
    }

    pub(crate) fn front(&self) -> Option<&Entry> {
        self.levels.iter().rev().find_map(|q| q.front())
    }

    pub(crate) fn pop_front(&mut self) -> Option<Entry> {
        let e = self.levels.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.count_out(&e);
        Some(e)
    }

    /// Replaces the body of the entry at (`level`, `index`), keeping the
    /// resident count true.
    pub(crate) fn set_body(&mut self, level: usize, index: usize, body: Body) {
        let e = &mut self.levels[level][index];
        let was = matches!(e.body, Body::Resident(_));
        let is = matches!(body, Body::Resident(_));
        e.body = body;
        let bytes = e.bytes();
        match (was, is) {
            (false, true) => {
                self.resident += 1;
                self.resident_bytes += bytes;
            }
            (true, false) => {
                self.resident -= 1;
                self.resident_bytes -= bytes;
            }
            _ => {}
        }
    }

    /// Takes out, in order, every entry for which `f` (which may change
    /// it) says yes: one pass over the queue, in place (a deep queue is
    /// not copied to take a few out).
    pub(crate) fn take_where(&mut self, mut f: impl FnMut(&mut Entry) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        for level in &mut self.levels {
            level.retain_mut(|e| {
                let take = f(e);
                if take {
                    out.push(e.clone());
                }
                !take
            });
        }
        for e in &out {
            self.count_out(e);
        }
        out
    }

    pub(crate) fn drain(&mut self) -> Vec<Entry> {
        self.len = 0;
        self.bytes = 0;
        self.resident = 0;
        self.resident_bytes = 0;
        self.levels.iter_mut().flat_map(|q| q.drain(..)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_entry_stays_compact() {
        // A deep queue holds millions of these, and a restart writes each
        // into fresh memory: keep them within 48 bytes.
        assert!(
            std::mem::size_of::<Entry>() <= 48,
            "Entry is {} bytes",
            std::mem::size_of::<Entry>()
        );
    }

    /// Issue 42: a restored message's deadline from its stored times, in
    /// every case the wall clock can put it (docs/DURABILITY.md).
    #[test]
    fn a_restored_deadline_counts_from_the_enqueue_and_never_past_a_ttl_from_the_restart() {
        let now = Instant::now() + Duration::from_secs(3_600);
        let ms = Duration::from_millis;
        let clock = |now_unix_ms, ttl_ms| RestoreClock {
            now,
            now_unix_ms,
            restored_at: now,
            ttl_ms,
        };
        let times = |enqueued_unix_ms, expiration_ms| StoredTimes {
            enqueued_unix_ms,
            expiration_ms,
        };
        let t0 = 1_700_000_000_000;
        // Enqueued 2 s before now, TTL 3 s: 1 s left.
        assert_eq!(
            timed_deadline(times(t0, None), &clock(t0 + 2_000, Some(3_000))),
            Some(now + ms(1_000))
        );
        // The shorter of the queue's TTL and its own expiration.
        assert_eq!(
            timed_deadline(times(t0, Some(2_500)), &clock(t0 + 2_000, Some(3_000))),
            Some(now + ms(500))
        );
        assert_eq!(
            timed_deadline(times(t0, Some(2_500)), &clock(t0 + 2_000, None)),
            Some(now + ms(500))
        );
        // Neither: no deadline.
        assert_eq!(
            timed_deadline(times(t0, None), &clock(t0 + 2_000, None)),
            None
        );
        // Due while down, 4 s ago: already past (expires at start).
        assert_eq!(
            timed_deadline(times(t0, None), &clock(t0 + 5_000, Some(1_000))),
            Some(now - ms(4_000))
        );
        // The wall clock was set back an hour: capped a TTL from the restart.
        assert_eq!(
            timed_deadline(times(t0, None), &clock(t0 - 3_600_000, Some(3_000))),
            Some(now + ms(3_000))
        );
        // Set forward an hour: expires at once (earlier by the step).
        assert!(
            timed_deadline(times(t0, None), &clock(t0 + 3_600_000, Some(3_000))).unwrap() < now
        );
    }
}
