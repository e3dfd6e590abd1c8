//! A vhost's totals over its queues — how many queues, ready and
//! unacknowledged messages, ready bytes, consumers, and the messages
//! published, delivered and acked — kept as the queues change, so that
//! `/api/overview` and `/metrics` read them without visiting a queue
//! (their cost does not grow with the number of queues).
//!
//! Invariants:
//! - A queue adds to the totals only the difference between what it
//!   contributes now and what it last reported ([`Tally`]), under its own
//!   lock, after every change of its state. So the totals are at every
//!   moment the sum of each queue's last report (never negative), and
//!   equal a walk over the queues whenever none is in the middle of a
//!   change.
//! - A deleted queue contributes nothing to the gauges; what it counted
//!   (published, delivered, acked) stays in the totals, so they only grow,
//!   as a Prometheus counter must.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::counters::{CounterSnapshot, QueueCounters};

/// Positions in a [`Tally`].
const QUEUES: usize = 0;
const READY: usize = 1;
const READY_BYTES: usize = 2;
const UNACKED: usize = 3;
const CONSUMERS: usize = 4;
/// Unacknowledged deliveries of streams: a stream's messages are all
/// counted as ready (they stay), so these are not extra messages.
const STREAM_UNACKED: usize = 5;
/// Gauges come first; the counters follow: published, delivered, acked.
const GAUGES: usize = 6;
const PUBLISHED: usize = 6;
const FIELDS: usize = 9;

/// What one queue contributes to its vhost's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally([u64; FIELDS]);

/// A queue's numbers, as a tally is made from them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QueueFigures {
    pub ready: u64,
    pub ready_bytes: u64,
    pub unacked: u64,
    pub consumers: u64,
    pub is_stream: bool,
    /// Published, delivered, acked (its counters).
    pub counted: [u64; 3],
}

impl Tally {
    /// A live queue's contribution.
    pub(crate) fn live(f: &QueueFigures) -> Self {
        let mut t = [0; FIELDS];
        t[QUEUES] = 1;
        t[READY] = f.ready;
        t[READY_BYTES] = f.ready_bytes;
        t[UNACKED] = f.unacked;
        t[CONSUMERS] = f.consumers;
        t[STREAM_UNACKED] = if f.is_stream { f.unacked } else { 0 };
        t[PUBLISHED..].copy_from_slice(&f.counted);
        Self(t)
    }

    /// A deleted queue's: its counts only.
    pub(crate) fn deleted(counted: [u64; 3]) -> Self {
        let mut t = [0; FIELDS];
        t[PUBLISHED..].copy_from_slice(&counted);
        Self(t)
    }
}

/// The totals of one vhost's queues.
#[derive(Default)]
pub struct QueueTotals {
    /// Sums of the queues' last reported gauges (wrapping: a report adds
    /// `after - before` modulo 2^64, so the sum is exact).
    gauges: [AtomicU64; GAUGES],
    /// Sums of the queues' counters, with their rates.
    counters: QueueCounters,
}

/// The totals at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub queues: u64,
    pub ready: u64,
    pub ready_bytes: u64,
    pub unacked: u64,
    pub consumers: u64,
    /// Ready and unacknowledged messages; a stream's are all it keeps
    /// (`rabbitmq_queue_messages`).
    pub messages: u64,
    pub counters: CounterSnapshot,
}

impl Totals {
    /// Adds another vhost's totals (the broker-wide figures).
    pub fn add(&mut self, o: &Totals) {
        self.queues += o.queues;
        self.ready += o.ready;
        self.ready_bytes += o.ready_bytes;
        self.unacked += o.unacked;
        self.consumers += o.consumers;
        self.messages += o.messages;
        self.counters.add(&o.counters);
    }
}

impl QueueTotals {
    /// A queue's contribution changed from `before` to `after`.
    pub(crate) fn report(&self, before: &Tally, after: &Tally) {
        for i in 0..GAUGES {
            let delta = after.0[i].wrapping_sub(before.0[i]);
            if delta != 0 {
                self.gauges[i].fetch_add(delta, Ordering::Relaxed);
            }
        }
        let counted = [
            &self.counters.published,
            &self.counters.delivered,
            &self.counters.acked,
        ];
        for (i, total) in (PUBLISHED..FIELDS).zip(counted) {
            // Counters only grow; a smaller one would be a queue's reports
            // out of order, which its lock rules out.
            let delta = after.0[i].saturating_sub(before.0[i]);
            if delta != 0 {
                total.fetch_add(delta, Ordering::Relaxed);
            }
        }
    }

    /// Takes a rate sample (see [`QueueCounters::sample`]).
    pub fn sample(&self, now: Instant) {
        self.counters.sample(now);
    }

    pub fn get(&self) -> Totals {
        let g = |i: usize| self.gauges[i].load(Ordering::Relaxed);
        let (ready, unacked) = (g(READY), g(UNACKED));
        Totals {
            queues: g(QUEUES),
            ready,
            ready_bytes: g(READY_BYTES),
            unacked,
            consumers: g(CONSUMERS),
            messages: (ready + unacked).saturating_sub(g(STREAM_UNACKED)),
            counters: self.counters.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(ready: u64, unacked: u64, is_stream: bool, counted: [u64; 3]) -> QueueFigures {
        QueueFigures {
            ready,
            ready_bytes: ready * 10,
            unacked,
            consumers: 1,
            is_stream,
            counted,
        }
    }

    #[test]
    fn totals_are_the_sum_of_the_last_reports_and_counts_outlive_a_deleted_queue() {
        let t = QueueTotals::default();
        let (a0, b0) = (Tally::default(), Tally::default());
        let a1 = Tally::live(&figures(5, 2, false, [9, 4, 2]));
        let b1 = Tally::live(&figures(7, 1, true, [7, 1, 0]));
        t.report(&a0, &a1);
        t.report(&b0, &b1);
        let s = t.get();
        assert_eq!((s.queues, s.ready, s.unacked, s.consumers), (2, 12, 3, 2));
        assert_eq!(s.ready_bytes, 120);
        // The stream's unacked delivery is one of its 7 kept messages.
        assert_eq!(s.messages, 5 + 2 + 7);
        assert_eq!(s.counters.published, 16);
        // a shrinks, then b is deleted.
        let a2 = Tally::live(&figures(1, 0, false, [9, 6, 6]));
        t.report(&a1, &a2);
        t.report(&b1, &Tally::deleted([7, 1, 0]));
        let s = t.get();
        assert_eq!((s.queues, s.ready, s.unacked, s.consumers), (1, 1, 0, 1));
        assert_eq!(s.messages, 1);
        assert_eq!(
            (s.counters.published, s.counters.delivered, s.counters.acked),
            (16, 7, 6)
        );
    }
}
