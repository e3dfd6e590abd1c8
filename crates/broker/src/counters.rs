//! Per-queue message counters (published, delivered or got, acked) and
//! their rates, as RabbitMQ's management API reports them in
//! `message_stats` (`publish`, `deliver_get`, `ack` and `*_details.rate`).
//!
//! Invariants:
//! - Counters only grow; they are updated with relaxed atomics on the hot
//!   path and never take a lock there.
//! - A rate is computed from two samples taken at least
//!   [`RATE_SAMPLE_INTERVAL_MS`] apart, so it is per second over that
//!   window, not an instant value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// The shortest window a rate is computed over (RabbitMQ's default
/// `collect_statistics_interval` is 5 s).
pub const RATE_SAMPLE_INTERVAL_MS: u64 = 5_000;

/// Counters of one queue (or, in `totals.rs`, of a vhost's queues together).
#[derive(Default)]
pub struct QueueCounters {
    pub published: AtomicU64,
    pub delivered: AtomicU64,
    pub acked: AtomicU64,
    rates: Mutex<Rates>,
}

#[derive(Default, Clone, Copy)]
struct Rates {
    last: Option<(Instant, [u64; 3])>,
    per_s: [f64; 3],
}

/// Totals and their per-second rates.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CounterSnapshot {
    pub published: u64,
    pub delivered: u64,
    pub acked: u64,
    pub published_rate: f64,
    pub delivered_rate: f64,
    pub acked_rate: f64,
}

impl CounterSnapshot {
    /// Adds another snapshot's counts and rates (a sum over queues).
    pub fn add(&mut self, o: &CounterSnapshot) {
        self.published += o.published;
        self.delivered += o.delivered;
        self.acked += o.acked;
        self.published_rate += o.published_rate;
        self.delivered_rate += o.delivered_rate;
        self.acked_rate += o.acked_rate;
    }
}

impl QueueCounters {
    pub fn add_published(&self) {
        self.published.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_acked(&self, n: usize) {
        self.acked.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn totals(&self) -> [u64; 3] {
        [
            self.published.load(Ordering::Relaxed),
            self.delivered.load(Ordering::Relaxed),
            self.acked.load(Ordering::Relaxed),
        ]
    }

    /// Takes a sample at `now`; rates change once the window has passed.
    pub fn sample(&self, now: Instant) {
        let totals = self.totals();
        let mut r = self.rates.lock();
        match r.last {
            None => r.last = Some((now, totals)),
            Some((at, before)) => {
                let elapsed = now.saturating_duration_since(at);
                if elapsed.as_millis() < u128::from(RATE_SAMPLE_INTERVAL_MS) {
                    return;
                }
                let secs = elapsed.as_secs_f64();
                for i in 0..3 {
                    let delta = totals[i].saturating_sub(before[i]) as f64;
                    r.per_s[i] = delta / secs;
                }
                r.last = Some((now, totals));
            }
        }
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        let [published, delivered, acked] = self.totals();
        let r = *self.rates.lock();
        CounterSnapshot {
            published,
            delivered,
            acked,
            published_rate: r.per_s[0],
            delivered_rate: r.per_s[1],
            acked_rate: r.per_s[2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rates_are_per_second_over_the_sample_window() {
        let c = QueueCounters::default();
        let t0 = Instant::now();
        c.sample(t0);
        for _ in 0..50 {
            c.add_published();
        }
        c.add_acked(10);
        // Too early: no rate yet.
        c.sample(t0 + Duration::from_millis(100));
        assert!(c.snapshot().published_rate.abs() < f64::EPSILON);
        c.sample(t0 + Duration::from_secs(10));
        let s = c.snapshot();
        assert_eq!(s.published, 50);
        assert!((s.published_rate - 5.0).abs() < 1e-9, "{s:?}");
        assert!((s.acked_rate - 1.0).abs() < 1e-9, "{s:?}");
        assert!(s.delivered_rate.abs() < f64::EPSILON);
    }
}
