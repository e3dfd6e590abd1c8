//! Every tunable of the store, with its unit in its name and its default.
//!
//! Invariants:
//! - Each limit has exactly one home: this file. Other modules read them from
//!   [`StoreConfig`]; none hard-codes a number that an operator may want to
//!   change.
//! - [`StoreConfig::validate`] is called by `Store::open` before any file is
//!   touched, so the rest of the crate may rely on the bounds it checks.

use std::path::PathBuf;

use crate::error::StoreError;

/// When the group writer calls `fdatasync`, and therefore what a completion
/// promises (see docs/DURABILITY.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Complete a write only after the batch holding it was fdatasync'ed.
    /// Survives power loss. The default.
    Always,
    /// Complete after `write(2)`; fdatasync at most every
    /// `sync_interval_ms`. Survives a process crash, not a power loss.
    Interval,
    /// Complete after `write(2)`; fdatasync only when a segment is sealed,
    /// before a checkpoint and at shutdown.
    Never,
}

/// Most log groups a store may have: each is a writer thread and a
/// recovery thread, so the manifest's `group_count` is refused above it too.
pub const LOG_GROUPS_MAX: u32 = 4096;

/// Hard ceiling for `commit_delay_us_max`: the issue demands the gathering
/// delay "never exceed a few ms".
pub const COMMIT_DELAY_US_CEILING: u64 = 5_000;

/// How often a log group whose write met a full disk (ENOSPC, EDQUOT)
/// probes for free space; meanwhile it refuses writes at once. Short,
/// because each refused publish is a nack; long enough that a full disk
/// costs one small `pwrite` per group per period, not a busy loop.
pub const NO_SPACE_RETRY_MS: u64 = 250;

/// A group writer prepares its next segment (zeros written ahead, see
/// `StoreConfig::segment_prepare`) only while the fdatasyncs its recent
/// bytes went out with carried at most this many bytes (an average
/// weighted by bytes, over about `PREPARE_SYNC_AVG_BYTES`). A prepared
/// segment saves each fdatasync its inode write (~80 µs on the reference
/// disk) at the price of writing every byte of the segment twice: it pays
/// for itself below ~30 KB per fdatasync (lone and concurrent confirmed
/// publishers: a few KB) and costs bandwidth and CPU above it (bulk
/// publishing: hundreds of KB).
pub const PREPARE_SYNC_BYTES_MAX: u64 = 64 * 1024;

/// The bytes over which that average is taken. Weighted by bytes, so a
/// burst of small fdatasyncs that writes little (acks removing what a
/// bulk publish wrote) does not start a preparation whose segment the
/// next bulk publish would fill.
pub const PREPARE_SYNC_AVG_BYTES: u64 = 4 * 1024 * 1024;

/// Default of `StoreConfig::segment_cache_bytes`: four segments of the
/// default size per group, and more than the checkpoint that reads them
/// back needs (it reads at most `checkpoint_journal_bytes` since the
/// previous one, and is waited for besides).
pub const SEGMENT_CACHE_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;

/// Largest record body the decoder accepts. Bounded so that a corrupt length
/// field can never make recovery allocate gigabytes. 129 MiB: the largest
/// message RabbitMQ accepts by default (128 MiB) plus room for what the
/// broker stores beside a body (names and properties, under 1 MiB with any
/// frame size a client can negotiate by default).
pub const RECORD_BODY_BYTES_MAX: u32 = 129 * 1024 * 1024;

/// Largest payload of one message: [`RECORD_BODY_BYTES_MAX`] minus room
/// for the publish record's own header (64 KiB).
pub const PAYLOAD_BYTES_MAX: u32 = RECORD_BODY_BYTES_MAX - 64 * 1024;

/// Most message ids one Remove record carries (512 KiB of ids). A removal
/// of more (mass expiry, a huge `multiple` ack) is written as several
/// records in one batch, so no request can exceed
/// [`RECORD_BODY_BYTES_MAX`].
pub const REMOVE_MSGS_PER_RECORD_MAX: usize = 64 * 1024;

/// Longest a backup of a running store waits for every group's writer to
/// pause for its cut. A writer pauses between batches, so this is at most
/// one batch (one write and one fdatasync) or one compaction step; past
/// it the backup fails with an error and every writer resumes.
pub const BACKUP_PAUSE_WAIT_MS_MAX: u64 = 5_000;

/// Longest a group's writer stays paused for a backup's cut. The cut only
/// lists and opens the groups' files (milliseconds); a writer still held
/// at this bound resumes on its own and that backup fails, so a stuck
/// backup can never stall publishers for longer.
pub const BACKUP_PAUSE_HOLD_MS_MAX: u64 = BACKUP_PAUSE_WAIT_MS_MAX + 5_000;

/// Configuration of a store. Build with [`StoreConfig::new`] and adjust
/// fields; every field documents its default.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Directories holding the groups; group `g` lives in
    /// `data_dirs[g % data_dirs.len()]`. One per disk is the intended use.
    pub data_dirs: Vec<PathBuf>,
    /// Number of log groups for a *new* store. An existing store keeps the
    /// count recorded in its manifest (queue placement depends on it).
    /// Default: [`default_log_groups`].
    pub log_groups: u32,
    /// When the writer fdatasyncs. Default: `Always`.
    pub sync: SyncMode,
    /// Period of the background fdatasync in `SyncMode::Interval`.
    /// Default 200 ms.
    pub sync_interval_ms: u64,
    /// Upper bound of the extra gathering pause a writer may take when
    /// several committers are active. A lone committer never waits.
    /// Default 500 µs; must not exceed [`COMMIT_DELAY_US_CEILING`].
    pub commit_delay_us_max: u64,
    /// A segment is sealed and a new one started once it would grow past
    /// this. A single larger record gets a segment of its own.
    /// Default 64 MiB. Must be below 4 GiB (offsets are 32-bit).
    pub segment_size_bytes: u64,
    /// Requests a group's queue holds before `Store::poll_room` says it is
    /// full (back-pressure by admission: sending never blocks). Default
    /// 8192.
    pub channel_requests_max: usize,
    /// The writer stops draining its channel into one batch past this many
    /// bytes. Default 8 MiB.
    pub batch_bytes_max: usize,
    /// Largest payload accepted for one message. Default and ceiling:
    /// [`PAYLOAD_BYTES_MAX`].
    pub payload_bytes_max: u32,
    /// A checkpoint is written once this much journal accumulated since
    /// the previous one, bounding replay work at restart. Default 64 MiB.
    pub checkpoint_journal_bytes: u64,
    /// ... or this long after the previous one if anything was written.
    /// Default 30 000 ms.
    pub checkpoint_interval_ms: u64,
    /// An active segment idle this long is sealed so its space can be
    /// reclaimed. Default 10 000 ms.
    pub segment_idle_roll_ms: u64,
    /// Each group writer prepares its next segment on a helper thread:
    /// a file written with zeros to `segment_size_bytes` and fdatasynced,
    /// renamed into place at the roll. An fdatasync into it then changes
    /// no file size, so it writes no inode (88-120 µs for an 8 KB write on
    /// the reference disk, 164-226 µs into a growing file). Only while
    /// the group's fdatasyncs are small (`PREPARE_SYNC_BYTES_MAX`): under
    /// bulk writes the zeros would cost more than they save. Default true.
    pub segment_prepare: bool,
    /// Each group writer appends to its active segment past the page
    /// cache (`O_DIRECT`) where the file system allows it: a batch goes
    /// from the writer's buffer to the device, not through freshly
    /// allocated cache pages, and the fdatasync only flushes. Messages read
    /// back from the journal ([`Store::read_many`], a queue's read-ahead)
    /// come past the page cache too, from segments appended so and from
    /// those found when the store opened, and a prepared segment's zeros
    /// go past it too (`segment_prepare`). Other reads (checkpoints,
    /// recovery, inspection) use the page cache. Default true.
    ///
    /// [`Store::read_many`]: crate::Store::read_many
    pub direct_appends: bool,
    /// Bytes of each group's newest journal left to the page cache: a
    /// sealed segment that this many bytes were written after (and that
    /// no checkpoint still has to read) is dropped from the cache
    /// (`posix_fadvise(DONTNEED)`), once. So a deep backlog does not keep
    /// taking fresh memory for cache nobody reads soon, and new writes
    /// reuse the pages dropped; a consumer this far behind reads from the
    /// disk. 0: never drop (the kernel alone decides). Default
    /// [`SEGMENT_CACHE_BYTES_DEFAULT`].
    pub segment_cache_bytes: u64,
    /// A sealed segment whose live bytes are below this fraction (in
    /// percent) of its size is compacted. Default 50.
    pub compaction_live_percent_max: u8,
    /// Bytes of live records compaction copies per writer turn, so that it
    /// never holds up commits for long. Default 1 MiB.
    pub compaction_bytes_per_turn: usize,
    /// Pause between two background compaction turns, bounding its I/O to
    /// `compaction_bytes_per_turn` per pause. Default 10 ms.
    pub compaction_pause_ms: u64,
    /// Period of recovery progress log lines. Default 2 000 ms.
    pub recovery_progress_interval_ms: u64,
    /// What recovery does when a segment that should hold live messages is
    /// missing. `false` (the default): refuse to open, naming the file, so
    /// the operator restores it from a backup. `true`: open anyway, dropping
    /// those messages, each listed in `Recovered::damage` and the log; an
    /// explicit, one-off acceptance of the loss.
    pub accept_missing_segments: bool,
}

/// Default number of log groups: one per core, at least 2 and at most 16.
/// The seed experiments show the gain tailing off once groups ≈ concurrent
/// writers; cores bound how many writers can run at once.
pub fn default_log_groups() -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    u32::try_from(cores).unwrap_or(16).clamp(2, 16)
}

impl StoreConfig {
    /// Defaults for a store in `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dirs: vec![data_dir.into()],
            log_groups: default_log_groups(),
            sync: SyncMode::Always,
            sync_interval_ms: 200,
            commit_delay_us_max: 500,
            segment_size_bytes: 64 * 1024 * 1024,
            channel_requests_max: 8192,
            batch_bytes_max: 8 * 1024 * 1024,
            payload_bytes_max: PAYLOAD_BYTES_MAX,
            checkpoint_journal_bytes: 64 * 1024 * 1024,
            checkpoint_interval_ms: 30_000,
            segment_idle_roll_ms: 10_000,
            segment_prepare: true,
            direct_appends: true,
            segment_cache_bytes: SEGMENT_CACHE_BYTES_DEFAULT,
            compaction_live_percent_max: 50,
            compaction_bytes_per_turn: 1024 * 1024,
            compaction_pause_ms: 10,
            recovery_progress_interval_ms: 2_000,
            accept_missing_segments: false,
        }
    }

    /// Checks the bounds the rest of the crate relies on.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |what: String| Err(StoreError::Config(what));
        if self.data_dirs.is_empty() {
            return bad("data_dirs is empty".into());
        }
        if self.log_groups == 0 || self.log_groups > LOG_GROUPS_MAX {
            return bad(format!(
                "log_groups = {} (expected 1..={LOG_GROUPS_MAX})",
                self.log_groups
            ));
        }
        if self.commit_delay_us_max > COMMIT_DELAY_US_CEILING {
            return bad(format!(
                "commit_delay_us_max = {} exceeds the ceiling of {COMMIT_DELAY_US_CEILING} µs",
                self.commit_delay_us_max
            ));
        }
        if self.segment_size_bytes < 4096 || self.segment_size_bytes >= u64::from(u32::MAX) {
            return bad(format!(
                "segment_size_bytes = {} (expected 4096..4 GiB)",
                self.segment_size_bytes
            ));
        }
        if self.payload_bytes_max == 0 || self.payload_bytes_max > PAYLOAD_BYTES_MAX {
            return bad(format!("payload_bytes_max = {}", self.payload_bytes_max));
        }
        if self.channel_requests_max == 0 || self.batch_bytes_max == 0 {
            return bad("channel_requests_max and batch_bytes_max must be > 0".into());
        }
        if self.sync == SyncMode::Interval && self.sync_interval_ms == 0 {
            return bad("sync_interval_ms must be > 0 in interval mode".into());
        }
        if self.compaction_live_percent_max > 100 {
            return bad("compaction_live_percent_max must be <= 100".into());
        }
        Ok(())
    }
}

/// Longest checkpoint chain (a base and its deltas) before the next
/// checkpoint is a base whatever the deltas add up to: bounds the files a
/// restart reads and the checkpoints a group directory holds.
pub const CHECKPOINT_CHAIN_LINKS_MAX: usize = 256;

/// A checkpoint copies the index (a base, on the writer's path) instead of
/// reading the journal since the last one when the index holds fewer than
/// 1/this of the messages it held at the last checkpoint (a drained
/// backlog) ...
pub const INDEX_DRAINED_FRACTION: usize = 8;
/// ... and its heap bytes are at most this (a copy under the index lock
/// of about a millisecond).
pub const INDEX_COPY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The writer keeps the index ops of the records it wrote since the last
/// checkpoint started (`writer/facts.rs`), so the next checkpoint need not
/// read that journal back; past this many bytes it drops them and that
/// checkpoint reads the journal instead. An op is smaller than its record
/// (it has no payload), so with 2 KiB messages the default 64 MiB between
/// checkpoints needs about 1 MiB of them.
pub const CHECKPOINT_FACTS_BYTES_MAX: usize = 8 * 1024 * 1024;

/// A stream's sparse index (`stream_index.rs`) keeps one point every this
/// many of its records in a segment: a read from any offset scans at most
/// this many of the stream's records (plus what other queues wrote
/// between them) before it reaches it. 16 bytes per point, so memory is
/// about 0.125 bytes per stream message.
pub const STREAM_INDEX_STRIDE_RECORDS: u64 = 128;

/// ... or, for large messages, every this many bytes of the segment, so a
/// seek never scans more than about this much.
pub const STREAM_INDEX_STRIDE_BYTES: u32 = 256 * 1024;

/// A stream read (`Store::read_stream`) reads its segment in blocks of
/// this size (a larger record gets a block of its own).
pub const STREAM_READ_BLOCK_BYTES: usize = 256 * 1024;

/// Threads each group's recovery uses at most to list its queues'
/// messages for the broker (`Index::live_by_queue`): one per core up to
/// this. Groups recover in parallel, but a group can hold more queues
/// than another (queues made before the broker balanced its placement:
/// on the 2-core VM the group holding 7 of 10 queues ran alone for most
/// of a restart).
pub const LISTING_THREADS_MAX: usize = 8;

/// Messages of a checkpoint's run sorted by table slot before they are
/// inserted (`Index::load_run`): 32 bytes each, so 32 MiB at most while a
/// checkpoint loads. Chunks of 65,536 gained a tenth of what 1,048,576 did.
pub const LOAD_SLOT_ORDER_CHUNK: usize = 1 << 20;
