//! The broker's clock seam: every "now" the broker acts on comes from a
//! [`Clock`], so TTL, consumer timeouts and dead-letter timestamps can be
//! tested with a clock the test moves by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time.
pub trait Clock: Send + Sync {
    /// Monotonic time, for deadlines.
    fn now(&self) -> Instant;
    /// Wall-clock seconds since the Unix epoch, for timestamps clients see
    /// (`x-death`'s `time`).
    fn unix_time_s(&self) -> u64;
    /// Wall-clock microseconds since the Unix epoch, for event times.
    fn unix_time_us(&self) -> u64 {
        self.unix_time_s().saturating_mul(1_000_000)
    }
}

/// The operating system's clocks.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_time_s(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn unix_time_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to, for deterministic tests.
pub struct ManualClock {
    start: Instant,
    /// Time elapsed since `start`, in microseconds.
    elapsed_us: AtomicU64,
    /// Wall-clock seconds at `start`.
    unix_start_s: u64,
}

impl ManualClock {
    /// A clock standing at `start`, whose wall clock reads `unix_start_s`.
    pub fn new(start: Instant, unix_start_s: u64) -> Self {
        Self {
            start,
            elapsed_us: AtomicU64::new(0),
            unix_start_s,
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.elapsed_us.fetch_add(us, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + Duration::from_micros(self.elapsed_us.load(Ordering::Relaxed))
    }

    fn unix_time_s(&self) -> u64 {
        self.unix_start_s + self.elapsed_us.load(Ordering::Relaxed) / 1_000_000
    }

    fn unix_time_us(&self) -> u64 {
        self.unix_start_s * 1_000_000 + self.elapsed_us.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let t0 = Instant::now();
        let c = ManualClock::new(t0, 1_000);
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_millis(2_500));
        assert_eq!(c.now(), t0 + Duration::from_millis(2_500));
        assert_eq!(c.unix_time_s(), 1_002);
    }
}
