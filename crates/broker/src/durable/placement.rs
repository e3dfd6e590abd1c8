//! Which log group a new durable queue lands in: the one holding the
//! fewest live durable queues, by choosing its journal id there.
//!
//! A queue's group is a fixed function of its id (the journal's
//! [`Journal::group_of`], persistent semantics), so a new queue is placed
//! by skipping ids until one falls in the wanted group. Ids are never
//! reused anyway; the skipped ones are simply never handed out. With the
//! hash alone, ten queues split 7 / 3 over two groups (as they did in the
//! ten-million restart of docs/BENCHMARKS.md), so one group's writer and
//! one group's recovery carried most of the work while the other core idled.
//!
//! Invariants:
//! - Counts follow the queues a vhost holds (declared, restored, applied
//!   from a peer, deleted, forgotten); they only steer placement, so a
//!   count that drifted makes placement worse, never anything wrong.
//! - An id is always returned: after [`TRIES_MAX`] ids outside the wanted
//!   group, the next id is taken wherever it falls.

use parking_lot::Mutex;

use super::Journal;

/// Ids tried for the wanted group before one is taken wherever it falls
/// (with G groups a try hits with probability 1/G).
pub const TRIES_MAX: usize = 64;

/// Live durable queues per log group.
pub struct Placement {
    live: Mutex<Vec<u64>>,
}

impl Placement {
    pub fn new(groups: u32) -> Self {
        Self {
            live: Mutex::new(vec![0; groups.max(1) as usize]),
        }
    }

    /// The group with the fewest live queues (the lowest such group).
    pub fn emptiest(&self) -> u32 {
        let live = self.live.lock();
        let (g, _) = live
            .iter()
            .enumerate()
            .min_by_key(|(g, n)| (**n, *g))
            .expect("at least one group");
        u32::try_from(g).expect("groups fit u32")
    }

    /// A queue of `group` is live (declared, restored or applied).
    pub fn added(&self, group: u32) {
        if let Some(n) = self.live.lock().get_mut(group as usize) {
            *n += 1;
        }
    }

    /// A queue of `group` is gone (deleted or forgotten).
    pub fn removed(&self, group: u32) {
        if let Some(n) = self.live.lock().get_mut(group as usize) {
            *n = n.saturating_sub(1);
        }
    }
}

/// The first id from `next` (called once per try) in `journal`'s group
/// `want`, or the id after [`TRIES_MAX`] misses.
pub fn id_in_group(journal: &dyn Journal, want: u32, mut next: impl FnMut() -> u64) -> u64 {
    for _ in 0..TRIES_MAX {
        let id = next();
        if journal.group_of(id) == want {
            return id;
        }
    }
    next()
}
