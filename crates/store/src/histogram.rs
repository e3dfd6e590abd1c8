//! Lock-free histograms the group writers fill on their hot path and the
//! metrics endpoint reads: one relaxed atomic add per observation.
//!
//! Invariants:
//! - `bounds` ascend strictly; an observation lands in the first bucket
//!   whose bound is at least the value, or in the overflow bucket.
//! - A snapshot may mix observations in flight (each atomic is read once),
//!   never tears one counter.

use std::sync::atomic::{AtomicU64, Ordering};

/// fdatasync latency buckets, µs (100 µs .. 1 s).
pub const SYNC_LATENCY_US_BOUNDS: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];
/// Records per write batch buckets (1 .. 4096).
pub const BATCH_RECORDS_BOUNDS: [u64; 12] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// Counts per bucket of [`SYNC_LATENCY_US_BOUNDS`]-sized bound lists.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [u64; 12],
    /// One per bound, then the overflow bucket.
    counts: [AtomicU64; 13],
    sum: AtomicU64,
}

/// A histogram read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Upper bounds of the buckets, in the unit observed.
    pub bounds: Vec<u64>,
    /// Observations per bucket (not cumulative); one more than `bounds`:
    /// the last counts those above every bound.
    pub counts: Vec<u64>,
    /// Sum of every observation.
    pub sum: u64,
}

impl HistogramSnapshot {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl AtomicHistogram {
    pub const fn new(bounds: &'static [u64; 12]) -> Self {
        Self {
            bounds,
            counts: [const { AtomicU64::new(0) }; 13],
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds.to_vec(),
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// fdatasync latency of a group, µs ([`SYNC_LATENCY_US_BOUNDS`]).
#[derive(Debug)]
pub struct SyncLatencyUs(pub AtomicHistogram);

impl Default for SyncLatencyUs {
    fn default() -> Self {
        Self(AtomicHistogram::new(&SYNC_LATENCY_US_BOUNDS))
    }
}

/// Records per write batch of a group ([`BATCH_RECORDS_BOUNDS`]).
#[derive(Debug)]
pub struct BatchRecords(pub AtomicHistogram);

impl Default for BatchRecords {
    fn default() -> Self {
        Self(AtomicHistogram::new(&BATCH_RECORDS_BOUNDS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        let h = AtomicHistogram::new(&BATCH_RECORDS_BOUNDS);
        for v in [1, 2, 3, 4096, 4097, 0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.counts[0], 2); // 0 and 1
        assert_eq!(s.counts[1], 1); // 2
        assert_eq!(s.counts[2], 1); // 3 (<= 4)
        assert_eq!(s.counts[11], 1); // 4096
        assert_eq!(s.counts[12], 1); // overflow
        assert_eq!(s.count(), 6);
        assert_eq!(s.sum, 1 + 2 + 3 + 4096 + 4097);
    }
}
