//! The barrier that makes a backup's cut one instant for every group: each
//! writer, between two batches, says it has paused and waits; the backup
//! takes its cut only once every writer has paused, then releases them all.
//!
//! Why it is needed: a message moves between groups (dead-lettering) as a
//! publish in the target group and, once that is durable, a Remove in the
//! source group. A cut taken group by group can see the Remove but not the
//! publish; with every writer paused, anything written before a Remove
//! was written is in the cut too.
//!
//! Invariants:
//! - While the backup holds the barrier released == false, no writer that
//!   has paused writes anything (it waits in [`CutBarrier::hold`]).
//! - Every wait is bounded: the backup waits at most
//!   [`BACKUP_PAUSE_WAIT_MS_MAX`] for the writers, a writer holds at most
//!   [`BACKUP_PAUSE_HOLD_MS_MAX`]; either bound running out fails the
//!   backup, never the group. The bounds are OS time (the condvar's), not
//!   the writer's injected clock: they guard against a stuck peer, they
//!   do not schedule work.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::StoreError;
use crate::limits::{BACKUP_PAUSE_HOLD_MS_MAX, BACKUP_PAUSE_WAIT_MS_MAX};

#[derive(Default)]
struct State {
    paused: u32,
    first_paused_at: Option<Instant>,
    released: bool,
    /// A group that cannot pause (its writer died), and why.
    refused: Option<(u32, String)>,
    /// A group whose writer stopped holding before the release.
    left_early: Option<u32>,
}

pub(crate) struct CutBarrier {
    groups: u32,
    state: Mutex<State>,
    changed: Condvar,
}

impl CutBarrier {
    pub fn new(groups: u32) -> CutBarrier {
        CutBarrier {
            groups,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// A writer's side: pause until released (or the hold bound).
    pub fn hold(&self, group: u32) {
        let mut st = self.state.lock();
        st.paused += 1;
        st.first_paused_at.get_or_insert_with(Instant::now);
        self.changed.notify_all();
        let deadline = Instant::now() + Duration::from_millis(BACKUP_PAUSE_HOLD_MS_MAX);
        while !st.released {
            if self.changed.wait_until(&mut st, deadline).timed_out() && !st.released {
                st.left_early.get_or_insert(group);
                tracing::warn!(
                    group,
                    hold_ms_max = BACKUP_PAUSE_HOLD_MS_MAX,
                    "log group resumed writing before a backup released it: that backup fails"
                );
                return;
            }
        }
    }

    /// A writer that cannot pause (it died) says so at once.
    pub fn refuse(&self, group: u32, why: String) {
        self.state.lock().refused.get_or_insert((group, why));
        self.changed.notify_all();
    }

    /// The backup's side: waits until every writer has paused.
    pub fn wait_all_paused(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + Duration::from_millis(BACKUP_PAUSE_WAIT_MS_MAX);
        let mut st = self.state.lock();
        loop {
            if let Some((group, why)) = &st.refused {
                return Err(StoreError::Config(format!(
                    "backup refused: log group {group} cannot pause for the cut ({why}); \
                     nothing was copied"
                )));
            }
            if st.paused == self.groups {
                return Ok(());
            }
            if self.changed.wait_until(&mut st, deadline).timed_out() && st.paused < self.groups {
                return Err(StoreError::Config(format!(
                    "backup gave up: only {} of {} log groups paused for the cut within \
                     {BACKUP_PAUSE_WAIT_MS_MAX} ms (a long compaction step holds the others); \
                     nothing was copied, try again",
                    st.paused, self.groups
                )));
            }
        }
    }

    /// Lets every writer go on; returns how long the first one to pause
    /// was held. Idempotent.
    pub fn release(&self) -> Duration {
        let mut st = self.state.lock();
        st.released = true;
        self.changed.notify_all();
        st.first_paused_at.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// After [`CutBarrier::release`]: fails if some writer stopped holding
    /// before it, so the cut may not be one instant.
    pub fn check_held(&self) -> Result<(), StoreError> {
        match self.state.lock().left_early {
            None => Ok(()),
            Some(group) => Err(StoreError::Config(format!(
                "backup failed: log group {group} resumed writing after \
                 {BACKUP_PAUSE_HOLD_MS_MAX} ms, before the cut was taken; nothing was kept, \
                 try again"
            ))),
        }
    }
}

/// Releases the barrier when dropped, so no error path leaves a writer
/// held until its bound.
pub(crate) struct ReleaseOnDrop<'a>(pub &'a CutBarrier);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_cut_waits_for_every_writer_and_releases_them_all() {
        let b = Arc::new(CutBarrier::new(3));
        let writers: Vec<_> = (0..3)
            .map(|g| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || b.hold(g))
            })
            .collect();
        b.wait_all_paused().unwrap();
        assert_eq!(b.state.lock().paused, 3);
        assert!(writers.iter().all(|w| !w.is_finished()), "all held");
        b.release();
        for w in writers {
            w.join().unwrap();
        }
        b.check_held().unwrap();
    }

    #[test]
    fn a_writer_that_cannot_pause_fails_the_cut_at_once() {
        let b = CutBarrier::new(2);
        b.refuse(1, "its writer died".into());
        let e = b.wait_all_paused().unwrap_err();
        assert!(e.to_string().contains("log group 1 cannot pause"), "{e}");
    }
}
