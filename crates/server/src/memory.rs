//! What the memory alarm counts besides message bodies: bytes the server
//! itself holds on behalf of clients — output buffered for sockets (and
//! being written), and bodies of publishes whose frames are still
//! arriving. Message bytes are the broker's count
//! (`berth_broker::message::message_bytes`).
//!
//! Invariants:
//! - Every byte added to a counter here is taken off again exactly once,
//!   by the [`Counted`] guard that added it, whenever its holder goes away
//!   (including a task aborted mid-write), so the counters never drift.

use std::sync::atomic::{AtomicU64, Ordering};

/// Output bytes of every connection: buffered for the writer, or taken by
/// it and not written yet.
pub static OUTPUT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Body bytes of publishes still being assembled, all channels.
pub static ASSEMBLING_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes the memory alarm compares with `limits.memory_high_watermark_bytes`.
pub fn used_bytes() -> u64 {
    berth_broker::message::message_bytes()
        + OUTPUT_BYTES.load(Ordering::Relaxed)
        + ASSEMBLING_BYTES.load(Ordering::Relaxed)
}

/// A holder's share of one counter: [`Counted::set`] moves the counter by
/// the difference, and dropping the guard takes the share off.
#[derive(Debug)]
pub struct Counted {
    counter: &'static AtomicU64,
    bytes: u64,
}

impl Counted {
    pub const fn new(counter: &'static AtomicU64) -> Self {
        Self { counter, bytes: 0 }
    }

    /// This holder now holds `bytes`.
    pub fn set(&mut self, bytes: u64) {
        if bytes > self.bytes {
            self.counter
                .fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else if bytes < self.bytes {
            self.counter
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_COUNTER: AtomicU64 = AtomicU64::new(0);

    #[test]
    fn a_guard_takes_off_exactly_what_it_added() {
        let mut a = Counted::new(&TEST_COUNTER);
        let mut b = Counted::new(&TEST_COUNTER);
        a.set(100);
        b.set(50);
        a.set(30);
        assert_eq!(TEST_COUNTER.load(Ordering::Relaxed), 80);
        drop(a);
        assert_eq!(TEST_COUNTER.load(Ordering::Relaxed), 50);
        b.set(0);
        drop(b);
        assert_eq!(TEST_COUNTER.load(Ordering::Relaxed), 0);
    }
}
