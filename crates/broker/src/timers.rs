//! The timer service: deadlines (message TTL, `x-expires`) of whatever
//! needs to be woken, earliest first. The server drives it with the clock.
//!
//! Invariants:
//! - A target is held weakly: a deleted queue's pending deadlines are
//!   dropped when they come due, never keep it alive.
//! - The heap's lock is released before a target runs, so a target may
//!   schedule its next deadline from its callback.

use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};
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

    /// Runs every timer due at `now`.
    pub fn run_due(&self, now: Instant) {
        loop {
            let q = {
                let mut h = self.heap.lock();
                match h.peek() {
                    Some(e) if e.at <= now => h.pop().map(|e| e.target),
                    _ => return,
                }
            };
            if let Some(target) = q.and_then(|w| w.upgrade()) {
                target.on_timer(now);
            }
        }
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.lock().peek().map(|e| e.at)
    }
}
