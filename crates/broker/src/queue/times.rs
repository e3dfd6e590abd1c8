//! A restored queue's deadlines from the times its messages were stored
//! with (issue 42): a restart (or a failover, whose new leader opens its
//! own copy of the store as a restart does) puts messages back without
//! reading them, each with the queue's TTL from the restart as an upper
//! bound; the times at the head of each payload (`durable::times_of`) make
//! it exact, so a TTL keeps its original expiry.
//!
//! Invariants:
//! - Only the times are read (the first `TIMES_BYTES` of a payload), never
//!   a body, and only for entries at the head of the queue, where
//!   messages expire: a restart's cost stays with the messages, not their
//!   bytes, and the rest are read as they come to the head.
//! - A deadline only moves earlier than the upper bound it replaces (see
//!   `ready::timed_deadline`), so reading times late never keeps a message
//!   past the deadline it had.
//! - Every entry read leaves `Restored::Unread`, so it is read at most
//!   once: a message stored without times (by a berth before them) becomes
//!   `Untimed`, as does one whose head could not be read (its load reports
//!   why).

use std::sync::Arc;
use std::time::Instant;

use super::{Queue, QueueState};
use crate::durable::{times_of, StoredTimes, PAGING_BIT, TIMES_BYTES};
use crate::limits::RESTORED_TIMES_READ_MAX;
use crate::message::Message;
use crate::ready::{timed_deadline, Body, Deadline, RestoreClock, Restored};

impl Queue {
    /// Wall-clock time now, ms since the Unix epoch (the broker's clock):
    /// what a stored message's times are written and read with.
    pub(crate) fn unix_time_ms(&self) -> u64 {
        self.env.clock.unix_time_us() / 1000
    }

    /// The clocks a restored message's deadline is computed with now.
    fn restore_clock(&self, s: &QueueState, now: Instant) -> RestoreClock {
        s.pager.restore_clock(&self.queue_ref(), now)
    }

    /// Reads the stored times of the restored entries at the head whose
    /// deadlines are still upper bounds (at most
    /// [`RESTORED_TIMES_READ_MAX`] in one read), so the head expires when
    /// it is due. Nothing to do, and no read, once the head is settled.
    pub(super) fn settle_head_times(&self, s: &mut QueueState, now: Instant) {
        let Some(qid) = self.store_id else {
            return;
        };
        let Some(front) = s.ready.front() else {
            return;
        };
        if !matches!(
            front.body,
            Body::Paged {
                restored: Restored::Unread,
                ..
            }
        ) {
            return;
        }
        let level = s.ready.level_of(front);
        let ids: Vec<u64> = (s.ready.levels[level].iter())
            .take(RESTORED_TIMES_READ_MAX)
            .map_while(|e| match (&e.body, e.stored.get()) {
                (
                    Body::Paged {
                        restored: Restored::Unread,
                        ..
                    },
                    Some(id),
                ) if id & PAGING_BIT == 0 => Some(id),
                _ => None,
            })
            .collect();
        let heads = self.env.dur.journal().read_heads(qid, &ids, TIMES_BYTES);
        let clock = self.restore_clock(s, now);
        for (e, head) in s.ready.levels[level].iter_mut().zip(heads) {
            let times = head.ok().and_then(|h| times_of(&h));
            if let Body::Paged { restored, .. } = &mut e.body {
                match times {
                    Some(t) => {
                        e.expires_at = Deadline::new(timed_deadline(t, &clock));
                        *restored = Restored::No;
                    }
                    None => *restored = Restored::Untimed,
                }
            }
        }
    }

    /// Puts back a message recovered from the journal, already read
    /// (flagged redelivered: it may have been delivered before the
    /// restart). With the `times` it was stored with, its TTL and
    /// `expiration` count from when it was enqueued; without (stored by a
    /// berth before times), from `now`.
    pub fn restore(
        self: &Arc<Self>,
        msg: Arc<Message>,
        stored: u64,
        times: Option<StoredTimes>,
        now: Instant,
    ) {
        self.with_state(now, |q, s, _fx| {
            s.pager.restored_at.get_or_insert(now);
            q.push_new(s, msg, Some(stored), true, now);
            if let Some(t) = times {
                let at = timed_deadline(t, &q.restore_clock(s, now));
                let back = s.ready.levels.iter_mut().filter_map(|l| l.back_mut());
                // The entry just pushed: the newest seq of any level.
                if let Some(e) = back.max_by_key(|e| e.seq) {
                    e.expires_at = Deadline::new(at);
                }
            }
            q.page_out(s);
        });
    }
}
