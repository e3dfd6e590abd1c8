//! A node whose Raft log lost entries it may have acknowledged (recovery
//! cut a damaged frame) must not help elect a leader that lacks them: until
//! it has caught up with a leader, it refuses every vote request and starts
//! no election. It is caught up once it has applied everything a leader
//! elected after its restart reported committed; that leader's log holds
//! every committed entry (Raft's leader completeness), so from then on this
//! node's log does too.
//!
//! Invariants:
//! - While on probation the node grants no vote and stands for no election.
//! - Probation ends only when `last_applied >= leader_commit` for a
//!   `leader_commit` received in an append from a leader.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct Probation {
    active: AtomicBool,
    /// The highest commit index a leader has told this node of; `0` = none
    /// yet (Raft indexes of committed entries start at 0, so the value is
    /// kept plus one).
    leader_commit_plus_one: AtomicU64,
}

impl Probation {
    pub(crate) fn new(active: bool) -> Self {
        Self {
            active: AtomicBool::new(active),
            leader_commit_plus_one: AtomicU64::new(0),
        }
    }

    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// A leader said `commit` is committed.
    pub(crate) fn heard_commit(&self, commit: Option<u64>) {
        if let Some(c) = commit {
            self.leader_commit_plus_one
                .fetch_max(c + 1, Ordering::AcqRel);
        }
    }

    /// Ends probation if this node has applied what a leader committed.
    /// Returns true when it ended now.
    pub(crate) fn end_if_caught_up(&self, last_applied: Option<u64>) -> bool {
        if !self.active() {
            return false;
        }
        let seen = self.leader_commit_plus_one.load(Ordering::Acquire);
        let caught_up = seen > 0 && last_applied.is_some_and(|a| a + 1 >= seen);
        caught_up && self.active.swap(false, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probation_ends_only_after_applying_a_leaders_commit() {
        let p = Probation::new(true);
        assert!(!p.end_if_caught_up(Some(100)), "no leader heard yet");
        p.heard_commit(Some(20));
        assert!(!p.end_if_caught_up(None));
        assert!(!p.end_if_caught_up(Some(19)));
        assert!(p.end_if_caught_up(Some(20)));
        assert!(!p.active());
        assert!(!Probation::new(false).end_if_caught_up(Some(5)));
    }
}
