//! The writer's clock seam: every time the group writer reads (gathering
//! deadlines, fsync durations, checkpoint and compaction pacing, idle
//! segment roll) comes from a [`Clock`], so tests can inject one they move
//! by hand.
//!
//! Invariants:
//! - A clock never goes backwards.
//! - Only the clock is virtual: waits still block on real channels, for
//!   durations computed from the clock's readings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of `Instant`s.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
}

/// The operating system's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until [`ManualClock::advance`] moves it.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    elapsed_ns: AtomicU64,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            base: Instant::now(),
            elapsed_ns: AtomicU64::new(0),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.elapsed_ns.load(Ordering::SeqCst))
    }
}
