//! Adaptive group commit's decision: whether to hold a batch open for more
//! committers, and for how long.

use super::*;

/// Adaptive group commit's memory of recent batches, and its one decision:
/// whether to hold a batch open for more committers, for how long.
///
/// A batch is held only if (a) recent batches were shared by about
/// `expected` ≥ 2 committers (a smoothed count), (b) the previous batch
/// itself was shared (a committer alone last time is alone now: the
/// smoothed count alone decays too slowly after a burst), and (c) this
/// batch began promptly after the previous one completed, as committers
/// woken together do (after a longer pause the burst is over). The pause is
/// at most `commit_delay_us_max` and at most the smoothed fsync time.
#[derive(Debug)]
pub(super) struct GatherPolicy {
    /// Smoothed writes per batch: the committers we expect to meet.
    committers_ewma: f64,
    /// Writes in the previous batch.
    last_batch_writes: usize,
    /// When the previous batch completed.
    last_batch_done: Option<Instant>,
    /// Smoothed fdatasync duration, µs.
    sync_us_ewma: f64,
}

impl Default for GatherPolicy {
    fn default() -> Self {
        GatherPolicy {
            committers_ewma: 1.0,
            last_batch_writes: 0,
            last_batch_done: None,
            sync_us_ewma: 0.0,
        }
    }
}

impl GatherPolicy {
    pub(super) fn batch_done(&mut self, writes: usize, now: Instant) {
        #[allow(clippy::cast_precision_loss)]
        let n = writes as f64;
        self.committers_ewma = 0.75 * self.committers_ewma + 0.25 * n;
        self.last_batch_writes = writes;
        self.last_batch_done = Some(now);
    }

    pub(super) fn sync_took(&mut self, us: u64) {
        #[allow(clippy::cast_precision_loss)]
        let us = us as f64;
        self.sync_us_ewma = 0.8 * self.sync_us_ewma + 0.2 * us;
    }

    /// For a batch of `writes` formed at `now`: how many writes to wait
    /// for, and for at most how long; `None` to write at once.
    pub(super) fn plan(
        &self,
        writes: usize,
        now: Instant,
        cfg: &StoreConfig,
    ) -> Option<(usize, Duration)> {
        if cfg.sync != SyncMode::Always || cfg.commit_delay_us_max == 0 || writes == 0 {
            return None;
        }
        let expected = self.committers_ewma.round();
        if expected < 2.0 || self.last_batch_writes < 2 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let expected = expected as usize;
        if writes >= expected {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let delay_us = cfg.commit_delay_us_max.min(self.sync_us_ewma as u64);
        let prompt = Duration::from_micros(cfg.commit_delay_us_max.max(delay_us));
        let came_back = self
            .last_batch_done
            .is_some_and(|t| now.saturating_duration_since(t) <= prompt);
        (delay_us > 0 && came_back).then(|| (expected, Duration::from_micros(delay_us)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_policy_waits_only_for_committers_that_came_back() {
        let cfg = StoreConfig::new("/x");
        let t0 = Instant::now();
        let mut p = GatherPolicy::default();
        p.sync_took(10_000);
        // Alone from the start: never.
        for i in 0..20 {
            let now = t0 + Duration::from_micros(i * 100);
            assert_eq!(p.plan(1, now, &cfg), None);
            p.batch_done(1, now);
        }
        // A burst of 8: a short batch right after a shared one waits,
        // capped by commit_delay_us_max (the fsync takes 10 ms).
        for _ in 0..10 {
            p.batch_done(8, t0);
        }
        let at = t0 + Duration::from_micros(50);
        assert_eq!(
            p.plan(3, at, &cfg),
            Some((8, Duration::from_micros(cfg.commit_delay_us_max)))
        );
        assert_eq!(p.plan(8, at, &cfg), None, "all expected are there");
        // The burst ends: after a pause, a lone committer does not wait...
        let later = t0 + Duration::from_secs(1);
        assert_eq!(p.plan(1, later, &cfg), None);
        // ...and once it was alone in a batch, never again, though the
        // smoothed count is still high.
        p.batch_done(1, at);
        assert!(p.committers_ewma >= 2.0);
        assert_eq!(p.plan(1, at, &cfg), None);
    }
}
