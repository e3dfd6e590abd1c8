//! Delayed retry (`x-delayed-retry-*`, docs/DELAYED.md): a message
//! rejected or nacked with `requeue=true` by a queue that enables it waits
//! its backoff here, counted but not deliverable, before it is ready
//! again in its place; past the delivery limit it is dead-lettered
//! (reason `delivery_limit`) or dropped instead.
//!
//! Invariants:
//! - A waiting message is in exactly one of the queue's places: here, not
//!   in `ready` and not unacked; no consumer's prefetch is taken by it.
//! - Waiting messages come back earliest due first, found without scanning
//!   (ordered by (due, seq)); each goes back to its place in publish order.
//! - The backoff depends only on the arguments and the count of returns,
//!   read against the broker's clock (so tests drive it by hand).
//! - Where delayed retry is on, the broker owns `x-delivery-count`: a
//!   delivered message carries its count of returns there, or none before
//!   its first; a client's own value is never delivered.
//! - A stored message of a durable queue that was returned has one retry
//!   mark in the journal (`durable/retry_mark.rs`: its count and when its
//!   wait ends) from its return until it leaves the queue, listed in
//!   `Retrying::marks`; a restart gives it back its count and the rest of
//!   its wait. Such a message waits with its body on disk once its record
//!   is written (paged, as the pager pages ready messages), so a deep
//!   waiting set does not hold its bodies in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_protocol::{AMQPValue, FieldTable};

use super::{Effects, Queue, QueueState, QueuedMessage};
use crate::args::{QueueArgs, RetryArgs};
use crate::durable::{encode_retry_mark, RetryMark, PAGING_BIT};
use crate::limits::DELAYED_RETRY_DELIVERY_LIMIT_DEFAULT;
use crate::message::Message;
use crate::ready::{Body, Entry};

/// The header counting a message's returns, as RabbitMQ 4 sets it.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// How long a message returned for the `returns`-th time (1 = first)
/// waits: `min × returns` (no multiplier: linear), `min` (multiplier 1:
/// constant) or `min × multiplierʳᵉᵗᵘʳⁿˢ⁻¹` (exponential), at most `max`.
/// `None` when delayed retry is off.
pub fn backoff_ms(r: &RetryArgs, returns: u32) -> Option<u64> {
    let min = r.min_ms?;
    let n = u64::from(returns.max(1));
    let wait = match r.multiplier {
        None => min.saturating_mul(n),
        Some(m) => {
            let exp = u32::try_from(n - 1).unwrap_or(u32::MAX);
            min.saturating_mul(m.checked_pow(exp).unwrap_or(u64::MAX))
        }
    };
    Some(r.max_ms.map_or(wait, |max| wait.min(max)))
}

/// The delivery limit in force: the queue's (or its policy's), or
/// [`DELAYED_RETRY_DELIVERY_LIMIT_DEFAULT`] when delayed retry is on and
/// none is set (a message that always fails must not wait forever).
pub fn delivery_limit(args: &QueueArgs) -> Option<u64> {
    args.delivery_limit.or(args
        .delayed_retry
        .min_ms
        .map(|_| DELAYED_RETRY_DELIVERY_LIMIT_DEFAULT))
}

/// `msg` as a queue with delayed retry delivers it after `returns`
/// returns: `x-delivery-count` = `returns`, absent before the first (a
/// client's own value is dropped). Costs a scan of the properties' bytes
/// when there is nothing to change, the common case.
pub fn with_count(msg: Arc<Message>, returns: u32) -> Arc<Message> {
    let name = DELIVERY_COUNT_HEADER.as_bytes();
    let named = msg.properties.windows(name.len()).any(|w| w == name);
    if returns == 0 && !named {
        return msg;
    }
    let want = (returns > 0).then(|| AMQPValue::LongLongInt(i64::from(returns)));
    let have = msg
        .headers()
        .and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER).cloned());
    if have == want {
        return msg;
    }
    let counted = msg.rewritten(msg.exchange.clone(), msg.routing_key.clone(), |p| {
        let mut h = p.headers().clone().unwrap_or_default().inner().clone();
        match want {
            Some(v) => h.insert(DELIVERY_COUNT_HEADER.into(), v),
            None => h.remove(DELIVERY_COUNT_HEADER),
        };
        *p = p.clone().with_headers(FieldTable::from(h));
    });
    match counted {
        Ok(m) => m,
        Err(why) => {
            tracing::warn!(error = %why.text, "x-delivery-count not set");
            msg
        }
    }
}

/// Messages waiting for their retry, by (due, seq).
#[derive(Default)]
pub(crate) struct Retrying {
    by_due: BTreeMap<(Instant, u64), Entry>,
    /// Stored id of each message returned at least once that is still in
    /// the queue (waiting, ready or unacked) → the id of its retry mark.
    pub(crate) marks: HashMap<u64, u64>,
}

impl Retrying {
    /// Holds `e` until `due`. Its message carries its count of returns in
    /// `x-delivery-count` from now on.
    pub(crate) fn hold(&mut self, due: Instant, mut e: Entry) {
        if let Body::Resident(m) = &e.body {
            let count = i64::from(e.returns);
            let counted = m.rewritten(m.exchange.clone(), m.routing_key.clone(), |p| {
                let mut h = p.headers().clone().unwrap_or_default();
                h.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongLongInt(count));
                *p = p.clone().with_headers(h);
            });
            match counted {
                Ok(m) => e.body = Body::Resident(m),
                Err(why) => tracing::warn!(error = %why.text, "x-delivery-count not set"),
            }
        }
        self.by_due.insert((due, e.seq), e);
    }

    /// Takes what is due at `now`, earliest first.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Entry> {
        let mut out = Vec::new();
        while let Some(entry) = self.by_due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
        out
    }

    /// Every waiting message (purge, delete).
    pub(crate) fn drain(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.by_due).into_values().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_due.len()
    }

    /// When the first waiting message is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.by_due.first_key_value().map(|(k, _)| k.0)
    }
}

/// When a message returned now for the `returns`-th time is due again.
pub(crate) fn due_at(r: &RetryArgs, returns: u32, now: Instant) -> Option<Instant> {
    backoff_ms(r, returns).map(|ms| now + Duration::from_millis(ms))
}

impl Queue {
    /// A returned message starts waiting until `due`. A stored message of
    /// a durable queue gets a new retry mark (replacing its last) and waits
    /// with its body on disk once its record is written.
    pub(super) fn start_wait(
        &self,
        s: &mut QueueState,
        m: QueuedMessage,
        due: Instant,
        now: Instant,
        fx: &mut Effects,
    ) {
        let mut e = Entry::resident(m);
        let wait_ms = u64::try_from(due.saturating_duration_since(now).as_millis());
        let due_unix_ms =
            (self.env.clock.unix_time_us() / 1_000).saturating_add(wait_ms.unwrap_or(u64::MAX));
        if let (Some(qid), Some(id)) = (self.store_id, self.mark_returns(s, &e, due_unix_ms, fx)) {
            let journal = self.env.dur.journal();
            if journal.pages() && journal.written(qid, &[id]).first() == Some(&true) {
                if let Body::Resident(msg) = &e.body {
                    e.body = Body::Paged {
                        bytes: u32::try_from(msg.body_bytes()).unwrap_or(u32::MAX),
                        priority: msg.priority,
                        restored: crate::ready::Restored::No,
                    };
                }
            }
        }
        s.retrying.hold(due, e);
    }

    /// Writes a stored entry's retry mark: its count of returns, and the
    /// wall-clock end of its wait (`0`: none). It replaces the entry's
    /// last mark. Returns the entry's stored id (`None`: not stored, no
    /// mark).
    pub(super) fn mark_returns(
        &self,
        s: &mut QueueState,
        e: &Entry,
        due_unix_ms: u64,
        fx: &mut Effects,
    ) -> Option<u64> {
        self.write_mark(s, e.stored.get(), e.returns, due_unix_ms, fx)
    }

    /// Writes the retry mark of the stored message `stored` (its count of
    /// `returns` and the end of its wait), replacing its last; `None`
    /// (nothing written) if the message or the queue is not stored.
    pub(super) fn write_mark(
        &self,
        s: &mut QueueState,
        stored: Option<u64>,
        returns: u32,
        due_unix_ms: u64,
        fx: &mut Effects,
    ) -> Option<u64> {
        self.store_id?;
        let id = stored.filter(|id| id & PAGING_BIT == 0)?;
        let mark = RetryMark {
            msg: id,
            returns,
            due_unix_ms,
        };
        let mark_id = self.env.dur.new_message_id();
        fx.marks_written.push((mark_id, encode_retry_mark(&mark)));
        fx.marks_removed
            .extend(s.retrying.marks.insert(id, mark_id));
        Some(id)
    }

    /// Whether some message of the queue has a retry mark in the journal
    /// (its deletion purges them).
    pub(crate) fn has_retry_marks(&self) -> bool {
        !self.state.lock().retrying.marks.is_empty()
    }

    /// After a restart: each message a mark names gets its count of
    /// returns back and, if its wait is not over and delayed retry is on,
    /// waits the rest of it. Returns the ids of marks to remove: those
    /// naming no message of the queue, and all but the newest of a
    /// message's (a crash between writing a new mark and removing the old).
    pub(crate) fn restore_retries(
        self: &Arc<Self>,
        marks: Vec<(u64, RetryMark)>,
        now: Instant,
    ) -> Vec<u64> {
        let mut stale = Vec::new();
        let mut newest: HashMap<u64, (u64, RetryMark)> = HashMap::with_capacity(marks.len());
        for (id, m) in marks {
            match newest.insert(m.msg, (id, m)) {
                Some(old) if old.0 > id => stale.extend(newest.insert(m.msg, old).map(|x| x.0)),
                Some(old) => stale.push(old.0),
                None => {}
            }
        }
        if newest.is_empty() {
            return stale;
        }
        let now_ms = self.env.clock.unix_time_us() / 1_000;
        let retry_on = self.args().delayed_retry.min_ms.is_some();
        self.with_state(now, |_, s, _| {
            let mut waiting = Vec::new();
            s.ready
                .take_where(|e| {
                    let Some((mark_id, m)) = e.stored.get().and_then(|id| newest.remove(&id))
                    else {
                        return false;
                    };
                    e.returns = m.returns;
                    s.retrying.marks.insert(m.msg, mark_id);
                    let wait = retry_on && m.due_unix_ms > now_ms;
                    if wait {
                        waiting.push(m.due_unix_ms - now_ms);
                    }
                    wait
                })
                .into_iter()
                .zip(waiting)
                .for_each(|(e, wait_ms)| s.retrying.hold(now + Duration::from_millis(wait_ms), e));
        });
        stale.extend(newest.into_values().map(|(id, _)| id));
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(min: u64, multiplier: Option<u64>, max: Option<u64>) -> RetryArgs {
        RetryArgs {
            min_ms: Some(min),
            multiplier,
            max_ms: max,
        }
    }

    fn sequence(r: &RetryArgs) -> Vec<u64> {
        (1..=6).map(|n| backoff_ms(r, n).unwrap()).collect()
    }

    #[test]
    fn backoff_is_linear_constant_exponential_and_capped() {
        assert_eq!(
            sequence(&retry(100, None, None)),
            [100, 200, 300, 400, 500, 600]
        );
        assert_eq!(sequence(&retry(100, Some(1), None)), [100; 6]);
        assert_eq!(
            sequence(&retry(100, Some(2), None)),
            [100, 200, 400, 800, 1600, 3200]
        );
        assert_eq!(
            sequence(&retry(100, Some(3), Some(1000))),
            [100, 300, 900, 1000, 1000, 1000]
        );
        assert_eq!(backoff_ms(&RetryArgs::default(), 1), None, "off");
        assert_eq!(
            backoff_ms(&retry(u64::MAX / 2, Some(10), None), 40),
            Some(u64::MAX),
            "saturates, never wraps"
        );
    }

    #[test]
    fn the_delivery_limit_defaults_to_20_only_with_delayed_retry() {
        let mut a = QueueArgs::default();
        assert_eq!(delivery_limit(&a), None);
        a.delayed_retry = retry(10, None, None);
        assert_eq!(delivery_limit(&a), Some(20));
        a.delivery_limit = Some(3);
        assert_eq!(delivery_limit(&a), Some(3));
    }

    #[test]
    fn the_delivery_count_is_the_brokers_own() {
        let make = |headers: Option<FieldTable>| {
            let mut p = berth_protocol::AMQPProperties::default();
            if let Some(h) = headers {
                p = p.with_headers(h);
            }
            let raw = berth_protocol::codec::encode_properties(&p);
            Message::new(String::new(), "q".into(), raw, "b".into()).unwrap()
        };
        let count = |m: &Message| {
            m.headers()
                .and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER).cloned())
        };
        let plain = make(None);
        assert!(
            Arc::ptr_eq(&with_count(Arc::clone(&plain), 0), &plain),
            "nothing to do"
        );
        assert_eq!(
            count(&with_count(plain, 2)),
            Some(AMQPValue::LongLongInt(2))
        );
        let mut h = FieldTable::default();
        h.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongInt(9));
        let claimed = make(Some(h));
        assert_eq!(count(&with_count(Arc::clone(&claimed), 0)), None);
        assert_eq!(
            count(&with_count(claimed, 1)),
            Some(AMQPValue::LongLongInt(1))
        );
    }
}
