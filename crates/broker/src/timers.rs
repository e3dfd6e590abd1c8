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
//! - A slot ([`Timers::new_slot`]) holds one deadline at most, its
//!   earliest: scheduling it earlier moves it, so a target that keeps
//!   asking for earlier times (a delayed exchange given ever shorter
//!   delays) never piles up stale entries that would each fire.

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Deadlines of slots: one each at most.
    slots: Mutex<Slots>,
    next_slot: AtomicU64,
    /// Targets called since the start (gone ones not counted).
    fired: AtomicU64,
}

/// The slots' deadlines, earliest first, and each slot's.
#[derive(Default)]
struct Slots {
    by_due: BTreeMap<(Instant, u64), Weak<dyn TimerTarget>>,
    at: HashMap<u64, Instant>,
}

/// What the timers hold and have done, for tests and metrics: timer work
/// is counted, not timed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerCounts {
    /// Deadlines waiting.
    pub entries: usize,
    /// Targets called since the start.
    pub fired: u64,
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

    /// A new slot: a target's one deadline ([`Timers::schedule_slot`]).
    pub fn new_slot(&self) -> u64 {
        self.next_slot.fetch_add(1, Ordering::Relaxed)
    }

    /// Calls `target` back at `at`, unless `slot` has a deadline at or
    /// before it already (it keeps that one) or `target` is gone by then.
    /// A later deadline is dropped from the slot, not kept beside it.
    pub fn schedule_slot(&self, slot: u64, at: Instant, target: Weak<dyn TimerTarget>) {
        let mut s = self.slots.lock();
        match s.at.get(&slot) {
            Some(&set) if set <= at => return,
            Some(&set) => {
                s.by_due.remove(&(set, slot));
            }
            None => {}
        }
        s.at.insert(slot, at);
        s.by_due.insert((at, slot), target);
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
            drop(h);
            let mut s = self.slots.lock();
            while let Some(e) = s.by_due.first_entry() {
                if e.key().0 > now {
                    break;
                }
                let ((_, slot), target) = e.remove_entry();
                s.at.remove(&slot);
                due.push(target);
            }
            due
        };
        for target in due {
            if let Some(target) = target.upgrade() {
                self.fired.fetch_add(1, Ordering::Relaxed);
                target.on_timer(now);
            }
        }
    }

    /// How many deadlines wait and how many have fired.
    pub fn counts(&self) -> TimerCounts {
        TimerCounts {
            entries: self.heap.lock().len() + self.slots.lock().by_due.len(),
            fired: self.fired.load(Ordering::Relaxed),
        }
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        let heap = self.heap.lock().peek().map(|e| e.at);
        let slot = self.slots.lock().by_due.first_key_value().map(|(k, _)| k.0);
        match (heap, slot) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

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

    struct Counts(AtomicU32);

    impl TimerTarget for Counts {
        fn on_timer(self: Arc<Self>, _now: Instant) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_slot_keeps_only_its_earliest_deadline() {
        let timers = Timers::default();
        let target = Arc::new(Counts(AtomicU32::new(0)));
        let weak: Weak<dyn TimerTarget> = Arc::downgrade(&target) as _;
        let slot = timers.new_slot();
        let t0 = Instant::now();
        for ms in (1..=100).rev() {
            timers.schedule_slot(slot, t0 + Duration::from_millis(ms), weak.clone());
        }
        timers.schedule_slot(slot, t0 + Duration::from_millis(50), weak.clone());
        assert_eq!(
            timers.counts().entries,
            1,
            "earlier ones replaced it, a later one did not"
        );
        assert_eq!(timers.next_deadline(), Some(t0 + Duration::from_millis(1)));
        timers.run_due(t0 + Duration::from_millis(100));
        assert_eq!(target.0.load(Ordering::Relaxed), 1);
        assert_eq!(timers.counts().entries, 0);
        timers.schedule_slot(slot, t0 + Duration::from_millis(200), weak);
        assert_eq!(
            timers.counts().entries,
            1,
            "a fired slot takes a new deadline"
        );
    }
}
