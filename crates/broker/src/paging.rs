//! Paging: moving a queue's message bodies out of memory once they are
//! written to the journal, and reading them back (with read-ahead) when the
//! queue needs them.
//!
//! Invariants:
//! - A body leaves memory only once the journal says it is written, so it
//!   can always be read back.
//! - A message of a durable queue is read from its durable id, any other
//!   from the queue's paging id (ids with [`PAGING_BIT`]); paging copies are
//!   never waited for and never recovered.
//! - A scan looks only at entries newer than the last scan (plus those not
//!   yet written then), so its cost is proportional to what was published.

use std::sync::Arc;
use std::time::Instant;

use crate::durable::{
    times_of, Durability, JournalError, MessageHead, MessageParts, StoredTimes, PAGING_BIT,
};
use crate::limits::{READ_AHEAD_BYTES_MAX, READ_AHEAD_MESSAGES};
use crate::message::Message;
use crate::ready::{
    restored_expiry, timed_deadline, Body, Deadline, Entry, QueuedMessage, Ready, RestoreClock,
    Restored, StoredId,
};

/// A queue's paging bookkeeping.
#[derive(Default)]
pub(crate) struct Pager {
    /// Entries with `seq` up to this were already considered for paging.
    pub page_mark: u64,
    /// Journal queue id (with [`PAGING_BIT`]) under which paging copies of
    /// this queue's messages are written; allocated on first use.
    pub paging_id: Option<u64>,
    /// When messages were restored from the journal (the deadlines of
    /// those stored with times are capped a TTL from here; the
    /// `expiration` of those stored without counts from here).
    pub restored_at: Option<Instant>,
}

/// What [`Pager::load`] found.
pub(crate) enum Loaded {
    /// The message, in memory.
    Ready(QueuedMessage),
    /// A restored message whose `expiration` passed while it was on disk:
    /// it must be dropped (and may be dead-lettered).
    Expired(QueuedMessage),
    /// It could not be read; it stays in the journal (logged) and returns
    /// after a restart.
    Unreadable,
}

/// Which queue, for log lines.
pub(crate) struct QueueRef<'a> {
    pub name: &'a str,
    pub vhost: &'a str,
    /// Its durable journal id, if it is durable.
    pub store_id: Option<u64>,
    /// Its message TTL in force, and the wall clock now (ms since the
    /// Unix epoch): what a restored message's stored times are read with.
    pub ttl_ms: Option<u64>,
    pub now_unix_ms: u64,
}

/// A stored message read back, and the times stored with it.
type Decoded = (Arc<Message>, Option<StoredTimes>);

fn decode(r: Option<Result<bytes::Bytes, JournalError>>) -> Result<Decoded, String> {
    r.unwrap_or_else(|| Err(JournalError::new("the journal returned no result")))
        .map_err(|err| err.to_string())
        .and_then(|p| Ok((Message::from_stored(&p)?, times_of(&p))))
}

impl Pager {
    /// A restored entry's deadline once its message was read: from its
    /// stored times when it has them, else (stored by a berth before
    /// times) its `expiration` from the restart and `current` (the
    /// queue's TTL from the restart).
    pub fn restored_deadline(
        &self,
        current: Option<Instant>,
        (msg, times): &Decoded,
        q: &QueueRef<'_>,
        now: Instant,
    ) -> Option<Instant> {
        match times {
            Some(t) => timed_deadline(*t, &self.restore_clock(q, now)),
            None => restored_expiry(current, msg, self.restored_at),
        }
    }

    /// The clocks restored messages' deadlines are computed with now.
    pub fn restore_clock(&self, q: &QueueRef<'_>, now: Instant) -> RestoreClock {
        RestoreClock {
            now,
            now_unix_ms: q.now_unix_ms,
            restored_at: self.restored_at.unwrap_or(now),
            ttl_ms: q.ttl_ms,
        }
    }
}

impl Pager {
    /// The entry with its message in memory, read back from the journal if
    /// it was paged out (with read-ahead: the paged entries right behind it
    /// are read in the same call and become resident).
    pub fn load(
        &self,
        ready: &mut Ready,
        e: Entry,
        q: &QueueRef<'_>,
        dur: &Durability,
        now: Instant,
    ) -> Loaded {
        let restored = match e.body {
            Body::Resident(ref m) => {
                let m = Arc::clone(m);
                return Loaded::Ready(e.with_message(m));
            }
            Body::Paged { restored, .. } => restored != Restored::No,
        };
        // A paging copy is read from the queue's paging id, a stored
        // message from its durable id; read-ahead takes neighbours of the
        // same kind.
        let kind = e.stored.get().map(|id| id & PAGING_BIT);
        let qid = match kind {
            Some(0) => q.store_id,
            _ => self.paging_id,
        };
        let (Some(qid), Some(id)) = (qid, e.stored.get()) else {
            tracing::error!(queue = %q.name, "a paged-out message has no journal id; dropped from memory");
            return Loaded::Unreadable;
        };
        let level = ready.level_of(&e);
        let mut ahead_bytes = e.bytes();
        let ahead = ready.levels[level]
            .iter()
            .take(READ_AHEAD_MESSAGES - 1)
            .map_while(|x| match (&x.body, x.stored.get()) {
                (Body::Paged { .. }, Some(id)) if Some(id & PAGING_BIT) == kind => {
                    ahead_bytes += x.bytes();
                    (ahead_bytes <= READ_AHEAD_BYTES_MAX).then_some(id)
                }
                _ => None,
            });
        let ids: Vec<u64> = std::iter::once(id)
            .chain(ahead)
            .map(|id| id & !PAGING_BIT)
            .collect();
        let mut read = dur.journal().read_many(qid, &ids).into_iter();
        let first = decode(read.next());
        // The read-ahead entries become resident; one that fails stays
        // paged and reports its error when its turn comes.
        let results: Vec<_> = read.collect();
        for (i, r) in results.into_iter().enumerate() {
            let Ok(read) = decode(Some(r)) else {
                continue;
            };
            let x = &mut ready.levels[level][i];
            if let Body::Paged { restored, .. } = x.body {
                if restored != Restored::No {
                    let at = self.restored_deadline(x.expires_at.get(), &read, q, now);
                    x.expires_at = Deadline::new(at);
                }
            }
            ready.set_body(level, i, Body::Resident(read.0));
        }
        let read = match first {
            Ok(m) => m,
            Err(why) => {
                tracing::error!(queue = %q.name, vhost = %q.vhost, msg = id, "stored message cannot be read back ({why}); it stays in the journal and returns after a restart");
                return Loaded::Unreadable;
            }
        };
        let current = e.expires_at.get();
        let mut m = e.with_message(Arc::clone(&read.0));
        if restored {
            m.expires_at = self.restored_deadline(current, &read, q, now);
            if m.expires_at.is_some_and(|t| t <= now) {
                return Loaded::Expired(m);
            }
        }
        Loaded::Ready(m)
    }

    /// Moves bodies beyond the resident window (the first
    /// `store.queue_resident_messages_max` of each level, fewer where their
    /// bytes pass `store.queue_resident_bytes_max`) out of memory; they are
    /// read back when needed. A stored message (persistent, durable queue)
    /// leaves once the journal has written it. Any other message is first
    /// written as a paging copy (under the queue's paging id, not waited
    /// for, never recovered) and leaves on a later scan, once written.
    pub fn page_out(&mut self, ready: &mut Ready, store_id: Option<u64>, dur: &Durability) {
        let (count_max, bytes_max) = (dur.resident_messages_max(), dur.resident_bytes_max());
        let within = ready.resident <= count_max && ready.resident_bytes <= bytes_max;
        if within || !dur.journal().pages() {
            return;
        }
        let mark = self.page_mark;
        // (level, index, journal id); a paging copy's id carries PAGING_BIT.
        let mut candidates: Vec<(usize, usize, u64)> = Vec::new();
        let mut to_copy: Vec<(usize, usize)> = Vec::new();
        let mut newest = mark;
        for (l, level) in ready.levels.iter().enumerate() {
            let window = window(level, count_max, bytes_max);
            for (i, e) in level.iter().enumerate().rev() {
                if i < window || e.seq <= mark {
                    break;
                }
                newest = newest.max(e.seq);
                match (&e.body, e.stored.get()) {
                    (Body::Resident(_), Some(id)) => candidates.push((l, i, id)),
                    (Body::Resident(_), None) => to_copy.push((l, i)),
                    (Body::Paged { .. }, _) => {}
                }
            }
        }
        if !to_copy.is_empty() {
            let pid = *self.paging_id.get_or_insert_with(|| dur.new_paging_id());
            for (l, i) in to_copy {
                let e = &mut ready.levels[l][i];
                let Body::Resident(m) = &e.body else {
                    continue;
                };
                // A name no entrance lets through: the body stays resident.
                let Ok(head) = MessageHead::new(&m.exchange, &m.routing_key, m.properties.len())
                else {
                    continue;
                };
                let id = dur.new_message_id();
                let payload = MessageParts {
                    head: head.as_bytes(),
                    properties: &m.properties,
                    body: &m.body,
                };
                dur.journal().publish_message(id, &[pid], payload, None);
                e.stored = StoredId::new(Some(id | PAGING_BIT));
                candidates.push((l, i, id | PAGING_BIT));
            }
        }
        if candidates.is_empty() {
            self.page_mark = newest;
            return;
        }
        let mut written = vec![false; candidates.len()];
        for (qid, bit) in [(store_id, 0), (self.paging_id, PAGING_BIT)] {
            let Some(qid) = qid else {
                continue;
            };
            let (at, ids): (Vec<usize>, Vec<u64>) = candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.2 & PAGING_BIT == bit)
                .map(|(k, c)| (k, c.2 & !PAGING_BIT))
                .unzip();
            if ids.is_empty() {
                continue;
            }
            for (k, ok) in at.into_iter().zip(dur.journal().written(qid, &ids)) {
                written[k] = ok;
            }
        }
        let mut oldest_unwritten: Option<u64> = None;
        for ((l, i, _), ok) in candidates.into_iter().zip(written) {
            let e = &ready.levels[l][i];
            if !ok {
                oldest_unwritten = Some(oldest_unwritten.map_or(e.seq, |o| o.min(e.seq)));
                continue;
            }
            let Body::Resident(m) = &e.body else {
                continue;
            };
            let paged = Body::Paged {
                bytes: u32::try_from(m.body_bytes()).unwrap_or(u32::MAX),
                priority: m.priority,
                restored: Restored::No,
            };
            ready.set_body(l, i, paged);
        }
        self.page_mark = match oldest_unwritten {
            Some(seq) => seq.saturating_sub(1).max(mark),
            None => newest,
        };
    }
}

/// How many entries at the head of `level` keep their bodies: at most
/// `count_max`, and no more than fit in `bytes_max` (at least one, so the
/// next delivery never waits for a read). Looks at no more than that many.
fn window(level: &std::collections::VecDeque<Entry>, count_max: usize, bytes_max: u64) -> usize {
    let mut bytes = 0u64;
    for (i, e) in level.iter().take(count_max).enumerate() {
        if let Body::Resident(m) = &e.body {
            bytes += m.body_bytes();
        }
        if bytes > bytes_max {
            return i.max(1);
        }
    }
    count_max.min(level.len())
}
