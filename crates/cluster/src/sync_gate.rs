//! A gate in front of every fdatasync of a log, so that tests can hold a
//! node's disk "in flight" (written, not yet durable) for as long as they
//! like and check that nothing is reported durable meanwhile. Production
//! nodes use an always-open gate; waiting on it costs one uncontended lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

#[derive(Clone, Default)]
pub struct SyncGate {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    closed: Mutex<bool>,
    opened: Condvar,
    /// fdatasyncs that went through the gate.
    passed: AtomicU64,
}

impl SyncGate {
    /// Hold every fdatasync that starts from now on until [`Self::open`].
    pub fn close(&self) {
        *self.inner.closed.lock() = true;
    }

    pub fn open(&self) {
        *self.inner.closed.lock() = false;
        self.inner.opened.notify_all();
    }

    /// How many fdatasyncs have passed the gate so far.
    #[must_use]
    pub fn passed(&self) -> u64 {
        self.inner.passed.load(Ordering::Relaxed)
    }

    /// Called by the log's writer thread right before each fdatasync.
    pub(crate) fn pass(&self) {
        self.inner.passed.fetch_add(1, Ordering::Relaxed);
        let mut closed = self.inner.closed.lock();
        while *closed {
            self.inner.opened.wait(&mut closed);
        }
    }
}
