//! Compaction on request (`Store::compact`: `berth store compact`, the
//! HTTP trigger, tests), run in bounded steps between the group's commits.
//!
//! Invariants:
//! - One turn of the writer loop copies at most `compaction_bytes_per_turn`
//!   bytes of live records and fdatasyncs them, then goes back to its
//!   requests: a publish that arrives during a compaction waits for at most
//!   one step, never for the whole compaction, and its own fdatasync has at
//!   most one step's copies to write.
//! - A requested compaction covers the segments sealed when it was asked
//!   for (numbered below [`Requested::below`]): segments that become mostly
//!   dead while it runs are left to background compaction, so a steady
//!   workload cannot keep a request from completing.
//! - Every waiter completes exactly once: `Ok` once no candidate below its
//!   horizon is left, the error if a step failed, `Closed` if the store
//!   shuts down first.

use super::*;

/// Compaction requests not yet completed.
#[derive(Default)]
pub(super) struct Requested {
    /// Completions of the requests waiting for the compaction to finish.
    waiters: Vec<Done>,
    /// Segments numbered below this are covered by the requests.
    below: u32,
}

impl Requested {
    pub(super) fn is_pending(&self) -> bool {
        !self.waiters.is_empty()
    }
}

impl Writer {
    /// A compaction was asked for: its steps run from the writer loop
    /// ([`Self::compaction_turn`]), and `done` runs once it is finished.
    pub(super) fn compaction_requested(&mut self, done: Done) {
        // Every segment sealed so far is numbered below the next one.
        self.compaction.below = self.compaction.below.max(self.next_seq);
        self.compaction.waiters.push(done);
    }

    /// One bounded step of a requested compaction, if one is pending;
    /// completes its waiters once nothing is left to move, or with the
    /// error of a failed step.
    pub(super) fn compaction_turn(&mut self) {
        // While the disk is full a step could only fail (and its copies be
        // taken back): the request waits for space like every write.
        if !self.compaction.is_pending() || self.waiting_for_space() {
            return;
        }
        let below = self.compaction.below;
        let result = match self.compaction_candidate_below(below) {
            Some(_) => self
                .compact_step(self.cfg.compaction_bytes_per_turn, below)
                .and_then(|()| self.sync_step()),
            None => Ok(()),
        };
        if result.is_ok() && self.compaction_candidate_below(below).is_some() {
            return; // more next turn
        }
        if let Err(e) = &result {
            tracing::error!(group = self.group(), error = %e, "requested compaction failed");
        }
        for done in std::mem::take(&mut self.compaction.waiters) {
            done(result.clone());
        }
    }

    /// Syncs the step's copies: unsynced, they would pile up over the
    /// steps taken while no publish came, and the next publish's fdatasync
    /// would have to write them all (hundreds of ms for tens of MiB).
    fn sync_step(&mut self) -> Result<(), StoreError> {
        match self.write_buf().and_then(|()| self.sync()) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.poison(e)),
        }
    }

    /// At shutdown: a compaction still pending is not finished.
    pub(super) fn compaction_abandoned(&mut self) {
        for done in std::mem::take(&mut self.compaction.waiters) {
            done(Err(StoreError::Closed));
        }
    }
}
