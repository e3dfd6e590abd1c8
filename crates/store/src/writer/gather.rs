//! Adaptive group commit's decision: whether to hold a batch open for more
//! committers, and for how long.

use std::collections::VecDeque;

use super::*;

/// How many completed batches the policy remembers (for the committers
/// seen within [`RECENT_SYNCS`] fsyncs): more than a window can hold at any
/// fsync time worth waiting for, few enough to sum on every batch.
const RECENT_BATCHES_MAX: usize = 16;

/// The window, in smoothed fsync times, over which completed writes are
/// counted as committers who may come back. Two, because a committer with
/// one request in flight comes back at the earliest one fsync (its next
/// batch's) plus its round trip after its previous completion: one window
/// of two fsyncs sees every committer of a single wave once and, with
/// round trips shorter than an fsync, none twice.
const RECENT_SYNCS: u32 = 2;

/// Batches after which a cap set by a wait that ran out is dropped, so
/// that committers who joined since (and formed batches no larger than
/// the cap) are counted again: at most one wasted wait per this many
/// batches when the window keeps counting too many.
const CAP_BATCHES_MAX: u32 = 64;

/// Adaptive group commit's memory of recent batches, and its one decision:
/// whether to hold a batch open for more committers, for how long.
///
/// A batch is held only if (a) about `expected` ≥ 2 committers are active,
/// (b) the previous batch itself was shared (a committer alone last time
/// is alone now), and (c) this batch began promptly after the previous one
/// completed, as committers woken together do (after a longer pause the
/// burst is over). The pause is at most `commit_delay_us_max` and at most
/// the smoothed fsync time.
///
/// `expected` is the number of writes completed within the last
/// [`RECENT_SYNCS`] smoothed fsync times (at least the smoothed batch
/// size): the committers who are waiting for the round trip of their last
/// confirm, not the size of the batches they happen to form. Waiting only
/// for the smoothed batch size keeps committers with one request in flight
/// in the waves they formed (20 producers settle at ~7 per fsync, issue
/// 20); waiting for all who were recently served merges the waves into one
/// batch. Should that count more committers than come (one came twice
/// within the window, or some stopped), the wait runs out, and the number
/// that did come caps `expected` until a batch forms with more than it,
/// or for [`CAP_BATCHES_MAX`] batches.
#[derive(Debug)]
pub(super) struct GatherPolicy {
    /// Smoothed writes per batch.
    committers_ewma: f64,
    /// Writes in the previous batch.
    last_batch_writes: usize,
    /// When the previous batch completed.
    last_batch_done: Option<Instant>,
    /// Completed batches, oldest first: when, and how many writes.
    recent: VecDeque<(Instant, usize)>,
    /// Writes the last gathering that ran out of time had got, and the
    /// batches completed since: no more are expected until a batch forms
    /// with more than that, or [`CAP_BATCHES_MAX`] batches have passed.
    came_at_most: Option<(usize, u32)>,
    /// Smoothed fdatasync duration, µs.
    sync_us_ewma: f64,
}

impl Default for GatherPolicy {
    fn default() -> Self {
        GatherPolicy {
            committers_ewma: 1.0,
            last_batch_writes: 0,
            last_batch_done: None,
            recent: VecDeque::with_capacity(RECENT_BATCHES_MAX),
            came_at_most: None,
            sync_us_ewma: 0.0,
        }
    }
}

impl GatherPolicy {
    pub(super) fn batch_done(&mut self, writes: usize, now: Instant) {
        let n = writes as f64;
        self.committers_ewma = 0.75 * self.committers_ewma + 0.25 * n;
        self.last_batch_writes = writes;
        self.last_batch_done = Some(now);
        if self.recent.len() == RECENT_BATCHES_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((now, writes));
        if let Some((_, batches)) = &mut self.came_at_most {
            *batches += 1;
        }
    }

    pub(super) fn sync_took(&mut self, us: u64) {
        let us = us as f64;
        self.sync_us_ewma = 0.8 * self.sync_us_ewma + 0.2 * us;
    }

    /// A gathering planned for `expected` writes ran out of time with
    /// `got`: that many is what comes, for now.
    pub(super) fn ran_out(&mut self, got: usize) {
        self.came_at_most = Some((got, 0));
    }

    /// Committers expected at `now`: writes completed within the window,
    /// at least the smoothed batch size, at most what came last time the
    /// wait ran out.
    fn expected(&self, now: Instant) -> usize {
        let window = Duration::from_micros(self.sync_us_ewma as u64) * RECENT_SYNCS;
        let recent: usize = self
            .recent
            .iter()
            .rev()
            .take_while(|(at, _)| now.saturating_duration_since(*at) <= window)
            .map(|(_, n)| n)
            .sum();
        let smoothed = self.committers_ewma.round() as usize;
        let expected = recent.max(smoothed);
        self.came_at_most
            .map_or(expected, |(cap, _)| expected.min(cap))
    }

    /// For a batch of `writes` formed at `now`: how many writes to wait
    /// for, and for at most how long; `None` to write at once.
    pub(super) fn plan(
        &mut self,
        writes: usize,
        now: Instant,
        cfg: &StoreConfig,
    ) -> Option<(usize, Duration)> {
        if cfg.sync != SyncMode::Always || cfg.commit_delay_us_max == 0 || writes == 0 {
            return None;
        }
        if self
            .came_at_most
            .is_some_and(|(cap, batches)| writes > cap || batches >= CAP_BATCHES_MAX)
        {
            // More came on their own than the cap, or it is old: count
            // the committers again.
            self.came_at_most = None;
        }
        if self.last_batch_writes < 2 {
            return None;
        }
        let expected = self.expected(now);
        if expected < 2 || writes >= expected {
            return None;
        }
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
        // Alone from the start: never, though the window (two fsyncs)
        // holds many of its batches.
        for i in 0..20 {
            let now = t0 + Duration::from_micros(i * 100);
            assert_eq!(p.plan(1, now, &cfg), None);
            p.batch_done(1, now);
        }
        // A burst of 8, a second apart from the lone committer: a short
        // batch right after a shared one waits, capped by
        // commit_delay_us_max (the fsync takes 10 ms).
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..10 {
            p.batch_done(8, t1);
        }
        p.recent.clear();
        p.batch_done(8, t1);
        let at = t1 + Duration::from_micros(50);
        assert_eq!(
            p.plan(3, at, &cfg),
            Some((8, Duration::from_micros(cfg.commit_delay_us_max)))
        );
        assert_eq!(p.plan(8, at, &cfg), None, "all expected are there");
        // The burst ends: after a pause, a lone committer does not wait...
        let later = t1 + Duration::from_secs(1);
        assert_eq!(p.plan(1, later, &cfg), None);
        // ...and once it was alone in a batch, never again, though the
        // smoothed count is still high.
        p.batch_done(1, at);
        assert!(p.committers_ewma >= 2.0);
        assert_eq!(p.plan(1, at, &cfg), None);
    }

    /// A policy whose smoothed fsync has settled at 200 µs, and a clock in
    /// µs from now.
    fn settled_at_200_us() -> (StoreConfig, GatherPolicy, impl Fn(u64) -> Instant) {
        let mut p = GatherPolicy::default();
        for _ in 0..100 {
            p.sync_took(200);
        }
        let t0 = Instant::now();
        (StoreConfig::new("/x"), p, move |n| {
            t0 + Duration::from_micros(n)
        })
    }

    /// Issue 20: 20 committers with one request in flight each settled in
    /// waves of ~7 per fsync, because the policy waited only for the
    /// smoothed batch size (7): a wave of 7 never waited for the others.
    #[test]
    fn waves_of_committers_are_gathered_into_one_batch() {
        let (cfg, mut p, us) = settled_at_200_us();
        // Three waves of 7, one per fsync (200 µs + writing).
        for k in 0..30 {
            p.batch_done(7, us(220 * k));
        }
        let at = us(220 * 29 + 10);
        let (expected, delay) = p
            .plan(7, at, &cfg)
            .expect("a wave of 7 must wait for the committers served in the last two fsyncs");
        assert_eq!(expected, 14, "the two waves served within the window");
        assert!(
            (190..=200).contains(&delay.as_micros()),
            "about one fsync: {delay:?}"
        );
        // The merged batch of 14 completes: the next short batch waits for
        // as many, not for the smoothed 7 or so.
        p.batch_done(14, us(220 * 29 + 420));
        assert_eq!(p.plan(7, us(220 * 29 + 430), &cfg).map(|x| x.0), Some(14));
    }

    #[test]
    fn a_wait_that_ran_out_caps_what_is_expected_until_more_come() {
        let (cfg, mut p, us) = settled_at_200_us();
        p.batch_done(10, us(0));
        p.batch_done(10, us(220));
        assert_eq!(p.plan(4, us(230), &cfg).map(|x| x.0), Some(20));
        // Only 10 came (each had been counted twice): expect no more.
        p.ran_out(10);
        p.batch_done(10, us(440));
        assert_eq!(p.plan(4, us(450), &cfg).map(|x| x.0), Some(10));
        assert_eq!(p.plan(10, us(450), &cfg), None, "all that come are there");
        // More came on their own: the cap is gone.
        p.batch_done(10, us(660));
        assert_eq!(p.plan(12, us(670), &cfg).map(|x| x.0), Some(20));
        assert!(p.came_at_most.is_none());
        // A cap also expires: after CAP_BATCHES_MAX batches of no more
        // than it, the window counts again.
        p.ran_out(10);
        let mut t = 660;
        for _ in 1..CAP_BATCHES_MAX {
            t += 220;
            p.batch_done(10, us(t));
            assert_eq!(p.plan(4, us(t + 10), &cfg).map(|x| x.0), Some(10));
        }
        t += 220;
        p.batch_done(10, us(t));
        assert_eq!(p.plan(4, us(t + 10), &cfg).map(|x| x.0), Some(20));
    }
}
