//! A queue's messages between memory and the journal: new ones appended
//! in memory, paged out past the resident window, read back (with the
//! delivery limit and the retry count applied) when their turn comes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{retry, Effects, Queue, QueueState};
use crate::dead_letter::DeathReason;
use crate::message::Message;
use crate::paging::{Loaded, QueueRef};
use crate::ready::{Body, Deadline, Entry, QueuedMessage, StoredId};

impl Queue {
    pub(super) fn queue_ref(&self) -> QueueRef<'_> {
        QueueRef {
            name: &self.name,
            vhost: &self.vhost_name,
            store_id: self.store_id,
            ttl_ms: self.args().message_ttl_ms,
            now_unix_ms: self.unix_time_ms(),
        }
    }

    /// The entry with its message in memory (see [`Pager::load`]). `None`
    /// if it expired meanwhile (then it was dropped) or cannot be read
    /// (then it stays in the journal, and is logged: a restart brings it
    /// back).
    pub(super) fn load(
        &self,
        s: &mut QueueState,
        e: Entry,
        now: Instant,
        fx: &mut Effects,
    ) -> Option<QueuedMessage> {
        match s
            .pager
            .load(&mut s.ready, e, &self.queue_ref(), &self.env.dur, now)
        {
            Loaded::Ready(mut m) => {
                if self.over_limit(m.returns) {
                    self.drop_message(m, Some(DeathReason::DeliveryLimit), fx);
                    return None;
                }
                if self.args().delayed_retry.min_ms.is_some() || self.is_quorum() {
                    m.msg = retry::with_count(m.msg, m.returns);
                }
                Some(m)
            }
            Loaded::Expired(m) => {
                self.drop_message(m, Some(DeathReason::Expired), fx);
                None
            }
            Loaded::Unreadable => None,
        }
    }

    pub(super) fn page_out(&self, s: &mut QueueState) {
        s.pager.page_out(&mut s.ready, self.store_id, &self.env.dur);
    }

    /// Appends a message that is new to this queue (published, or
    /// restored after a restart); returns its position in publish order.
    /// It expires after the shorter of the queue's TTL and its own
    /// `expiration`, counted from `now`.
    pub(super) fn push_new(
        &self,
        s: &mut QueueState,
        msg: Arc<Message>,
        stored: Option<u64>,
        redelivered: bool,
        now: Instant,
    ) -> u64 {
        let ttl = match (self.args().message_ttl_ms, msg.expiration_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let seq = s.next_seq;
        s.next_seq += 1;
        s.ready.push_back(Entry {
            body: Body::Resident(msg),
            seq,
            returns: 0,
            redelivered,
            expires_at: Deadline::new(ttl.map(|ms| now + Duration::from_millis(ms))),
            stored: StoredId::new(stored),
        });
        seq
    }
}
