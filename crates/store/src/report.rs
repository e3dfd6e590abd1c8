//! What the store reports: what opening found on disk, and what each
//! group has counted since.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;

use crate::{MsgId, QueueId};

/// A damaged range found and quarantined during recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamageReport {
    pub group: u32,
    pub file: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// Where the damaged bytes were copied.
    pub quarantine_file: PathBuf,
    /// Records known lost (from the sequence-number gap), if a valid
    /// record followed in the same segment.
    pub records_lost: Option<u64>,
    /// Messages (and their queues) named by damaged publish headers that
    /// could still be read; unverified, for the operator.
    pub messages: Vec<MsgId>,
    pub queues: Vec<QueueId>,
    pub reason: String,
}

/// One message of a recovered queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveredMessage {
    pub msg: MsgId,
    /// Payload size in bytes (without store framing).
    pub payload_len: u32,
}

/// What `Store::open` found on disk.
#[derive(Debug)]
pub struct Recovered {
    /// Every metadata key with its last written value.
    pub metadata: BTreeMap<Bytes, Bytes>,
    /// Per queue, its live messages in id (= publish) order. A message that
    /// survives a restart may have been delivered before it: the broker
    /// should set `redelivered` on its first delivery.
    pub queues: BTreeMap<QueueId, Vec<RecoveredMessage>>,
    /// Per stream (queues written with `Store::append`), its bounds and
    /// size from the sparse index: no record is read.
    pub streams: BTreeMap<QueueId, RecoveredStream>,
    /// Damage found and quarantined (empty after a clean run).
    pub damage: Vec<DamageReport>,
    pub stats: RecoveryStats,
    /// Above every message id ever stored: seed for a caller-side id
    /// allocator ([`Store::next_msg_id`] already starts here).
    pub next_msg_id: MsgId,
}

#[derive(Debug, Default, Clone)]
pub struct RecoveryStats {
    pub groups: u32,
    pub records_replayed: u64,
    pub bytes_scanned: u64,
    pub truncated_bytes: u64,
    pub checkpoints_used: u32,
    pub checkpoints_ignored: Vec<PathBuf>,
    pub duration: Duration,
}

/// Counters of one group.
#[derive(Debug, Default, Clone)]
pub struct GroupStats {
    pub group: u32,
    /// A failed fdatasync (or write, other than for space) stopped the
    /// group: it refuses writes until the store is reopened.
    pub poisoned: bool,
    /// What poisoned it, when it is.
    pub poisoned_by: Option<String>,
    /// While the group waits for disk space (a write found the disk
    /// full): the error its writes are refused with. Clears by itself.
    pub no_space: Option<String>,
    pub live_messages: u64,
    /// Estimated heap bytes of the group's message index (hash table
    /// slots at their current capacity plus multi-queue side entries).
    pub index_bytes: u64,
    /// Points of the streams' sparse indexes (a stream's records have no
    /// entry of their own; `live_messages` does not count them).
    pub stream_index_points: u64,
    pub segments: u64,
    pub batches: u64,
    pub records: u64,
    pub bytes_written: u64,
    pub syncs: u64,
    pub sync_us_total: u64,
    pub gather_waits: u64,
    /// Longest gathering pause planned, µs (at most `commit_delay_us_max`).
    pub gather_us_max: u64,
    pub netted_publishes: u64,
    pub checkpoints: u64,
    /// Checkpoints that cloned the index on the writer's path: when the
    /// journal cannot rebuild it, or when it was drained since the last
    /// checkpoint and is at most 4 MiB (cheaper than a delta listing every
    /// removal). Otherwise a checkpoint is built from the previous one and
    /// the journal.
    pub checkpoint_snapshots: u64,
    pub segments_deleted: u64,
    /// Sealed segments dropped from the page cache once cold
    /// (`StoreConfig::segment_cache_bytes`).
    pub segments_uncached: u64,
    pub bytes_compacted: u64,
    /// Live records compaction found unreadable and left in place (each
    /// also logged with its file and offset).
    pub unreadable_records: u64,
    /// fdatasync latency, µs.
    pub sync_latency_us: crate::histogram::HistogramSnapshot,
    /// Records per write batch.
    pub batch_records: crate::histogram::HistogramSnapshot,
    /// Bytes of the group's segment files.
    pub segment_bytes: u64,
    /// Bytes of live records in them (the rest is dead: reclaimable).
    pub live_bytes: u64,
    /// Time this group's recovery took when the store opened.
    pub recovery: Duration,
    /// The newest record known fdatasynced ([`crate::Store::durable_lsn`]).
    pub durable_lsn: u64,
    /// Heap bytes the writer keeps for encoding batches: up to a batch's
    /// size while writes come, nothing once the group has been idle for
    /// `segment_idle_roll_ms`.
    pub write_buffer_bytes: u64,
}

/// A stream as recovery found it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveredStream {
    /// The first offset kept, and the offset after the newest record.
    pub first: u64,
    pub end: u64,
    /// Records kept (the first offsets' estimated from offsets when the
    /// head span was cut by a trim).
    pub messages: u64,
    /// Record bytes kept.
    pub bytes: u64,
    /// Ascending `(offset, bytes of the stream before it)` at each index
    /// point (bytes estimated within a segment): where a caller can cut the
    /// stream into pieces of a given size without reading it.
    pub marks: Vec<(u64, u64)>,
}
