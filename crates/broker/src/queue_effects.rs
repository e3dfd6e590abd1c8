//! What a queue operation leaves to do once the queue's lock is released,
//! and a queue's counters (kept apart from `queue.rs` so that file stays
//! under 800 lines).

use std::time::Instant;

use crate::dead_letter::DeadLetter;
use crate::durable::Done;

/// Work a queue operation leaves for after its lock is released.
#[derive(Default)]
pub struct Effects {
    pub dead: Vec<DeadLetter>,
    /// Stored messages that left the queue: journal their removal.
    pub removed: Vec<u64>,
    /// Completion to run once the removals are durable (transactions).
    pub done: Option<Done>,
    /// The queue should be deleted (auto-delete or x-expires).
    pub delete: bool,
    /// The queue's paging id, for removals of paging copies.
    pub paging_id: Option<u64>,
    pub timer_at: Option<Instant>,
}

/// Counters for the management view and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub ready: usize,
    pub ready_bytes: u64,
    /// Ready messages whose bodies are only on disk.
    pub paged_out: usize,
    pub unacked: usize,
    pub consumers: usize,
}
