//! A delayed exchange's pending messages (`x-delayed-message`): held,
//! ordered by the time they are due, until the vhost routes them
//! (`vhost/delayed.rs`). The rules of its arguments are in
//! `delayed_args.rs`.
//!
//! Invariants:
//! - Due messages are found without scanning: the index is ordered by
//!   (due time, message id), so taking what is due costs the number taken.
//! - An entry is small and fixed-size once its body is stored: a persistent
//!   message of a durable delayed exchange keeps its body in memory only
//!   until the journal reports it written, then only (due, id, length).
//! - A stored message leaves the index exactly once: when it is taken to
//!   be routed, when its write failed (its publish was nacked, so it is
//!   never routed), or with the whole index when the exchange goes.
//! - A stored message is taken to be routed only once its write is known
//!   to have succeeded: one due while its write is under way waits for it.
//! - The exchange has one timer deadline at most (a slot of the timers):
//!   ever shorter delays move it, never add to it.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use crate::message::Message;
use crate::timers::TimerTarget;

/// The exchange type of a delayed exchange, as the plugin and LavinMQ name it.
pub const DELAYED_EXCHANGE_TYPE: &str = "x-delayed-message";

/// The argument naming how a delayed exchange routes.
pub const DELAYED_TYPE_ARG: &str = "x-delayed-type";

/// Ordering key of a pending message: (due time in Unix ms, message id).
/// Ids are unique, so two messages due at once keep publish order.
pub type DueKey = (u64, u64);

/// How a stored message's write ended, as its completion reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored; `pages`: its body may leave memory (the journal reads
    /// bodies back).
    Stored { pages: bool },
    /// Not stored: the publisher was nacked, so it is never routed.
    Failed,
}

/// Where a resident message's write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// Not stored: held in memory only.
    None,
    /// Under way: not routed until it ends.
    Pending,
    /// Stored, body kept (the journal does not read bodies back).
    Done,
}

/// A pending message.
pub enum Held {
    /// The body is in memory: a message that is not stored (transient, or a
    /// non-durable exchange's), or one whose write has not completed yet.
    Resident { msg: Arc<Message>, stored: bool },
    /// Stored, body on disk only: read back when due.
    OnDisk,
}

/// A delayed exchange's pending messages.
pub struct Delayed {
    /// The journal id its stored messages are kept under (a durable
    /// delayed exchange), as a queue's are under the queue's.
    pub store_id: Option<u64>,
    pending: Mutex<Pending>,
    /// Stored messages whose write ended: pushed by journal completions
    /// (which must be short), applied by the next call on a broker thread.
    written: Mutex<Vec<(DueKey, WriteOutcome)>>,
    /// What the timers wake when a message is due, and the timers' slot
    /// it is woken through (set once, when the exchange is made; timers
    /// hold it weakly, so a deleted exchange's deadline lapses).
    due: OnceLock<(Arc<dyn TimerTarget>, u64)>,
    /// Messages routed once due, since the broker started.
    routed: AtomicU64,
    /// The latest a message was routed after its due time, in ms.
    lateness_ms_max: AtomicU64,
}

#[derive(Default)]
struct Pending {
    /// Every pending message, by due time: 16 bytes each in the B-tree.
    by_due: BTreeSet<DueKey>,
    /// Those whose bodies are still in memory, and their write.
    resident: HashMap<DueKey, (Arc<Message>, Write)>,
    /// Bodies held in memory, in bytes.
    resident_bytes: u64,
    /// Messages held in memory only (not stored), for their bound.
    memory_only: usize,
    /// The earliest due time a timer is set for, if any.
    timer_at_ms: Option<u64>,
}

/// What an operator sees of a delayed exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayedStats {
    /// Messages waiting (`messages_delayed`).
    pub messages: usize,
    /// When the first of them is due (Unix ms).
    pub next_due_unix_ms: Option<u64>,
    /// Bytes of bodies held in memory.
    pub resident_bytes: u64,
    /// Messages routed once due, since the broker started.
    pub routed: u64,
    /// The latest one of them was routed after its due time, in ms.
    pub lateness_ms_max: u64,
}

impl Delayed {
    pub fn new(store_id: Option<u64>) -> Self {
        Self {
            store_id,
            pending: Mutex::new(Pending::default()),
            written: Mutex::new(Vec::new()),
            due: OnceLock::new(),
            routed: AtomicU64::new(0),
            lateness_ms_max: AtomicU64::new(0),
        }
    }

    /// Sets what the timers wake, through which slot (once).
    pub fn set_due_target(&self, target: Arc<dyn TimerTarget>, slot: u64) {
        if self.due.set((target, slot)).is_err() {
            tracing::warn!("a delayed exchange's timer target was already set; keeping the first");
        }
    }

    /// What the timers wake and its slot, for scheduling.
    pub fn due_target(&self) -> Option<(Weak<dyn TimerTarget>, u64)> {
        self.due.get().map(|(t, slot)| (Arc::downgrade(t), *slot))
    }

    /// Holds a message until `key.0`. Returns the time a timer must be set
    /// for, if none is set early enough.
    pub fn hold(&self, key: DueKey, held: Held) -> Option<u64> {
        self.apply_written();
        let mut p = self.pending.lock();
        if let Held::Resident { msg, stored } = held {
            p.resident_bytes += msg.body_bytes();
            let write = if stored { Write::Pending } else { Write::None };
            p.memory_only += usize::from(!stored);
            p.resident.insert(key, (msg, write));
        }
        p.by_due.insert(key);
        p.needs_timer(key.0)
    }

    /// Holds stored messages whose bodies are on disk (a restart puts
    /// millions back): one lock, and the index built in one pass from
    /// the keys sorted, not one B-tree insert in random order each.
    /// Returns the time a timer must be set for, as [`Delayed::hold`].
    pub fn hold_on_disk(&self, mut keys: Vec<DueKey>) -> Option<u64> {
        let first = keys.iter().min()?.0;
        let mut p = self.pending.lock();
        keys.extend(std::mem::take(&mut p.by_due));
        // Collecting a vector reuses its buffer; the set sorts it and
        // builds its nodes in one pass.
        p.by_due = keys.into_iter().collect();
        p.needs_timer(first)
    }

    /// A stored message's write ended (called from the completion: it
    /// only records the outcome).
    pub fn note_written(&self, key: DueKey, outcome: WriteOutcome) {
        self.written.lock().push((key, outcome));
    }

    /// Messages held in memory only, for their bound.
    pub fn memory_only(&self) -> usize {
        self.pending.lock().memory_only
    }

    /// Ended writes take effect: a stored body leaves memory (if the
    /// journal reads it back), a failed one's message leaves the index.
    fn apply_written(&self) {
        let done = std::mem::take(&mut *self.written.lock());
        if done.is_empty() {
            return;
        }
        let mut p = self.pending.lock();
        for (key, outcome) in done {
            // Not pending: discarded meanwhile, or never stored.
            let Some((_, write)) = p.resident.get_mut(&key) else {
                continue;
            };
            if *write != Write::Pending {
                continue;
            }
            match outcome {
                WriteOutcome::Stored { pages: false } => *write = Write::Done,
                WriteOutcome::Stored { pages: true } => {
                    let (msg, _) = p.resident.remove(&key).expect("found just above");
                    p.resident_bytes -= msg.body_bytes();
                }
                WriteOutcome::Failed => {
                    let (msg, _) = p.resident.remove(&key).expect("found just above");
                    p.resident_bytes -= msg.body_bytes();
                    p.by_due.remove(&key);
                }
            }
        }
        if p.resident.is_empty() {
            p.resident = HashMap::new(); // its capacity goes too
        }
    }

    /// Takes up to `max` messages due at `now_ms`, earliest first.
    pub fn take_due(&self, now_ms: u64, max: usize) -> Vec<(DueKey, Held)> {
        self.apply_written();
        let mut p = self.pending.lock();
        p.timer_at_ms = None;
        let mut out = Vec::new();
        while out.len() < max {
            let k = match p.by_due.first() {
                Some(k) if k.0 <= now_ms => *k,
                _ => break,
            };
            if p.resident
                .get(&k)
                .is_some_and(|(_, w)| *w == Write::Pending)
            {
                // Its write may yet fail (a nack): it waits for the outcome,
                // and what is due after it with it (a write takes one fsync).
                break;
            }
            p.by_due.pop_first();
            let h = match p.resident.remove(&k) {
                Some((msg, write)) => {
                    p.resident_bytes -= msg.body_bytes();
                    p.memory_only -= usize::from(write == Write::None);
                    Held::Resident {
                        msg,
                        stored: write != Write::None,
                    }
                }
                None => Held::OnDisk,
            };
            out.push((k, h));
        }
        out
    }

    /// After [`Delayed::take_due`]: the time the next timer must be set
    /// for, if any message is left.
    pub fn rearm(&self) -> Option<u64> {
        let mut p = self.pending.lock();
        let next = p.by_due.first().map(|k| k.0)?;
        p.needs_timer(next)
    }

    /// Every pending message leaves (the exchange is deleted); returns how
    /// many there were.
    pub fn discard_all(&self) -> usize {
        self.written.lock().clear();
        let mut p = self.pending.lock();
        let n = p.by_due.len();
        *p = Pending::default();
        n
    }

    /// A message was routed `lateness_ms` after it was due.
    pub fn note_routed(&self, lateness_ms: u64) {
        self.routed.fetch_add(1, Ordering::Relaxed);
        self.lateness_ms_max
            .fetch_max(lateness_ms, Ordering::Relaxed);
    }

    pub fn stats(&self) -> DelayedStats {
        self.apply_written();
        let p = self.pending.lock();
        DelayedStats {
            messages: p.by_due.len(),
            next_due_unix_ms: p.by_due.first().map(|k| k.0),
            resident_bytes: p.resident_bytes,
            routed: self.routed.load(Ordering::Relaxed),
            lateness_ms_max: self.lateness_ms_max.load(Ordering::Relaxed),
        }
    }
}

impl Pending {
    /// Whether a timer must be set for `due` (none set, or one set later).
    fn needs_timer(&mut self, due: u64) -> Option<u64> {
        if self.timer_at_ms.is_some_and(|t| t <= due) {
            return None;
        }
        self.timer_at_ms = Some(due);
        Some(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_body_leaves_memory_once_its_write_completed() {
        let m = Message::new(
            String::new(),
            "k".into(),
            bytes::Bytes::from_static(b"\x00\x00"),
            "body".into(),
        )
        .unwrap();
        let d = Delayed::new(Some(9));
        d.hold(
            (10, 1),
            Held::Resident {
                msg: Arc::clone(&m),
                stored: true,
            },
        );
        d.hold(
            (10, 2),
            Held::Resident {
                msg: m,
                stored: false,
            },
        );
        assert_eq!(d.stats().resident_bytes, 8);
        d.note_written((10, 1), WriteOutcome::Stored { pages: true });
        d.note_written((10, 2), WriteOutcome::Stored { pages: true }); // not stored: stays
        assert_eq!(d.stats().resident_bytes, 4);
        let got = d.take_due(10, 10);
        assert!(matches!(got[0], ((10, 1), Held::OnDisk)));
        assert!(matches!(
            got[1],
            ((10, 2), Held::Resident { stored: false, .. })
        ));
        assert_eq!(d.stats().resident_bytes, 0);
    }

    #[test]
    fn due_messages_come_out_in_due_order_and_only_when_due() {
        let d = Delayed::new(Some(9));
        assert_eq!(d.hold((300, 1), Held::OnDisk), Some(300));
        assert_eq!(
            d.hold((100, 2), Held::OnDisk),
            Some(100),
            "earlier: new timer"
        );
        assert_eq!(
            d.hold((200, 3), Held::OnDisk),
            None,
            "a timer is set earlier"
        );
        assert!(d.take_due(99, 10).is_empty());
        let got: Vec<DueKey> = d.take_due(250, 10).into_iter().map(|(k, _)| k).collect();
        assert_eq!(got, [(100, 2), (200, 3)]);
        assert_eq!(d.rearm(), Some(300));
        assert_eq!(d.stats().messages, 1);
        assert_eq!(d.stats().next_due_unix_ms, Some(300));
        assert_eq!(d.discard_all(), 1);
        assert_eq!(d.stats().messages, 0);
        assert_eq!(d.stats().next_due_unix_ms, None);
    }
}
