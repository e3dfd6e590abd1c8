//! A vhost's delayed exchanges (`x-delayed-message`, docs/DELAYED.md):
//! holding a message that asks for a delay, and routing it, as the
//! exchange's `x-delayed-type` routes at that moment, once it is due.
//!
//! Invariants:
//! - A persistent message of a durable delayed exchange is stored (under
//!   the exchange's store id, in the same log groups as queues' messages)
//!   before it is held, and the publisher's confirm waits for that write.
//! - Its stored record is removed only after it was routed, and, when it
//!   reached durable queues, only once that copy is durable
//!   ([`crate::durable::Durability::defer_removal`]): a crash in between
//!   routes it again (at least once, never lost).
//! - Due messages are taken earliest first and at most
//!   [`DELAYED_ROUTED_PER_TURN_MAX`] per timer turn, so a burst coming due
//!   never stalls the timer tick for other work.
//! - A routed message has its `x-delay` negated (as the plugin does), so
//!   no delayed exchange holds it again on its way or later.
//! - A publish is never held in memory only past
//!   `limits.delayed_in_memory_per_exchange_max` for its exchange.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use berth_protocol::reply::PRECONDITION_FAILED;

use crate::delayed::{Delayed, DueKey, Held, WriteOutcome};
use crate::delayed_args::negated;
use crate::durable::{
    decode_delayed, encode_delayed, encode_message, split_done, Done, JournalError,
};
use crate::error::{AmqpError, AmqpResult};
use crate::events::Origin;
use crate::exchange::Exchange;
use crate::limits::{DELAYED_ROUTED_PER_TURN_MAX, DELAYED_UNWRITTEN_RETRY_MS};
use crate::message::Message;
use crate::routing::{self, PublishResult, Routed};
use crate::timers::TimerTarget;

use super::VHost;

/// Wakes a delayed exchange when its first message is due.
struct DueTimer {
    vhost: Weak<VHost>,
    exchange: Weak<Exchange>,
}

impl TimerTarget for DueTimer {
    fn on_timer(self: Arc<Self>, now: Instant) {
        if let (Some(v), Some(e)) = (self.vhost.upgrade(), self.exchange.upgrade()) {
            v.route_due(&e, now);
        }
    }
}

impl VHost {
    /// Makes `e` a delayed exchange whose stored messages are kept under
    /// `store_id` (a durable one), and arms its timer.
    pub(crate) fn delayed_exchange(&self, e: Exchange, store_id: Option<u64>) -> Arc<Exchange> {
        let e = Arc::new(e.with_delayed(Delayed::new(store_id)));
        let d = e.delayed.as_ref().expect("just made delayed");
        let timer = Arc::new(DueTimer {
            vhost: self.me.clone(),
            exchange: Arc::downgrade(&e),
        });
        d.set_due_target(timer, self.timers.new_slot());
        e
    }

    /// Now, in Unix milliseconds (due times survive restarts, so they are
    /// wall-clock times, read from the broker's clock).
    fn now_unix_ms(&self) -> u64 {
        self.clock.unix_time_us() / 1_000
    }

    /// Sets the exchange's timer for `due_unix_ms` (its one deadline).
    fn schedule_due(&self, d: &Delayed, due_unix_ms: u64) {
        let Some((target, slot)) = d.due_target() else {
            return;
        };
        let wait = Duration::from_millis(due_unix_ms.saturating_sub(self.now_unix_ms()));
        self.timers
            .schedule_slot(slot, self.clock.now() + wait, target);
    }

    /// Refuses (406) a publish that a delayed exchange on its way would
    /// hold in memory only when that exchange already holds
    /// `limits.delayed_in_memory_per_exchange_max` such messages.
    pub(crate) fn check_delayed_room(&self, routed: &Routed, msg: &Message) -> AmqpResult<()> {
        for (e, _) in &routed.holds {
            if let Some(why) = self.no_room_in_memory(e, msg) {
                return Err(AmqpError::new(PRECONDITION_FAILED, why));
            }
        }
        Ok(())
    }

    /// Why `ex` cannot hold `msg`: it would be held in memory only, and
    /// the exchange holds as many such messages as it may.
    fn no_room_in_memory(&self, ex: &Exchange, msg: &Message) -> Option<String> {
        let d = ex.delayed.as_ref()?;
        let stored = msg.persistent && d.store_id.is_some();
        let max = self.count_limits().delayed_in_memory_per_exchange_max;
        let held = d.memory_only();
        (!stored && held >= max).then(|| {
            format!(
                "delayed exchange '{}' in vhost '{}' holds {held} messages in memory only, its limit (limits.delayed_in_memory_per_exchange_max); publish them persistent (delivery_mode 2) to a durable delayed exchange, which keeps them on disk, or raise the limit",
                ex.name, self.name
            )
        })
    }

    /// Hands a routed message to the queues it reached and to the delayed
    /// exchanges that hold it. `durable` (if given) is called at most
    /// once, when some copy is journaled; its completion runs once every
    /// journaled copy is stored (the queues' record and each hold's).
    pub(crate) fn deliver_routed(
        &self,
        routed: Routed,
        msg: &Arc<Message>,
        now: Instant,
        durable: Option<&mut dyn FnMut() -> Done>,
        origin: &Origin,
    ) -> PublishResult {
        let Routed { queues, holds } = routed;
        if holds.is_empty() {
            return routing::deliver_to(&self.dur, &queues, msg, now, durable, origin);
        }
        let stored = |e: &Exchange| {
            msg.persistent && e.delayed.as_ref().is_some_and(|d| d.store_id.is_some())
        };
        let stored_holds = holds.iter().filter(|(e, _)| stored(e)).count();
        // deliver_to journals one record for the durable queues reached.
        let queue_write = queues.iter().any(|q| q.stores(msg));
        let writes = stored_holds + usize::from(queue_write);
        let had_durable = durable.is_some();
        let mut parts: Vec<Option<Done>> = match durable {
            Some(f) if writes > 0 => split_done(f(), writes).into_iter().map(Some).collect(),
            _ => (0..writes).map(|_| None).collect(),
        };
        let mut queue_part = if queue_write {
            parts.pop().flatten()
        } else {
            None
        };
        let mut give = || -> Done { queue_part.take().unwrap_or_else(|| Box::new(|_| {})) };
        let give: Option<&mut dyn FnMut() -> Done> = had_durable.then_some(&mut give);
        let mut r = routing::deliver_to(&self.dur, &queues, msg, now, give, origin);
        if let Some(unused) = queue_part.take() {
            unused(Ok(()));
        }
        for (e, ms) in holds {
            let done = if stored(&e) {
                parts.pop().flatten()
            } else {
                None
            };
            self.hold_delayed(&e, msg, ms, done);
        }
        r.delayed = true;
        r.durable = had_durable && writes > 0;
        r
    }

    /// Holds `msg` in delayed exchange `ex` for `delay_ms`. A persistent
    /// message of a durable delayed exchange is stored first; `done` then
    /// runs once it is (the publisher's confirm).
    fn hold_delayed(&self, ex: &Exchange, msg: &Arc<Message>, delay_ms: u64, done: Option<Done>) {
        let d = ex.delayed.as_ref().expect("called for delayed exchanges");
        if let Some(why) = self.no_room_in_memory(ex, msg) {
            // A publish was refused before this (check_delayed_room); a
            // dead letter has no one to tell.
            tracing::warn!(vhost = %self.name, exchange = %ex.name, reason = %why, "a delayed message was dropped");
            return;
        }
        let due = self.now_unix_ms().saturating_add(delay_ms);
        let key: DueKey = (due, self.dur.new_message_id());
        let resident = |stored| Held::Resident {
            msg: Arc::clone(msg),
            stored,
        };
        let timer = match d.store_id.filter(|_| msg.persistent) {
            None => d.hold(key, resident(false)),
            Some(sid) => {
                match encode_message(&msg.exchange, &msg.routing_key, &msg.properties, &msg.body) {
                    Ok(payload) => {
                        let written = Arc::downgrade(d);
                        let pages = self.journal().pages();
                        let done: Done = Box::new(move |res: Result<(), JournalError>| {
                            if let Some(d) = written.upgrade() {
                                let outcome = match res {
                                    Ok(()) => WriteOutcome::Stored { pages },
                                    Err(_) => WriteOutcome::Failed,
                                };
                                d.note_written(key, outcome);
                            }
                            if let Some(done) = done {
                                done(res);
                            }
                        });
                        // Held first: the completion must find it.
                        let timer = d.hold(key, resident(true));
                        let payload = encode_delayed(due, &payload);
                        self.journal().publish(key.1, &[sid], payload, Some(done));
                        timer
                    }
                    // Entrances refuse such names (`name_rules.rs`); should one
                    // get through, it is nacked, so it is not held either.
                    Err(e) => {
                        if let Some(done) = done {
                            done(Err(JournalError::new(e.to_string())));
                        }
                        None
                    }
                }
            }
        };
        if let Some(at) = timer {
            self.schedule_due(d, at);
        }
    }

    /// Routes what of `ex`'s held messages is due, then sets the timer for
    /// the next.
    pub(crate) fn route_due(&self, ex: &Arc<Exchange>, now: Instant) {
        let Some(d) = ex.delayed.as_ref() else {
            return;
        };
        let live = (self.exchanges.read().get(&ex.name)).is_some_and(|e| Arc::ptr_eq(e, ex));
        if !live {
            return;
        }
        let now_ms = self.now_unix_ms();
        for (key, held) in d.take_due(now_ms, DELAYED_ROUTED_PER_TURN_MAX) {
            self.route_one(ex, d, key, held, now);
            d.note_routed(now_ms.saturating_sub(key.0));
        }
        if let Some(at) = d.rearm() {
            self.schedule_due(d, at);
        }
    }

    /// Routes one due message through `ex` as its `x-delayed-type` routes,
    /// then removes its stored record (after the routed copy is durable).
    fn route_one(&self, ex: &Arc<Exchange>, d: &Delayed, key: DueKey, held: Held, now: Instant) {
        let (msg, stored) = match held {
            Held::Resident { msg, stored } => (msg, stored),
            Held::OnDisk => match self.read_delayed(d, key.1) {
                Ok(m) => (m, true),
                Err(_) if self.not_yet_written(d, key.1) => {
                    // Committed, not yet in this member's store: soon.
                    let again = (self.now_unix_ms() + DELAYED_UNWRITTEN_RETRY_MS, key.1);
                    if let Some(at) = d.hold(again, Held::OnDisk) {
                        self.schedule_due(d, at);
                    }
                    return;
                }
                Err(why) => {
                    // Left in the store: a restart tries again.
                    tracing::error!(vhost = %self.name, exchange = %ex.name, msg = key.1, error = %why, "a due delayed message could not be read; it stays stored");
                    return;
                }
            },
        };
        let sid = d.store_id.filter(|_| stored);
        // Its `x-delay` negated, no delayed exchange holds it again: not
        // one on its way now, nor a delayed dead-letter exchange later.
        let msg = match negated(&msg) {
            Ok(m) => m,
            Err(why) => {
                tracing::warn!(vhost = %self.name, exchange = %ex.name, error = %why.text, "x-delay not negated");
                msg
            }
        };
        let routed = routing::resolve(self, Some(Arc::clone(ex)), &msg, false);
        let mut journaled = false;
        let mut removal = || -> Done {
            journaled = true;
            match sid {
                Some(sid) => self.dur.defer_removal(sid, key.1, None),
                None => Box::new(|_| {}),
            }
        };
        let origin = Origin::default();
        self.deliver_routed(routed, &msg, now, Some(&mut removal), &origin);
        if let (Some(sid), false) = (sid, journaled) {
            self.journal().remove(sid, &[key.1], None);
        }
    }

    /// Whether stored delayed message `id` is not written in the journal
    /// yet although its write completed: a cluster's completion is the
    /// commit on a majority, and this member's store writes the record
    /// when it applies the entry. (On one node a completed write is
    /// written: this never holds there.)
    fn not_yet_written(&self, d: &Delayed, id: u64) -> bool {
        let journal = self.journal();
        journal.pages()
            && d.store_id
                .is_some_and(|sid| journal.written(sid, &[id]).first() == Some(&false))
    }

    /// A stored delayed message read back from the journal.
    fn read_delayed(&self, d: &Delayed, id: u64) -> Result<Arc<Message>, String> {
        let sid = d.store_id.ok_or("not stored")?;
        let payload = self.journal().read(sid, id).map_err(|e| e.to_string())?;
        let (_, msg) = decode_delayed(&payload).ok_or("stored payload has no due time")?;
        Message::from_stored(&msg)
    }

    /// A delayed exchange's stored messages put back after a restart:
    /// (due time, journal id) each; their bodies stay on disk.
    pub(crate) fn restore_delayed(&self, ex: &Exchange, stored: Vec<DueKey>) {
        let Some(d) = ex.delayed.as_ref() else {
            return;
        };
        if let Some(at) = d.hold_on_disk(stored) {
            self.schedule_due(d, at);
        }
    }

    /// A deleted delayed exchange's pending messages go (docs/DELAYED.md):
    /// its stored records are purged, the count logged.
    pub(super) fn discard_delayed(&self, ex: &Exchange) {
        let Some(d) = ex.delayed.as_ref() else {
            return;
        };
        let n = d.discard_all();
        if let Some(sid) = d.store_id {
            self.journal().purge(sid, None);
        }
        if n > 0 {
            tracing::info!(vhost = %self.name, exchange = %ex.name, messages = n, "deleted a delayed exchange; its pending messages were discarded");
        }
    }
}
