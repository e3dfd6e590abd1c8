//! What inspecting a store reports: each problem where it is, and what
//! every segment, checkpoint and queue of a group holds.

use super::*;

/// Something wrong, where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub offset: u64,
    pub what: String,
}

/// One segment as read.
#[derive(Clone, Debug, Default)]
pub struct SegmentReport {
    pub seq: u32,
    pub path: PathBuf,
    /// File length when read.
    pub bytes: u64,
    pub records: u64,
    pub publishes: u64,
    pub first_lsn: Option<u64>,
    pub last_lsn: Option<u64>,
    /// Records of messages still live (per the rebuilt index) in this
    /// segment: count and bytes.
    pub live_messages: u64,
    pub live_bytes: u64,
    /// Bytes after the header that are not live message records
    /// (acks, metadata, dead messages): what compaction could reclaim.
    pub dead_bytes: u64,
    /// Bytes at the end that do not (yet) form a whole record.
    pub tail_bytes: u64,
}

/// One checkpoint file as read.
#[derive(Clone, Debug)]
pub struct CheckpointReport {
    pub no: u64,
    pub path: PathBuf,
    pub bytes: u64,
    /// `None` when it does not decode (see the problems).
    pub info: Option<CheckpointInfo>,
    pub messages: u64,
}

/// Live messages of one queue in one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueReport {
    pub messages: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Oldest live message (ids grow in publish order) and its segment.
    pub oldest: Option<(MsgId, u32)>,
}

/// Live messages of one queue in one segment, with where its oldest and
/// newest are (so a tool can read them: a stream's offsets, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSegmentReport {
    pub messages: u64,
    /// Payload bytes.
    pub bytes: u64,
    pub oldest: (MsgId, Loc),
    pub newest: (MsgId, Loc),
}

/// Message-size histogram with log-2 buckets: bucket `i` counts sizes in
/// `[2^i, 2^(i+1))`, bucket 0 also counts size 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    pub buckets: BTreeMap<u32, u64>,
    pub count: u64,
    pub sum: u64,
    pub max: u64,
}

impl Histogram {
    pub fn add(&mut self, size: u64) {
        let bucket = if size < 2 { 0 } else { size.ilog2() };
        *self.buckets.entry(bucket).or_default() += 1;
        self.count += 1;
        self.sum += size;
        self.max = self.max.max(size);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (b, n) in &other.buckets {
            *self.buckets.entry(*b).or_default() += n;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Upper bound (exclusive) of the bucket holding the `q`-quantile
    /// (0.0..=1.0), capped at the largest size seen.
    pub fn quantile_upper(&self, q: f64) -> u64 {
        let rank = ((self.count as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (b, n) in &self.buckets {
            seen += n;
            if seen >= rank.max(1) {
                return (1u64 << (b + 1)).min(self.max.max(1));
            }
        }
        self.max
    }
}

/// Everything read from one group.
#[derive(Clone, Debug, Default)]
pub struct GroupReport {
    pub group: u32,
    pub dir: PathBuf,
    pub segments: Vec<SegmentReport>,
    pub checkpoints: Vec<CheckpointReport>,
    /// Checkpoint number the index was rebuilt from.
    pub checkpoint_used: Option<u64>,
    /// Restart cost: records and bytes after the checkpoint used.
    pub replay_records: u64,
    pub replay_bytes: u64,
    pub last_lsn: u64,
    pub live_messages: u64,
    pub live_payload_bytes: u64,
    pub queues: BTreeMap<QueueId, QueueReport>,
    /// Live messages by queue and segment.
    pub queue_segments: BTreeMap<(QueueId, u32), QueueSegmentReport>,
    /// Streams' records (Append), as their sparse indexes hold them.
    pub streams: BTreeMap<QueueId, crate::stream_index::StreamIndex>,
    /// Payload sizes of every Publish record in the journal.
    pub sizes: Histogram,
    /// Distinct queues named by Publish records in the journal.
    pub queues_published: u64,
    /// Metadata as rebuilt (the broker's definitions).
    pub meta: BTreeMap<Vec<u8>, Vec<u8>>,
    pub problems: Vec<Problem>,
    /// Not damage: a write in progress at the tail, a leftover temp file.
    pub notes: Vec<Problem>,
}
