//! How a message leaves a queue for good: expired at the head, dropped,
//! or dead-lettered, with its removal journaled.
//!
//! Invariants:
//! - A stored message that is dead-lettered leaves the journal only once
//!   its copy is durable; paging copies are never waited for.
//! - A paged-out entry is read back only if it is to be dead-lettered.

use std::time::Instant;

use super::{Effects, Queue, QueueState};
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::durable::PAGING_BIT;
use crate::events;
use crate::ready::{Body, Entry, QueuedMessage};

impl Queue {
    /// Drops expired messages at the head, dead-lettering them.
    pub(super) fn expire_head(&self, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        self.drop_expired(s, now, false, fx);
    }

    /// Drops messages at the head that expired before `now` (or at it, with
    /// `including_now`: a TTL of 0 means "deliver now or never").
    pub(super) fn drop_expired(
        &self,
        s: &mut QueueState,
        now: Instant,
        including_now: bool,
        fx: &mut Effects,
    ) {
        loop {
            self.settle_head_times(s, now);
            let Some(m) = s.ready.front() else {
                break;
            };
            match m.expires_at.get() {
                Some(t) if t < now || (including_now && t == now) => {
                    let e = s.ready.pop_front().expect("front exists");
                    self.drop_entry(s, e, Some(DeathReason::Expired), now, fx);
                }
                _ => break,
            }
        }
    }

    /// A message leaves the queue for good: its removal is journaled if it
    /// was stored, and it is dead-lettered if a reason is given and the
    /// queue has a dead-letter exchange.
    pub(super) fn drop_message(
        &self,
        m: QueuedMessage,
        reason: Option<DeathReason>,
        fx: &mut Effects,
    ) {
        let dead_letter = reason.filter(|_| self.args().dead_letter_exchange.is_some());
        let (ev, who) = (self.env.dur.events(), self.event_name());
        let dl = dead_letter.is_some();
        let msg = (m.msg.id, m.msg.body_bytes());
        events::left(ev, who, reason, dl, msg, &fx.origin);
        // A stored message that is dead-lettered leaves the journal only
        // once its copy is durable; paging copies are never waited for.
        let durable_id = m.stored.filter(|id| id & PAGING_BIT == 0);
        let (stored, removed_now) = match (dead_letter, durable_id) {
            (Some(_), Some(id)) => (Some(id), None),
            _ => (None, m.stored),
        };
        fx.removed.extend(removed_now);
        if let Some(reason) = dead_letter {
            fx.dead.push(DeadLetter {
                msg: m.msg,
                reason,
                stored,
                done: None,
            });
        }
    }

    /// [`Queue::drop_message`] for a ready entry: its body is read back
    /// only if it is to be dead-lettered.
    pub(super) fn drop_entry(
        &self,
        s: &mut QueueState,
        e: Entry,
        reason: Option<DeathReason>,
        now: Instant,
        fx: &mut Effects,
    ) {
        let dead_letter = reason.is_some() && self.args().dead_letter_exchange.is_some();
        if dead_letter || matches!(e.body, Body::Resident(_)) {
            if let Some(m) = self.load(s, e, now, fx) {
                self.drop_message(m, reason, fx);
            }
        } else if let Some(id) = e.stored.get() {
            fx.removed.push(id);
            let size = e.bytes();
            events::left(
                self.env.dur.events(),
                self.event_name(),
                reason,
                false,
                (0, size),
                &fx.origin,
            );
        }
    }
}
