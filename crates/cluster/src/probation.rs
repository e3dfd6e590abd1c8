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
//! - Probation is on disk (`raft.probation`, made durable before the node
//!   starts): a restart during the catch-up keeps it, although the log it
//!   finds then (cut at the damage) looks whole. The file goes only once
//!   probation ends.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub const PROBATION_FILE: &str = "raft.probation";

#[derive(Default)]
pub(crate) struct Probation {
    /// `raft.probation` (`None` in tests that keep it in memory).
    file: Option<PathBuf>,
    active: AtomicBool,
    /// The highest commit index a leader has told this node of; `0` = none
    /// yet (Raft indexes of committed entries start at 0, so the value is
    /// kept plus one).
    leader_commit_plus_one: AtomicU64,
}

impl Probation {
    #[cfg(test)]
    pub(crate) fn new(active: bool) -> Self {
        Self {
            file: None,
            active: AtomicBool::new(active),
            leader_commit_plus_one: AtomicU64::new(0),
        }
    }

    /// Probation for the node of `dir`: on if its log was found damaged
    /// now (`damaged`, then recorded durably) or an earlier start left it
    /// on.
    pub(crate) fn open(dir: &Path, damaged: bool) -> io::Result<Self> {
        let file = dir.join(PROBATION_FILE);
        let left_on = file.exists();
        if damaged && !left_on {
            File::create(&file)?.sync_all()?;
            File::open(dir)?.sync_all()?;
        }
        if left_on && !damaged {
            tracing::warn!(file = %file.display(),
                "still on probation from an earlier start (its log had been damaged): \
                 no vote until caught up with a leader");
        }
        Ok(Self {
            file: Some(file),
            active: AtomicBool::new(damaged || left_on),
            leader_commit_plus_one: AtomicU64::new(0),
        })
    }

    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// A leader said `commit` is committed. Only a leader this node
    /// accepted counts (`from_current_leader`).
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
        if !caught_up {
            return false;
        }
        // Off disk first: were the file left, a restart would only delay
        // the vote; were the flag cleared first and the removal failed, a
        // restart would bring probation back, which is safe too.
        if let Some(file) = &self.file {
            match fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e,
                        "probation ends, but its file could not be removed: it comes back at the next start");
                }
            }
        }
        self.active.swap(false, Ordering::AcqRel)
    }
}

/// Whether an append answered `reply` came from a leader this node
/// accepted: its term is not behind the vote this node holds. A deposed
/// leader that has not heard of the next term is answered `HigherVote`;
/// its commit index may be behind what the newer leader committed with
/// this node's help, so it must not end probation.
pub(crate) fn from_current_leader<E>(
    reply: &Result<openraft::raft::AppendEntriesResponse<crate::types::NodeId>, E>,
) -> bool {
    use openraft::raft::AppendEntriesResponse as R;
    matches!(reply, Ok(R::Success | R::PartialSuccess(_) | R::Conflict))
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

    /// Probation was kept in memory only: a restart during the catch-up
    /// found a log that looked whole (cut at the damage) and voted at once.
    #[test]
    fn probation_outlives_a_restart_until_it_ends() {
        let dir = berth_testdir::TestDir::new("probation-on-disk");
        assert!(Probation::open(dir.path(), true).unwrap().active());
        let again = Probation::open(dir.path(), false).unwrap();
        assert!(again.active(), "a restart during the catch-up keeps it");
        again.heard_commit(Some(4));
        assert!(again.end_if_caught_up(Some(4)));
        assert!(!Probation::open(dir.path(), false).unwrap().active());
    }

    /// `heard_commit` took any append answered without an error: a
    /// deposed leader (answered `HigherVote`) could end probation with a
    /// commit index behind the one the newer leader reached.
    #[test]
    fn a_deposed_leaders_commit_does_not_count() {
        use openraft::raft::AppendEntriesResponse as R;
        use openraft::Vote;
        let stale: Result<R<u64>, ()> = Ok(R::HigherVote(Vote::new(7, 2)));
        assert!(!from_current_leader(&stale));
        assert!(!from_current_leader::<()>(&Err(())));
        assert!(from_current_leader::<()>(&Ok(R::Success)));
        assert!(from_current_leader::<()>(&Ok(R::Conflict)));
        assert!(from_current_leader::<()>(&Ok(R::PartialSuccess(None))));
    }
}
