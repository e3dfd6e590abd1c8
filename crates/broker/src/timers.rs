//! The timer service: deadlines (message TTL, `x-expires`) of whatever
//! needs to be woken, earliest first. The server drives it with the clock.
//!
//! Invariants:
//! - A target is held weakly: a deleted queue's pending deadlines are
//!   dropped when they come due, never keep it alive.
//! - The heap's lock is released before a target runs, so a target may
//!   schedule its next deadline from its callback.
//! - A deadline scheduled with [`Timers::wake_now`] runs without waiting
//!   for the server's next tick: the waker the server installed asks its
//!   timer task to run the due timers at once.

use std::collections::BinaryHeap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use parking_lot::Mutex;

/// Something woken at a deadline.
pub trait TimerTarget: Send + Sync {
    /// A deadline it asked for has come (`now` is at or after it).
    fn on_timer(self: Arc<Self>, now: Instant);
}

/// Deadlines of queues that need attention (TTL, `x-expires`).
#[derive(Default)]
pub struct Timers {
    heap: Mutex<BinaryHeap<TimerEntry>>,
    /// Asks whoever drives the timers to run them now (installed once by
    /// the server; absent in tests that drive them by hand).
    waker: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

struct TimerEntry {
    at: Instant,
    target: Weak<dyn TimerTarget>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for TimerEntry {
    // Reversed: BinaryHeap is a max-heap, we want the earliest first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

impl Timers {
    /// Calls `target` back at `at` (or at the first [`Timers::run_due`]
    /// after it), unless it is gone by then.
    pub fn schedule(&self, at: Instant, target: Weak<dyn TimerTarget>) {
        self.heap.lock().push(TimerEntry { at, target });
    }

    /// Calls `target` back as soon as the driver can, not at its next
    /// tick: for work another thread finished that a target must act on
    /// (a stream's write became durable and a reader waits for it). Safe
    /// to call from any thread; must stay short.
    pub fn wake_now(&self, now: Instant, target: Weak<dyn TimerTarget>) {
        self.schedule(now, target);
        if let Some(wake) = self.waker.get() {
            wake();
        }
    }

    /// Installs what [`Timers::wake_now`] calls (once; a second is
    /// ignored and reported false).
    pub fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) -> bool {
        self.waker.set(wake).is_ok()
    }

    /// Runs every timer due at `now`. A deadline a target schedules from
    /// its own callback runs at the next call, even if it is due already:
    /// a target that keeps asking for `now` (a queue whose head is due but
    /// cannot go yet) must not spin this call forever.
    pub fn run_due(&self, now: Instant) {
        let due: Vec<Weak<dyn TimerTarget>> = {
            let mut h = self.heap.lock();
            let mut due = Vec::new();
            while h.peek().is_some_and(|e| e.at <= now) {
                due.extend(h.pop().map(|e| e.target));
            }
            due
        };
        for target in due {
            if let Some(target) = target.upgrade() {
                target.on_timer(now);
            }
        }
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.lock().peek().map(|e| e.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Asks to run again at the very deadline it was called for.
    struct AlwaysDue {
        timers: Arc<Timers>,
        me: Mutex<Option<Weak<dyn TimerTarget>>>,
        runs: AtomicU32,
    }

    impl TimerTarget for AlwaysDue {
        fn on_timer(self: Arc<Self>, now: Instant) {
            self.runs.fetch_add(1, Ordering::Relaxed);
            if let Some(me) = self.me.lock().clone() {
                self.timers.schedule(now, me);
            }
        }
    }

    #[test]
    fn a_target_that_reschedules_itself_for_now_runs_once_per_call() {
        let timers = Arc::new(Timers::default());
        let target = Arc::new(AlwaysDue {
            timers: Arc::clone(&timers),
            me: Mutex::new(None),
            runs: AtomicU32::new(0),
        });
        let weak: Weak<dyn TimerTarget> = Arc::downgrade(&target) as _;
        *target.me.lock() = Some(weak.clone());
        let now = Instant::now();
        timers.schedule(now, weak);
        // Before: this call never returned (the target was due again).
        timers.run_due(now);
        assert_eq!(target.runs.load(Ordering::Relaxed), 1);
        timers.run_due(now);
        assert_eq!(target.runs.load(Ordering::Relaxed), 2);
    }
}
