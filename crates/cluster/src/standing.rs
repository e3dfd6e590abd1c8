//! What decides whether a node may take part in elections, shared by the
//! node (which sets it) and the peer listener (which refuses votes by it),
//! so that neither has to import the other.

use std::sync::atomic::AtomicBool;

use crate::probation::Probation;

/// Whether this node may take part in elections: not while its disk is
/// stalled (`fenced`), nor while it is on probation after a damaged log.
pub(crate) struct Standing {
    pub(crate) fenced: AtomicBool,
    pub(crate) probation: Probation,
}

impl Standing {
    /// May this node stand for election now?
    pub(crate) fn may_stand(&self) -> bool {
        !self.fenced.load(std::sync::atomic::Ordering::Acquire) && !self.probation.active()
    }
}
