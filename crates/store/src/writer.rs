//! The group writer: one dedicated thread per log group that turns requests
//! into journal records with adaptive group commit, and keeps the group's
//! space in check (segment roll, checkpoints, deletion, compaction).
//!
//! Invariants:
//! - Only this thread writes the group's files and mutates its index, so
//!   journal order is the order of [`Index::apply`] calls.
//! - A request's completion runs after its batch was written, and — in
//!   `SyncMode::Always`, or for a `Flush` — after a successful fdatasync
//!   covering it. Every completion runs exactly once.
//! - A failed write or fdatasync poisons the group: the batch fails, every
//!   later request fails, and nothing reports success that was not synced.
//! - No request can make the writer panic: a request too large for one
//!   record is split (Remove) or refused (see [`Op::invalid`]). Should the
//!   thread die anyway (a bug), its group is poisoned, every request it
//!   held or receives later fails ([`Waiter`] completes on drop), and
//!   shutdown reports it.
//! - A lone committer never waits: the gathering pause is taken only when
//!   the previous batch was shared by several committers and they came
//!   back straight away (see [`GatherPolicy`]), and never exceeds
//!   `commit_delay_us_max`. Every reading of time goes through the
//!   injected [`Clock`].
//! - A checkpoint's index is rebuilt on its helper thread from the previous
//!   checkpoint and the (synced, immutable) journal after it; the writer
//!   copies the live index only when the journal cannot rebuild it.
//! - A segment is sealed (fdatasync'ed) before the next one is created, and
//!   deleted only when it holds no live message and lies wholly before the
//!   replay position of both retained checkpoints.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::checkpoint::{self, CheckpointInfo, ReplayFrom, CHECKPOINT_TMP_NAME};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::limits::{StoreConfig, SyncMode, RECORD_BODY_BYTES_MAX, REMOVE_MSGS_PER_RECORD_MAX};
use crate::record::{self, Decoded, Record};
use crate::segment::{self, SEGMENT_HEADER_BYTES};
use crate::storage::{Storage, StorageFile};
use crate::{MsgId, QueueId};

/// A completion callback. Runs on the writer thread: keep it short (send on
/// a channel, wake a task).
pub type Done = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// A request's completion, run exactly once: by the writer with the
/// request's outcome, or, if it is dropped without that (the writer thread
/// died), with `Poisoned` — so no caller ever waits forever.
pub(crate) struct Waiter {
    done: Option<Done>,
    group: u32,
}

impl Waiter {
    pub fn new(done: Done, group: u32) -> Self {
        Waiter {
            done: Some(done),
            group,
        }
    }

    pub fn complete(mut self, result: Result<(), StoreError>) {
        if let Some(done) = self.done.take() {
            done(result);
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done(Err(StoreError::Poisoned {
                group: self.group,
                cause: Arc::new(StoreError::WriterDied {
                    group: self.group,
                    reason: "it stopped before completing this request".into(),
                }),
            }));
        }
    }
}

/// A request to a group.
pub(crate) enum Op {
    Publish {
        msg: MsgId,
        queues: Vec<QueueId>,
        payload: Bytes,
    },
    Remove {
        queue: QueueId,
        msgs: Vec<MsgId>,
    },
    MetaPut {
        key: Bytes,
        value: Bytes,
    },
    MetaDelete {
        key: Bytes,
    },
    Purge {
        queue: QueueId,
    },
    /// Completes once everything before it is fdatasync'ed, in any mode.
    Flush,
}

impl Op {
    /// The records this request is written as: none for a `Flush` or a
    /// request netted out, several for a Remove of more than
    /// [`REMOVE_MSGS_PER_RECORD_MAX`] messages, else one.
    fn records(&self) -> Vec<Record<'_>> {
        match self {
            Op::Publish { queues, .. } if queues.is_empty() => Vec::new(),
            Op::Publish {
                msg,
                queues,
                payload,
            } => vec![Record::Publish {
                msg: *msg,
                queues: queues.as_slice().into(),
                payload,
            }],
            Op::Remove { queue, msgs } => msgs
                .chunks(REMOVE_MSGS_PER_RECORD_MAX)
                .map(|chunk| Record::Remove {
                    queue: *queue,
                    msgs: chunk.into(),
                })
                .collect(),
            Op::MetaPut { key, value } => vec![Record::MetaPut { key, value }],
            Op::MetaDelete { key } => vec![Record::MetaDelete { key }],
            Op::Purge { queue } => vec![Record::Purge { queue: *queue }],
            Op::Flush => Vec::new(),
        }
    }

    /// Why this request cannot be written, if it cannot: a record body
    /// beyond [`RECORD_BODY_BYTES_MAX`] (the store checks payloads against
    /// `payload_bytes_max` first; this catches what that does not bound).
    pub(crate) fn invalid(&self) -> Option<String> {
        let body = match self {
            Op::Publish {
                queues, payload, ..
            } => return publish_invalid(queues.len(), payload.len()),
            Op::MetaPut { key, value } => record::META_OFF_KEY
                .saturating_add(key.len())
                .saturating_add(value.len()),
            Op::MetaDelete { key } => key.len(),
            Op::Remove { .. } | Op::Purge { .. } | Op::Flush => 0,
        };
        body_invalid(body)
    }

    fn size_hint(&self) -> usize {
        match self {
            Op::Publish {
                payload, queues, ..
            } => payload.len() + 8 * queues.len() + 32,
            Op::Remove { msgs, .. } => 8 * msgs.len() + 32,
            Op::MetaPut { key, value } => key.len() + value.len() + 32,
            Op::MetaDelete { key } => key.len() + 32,
            Op::Purge { .. } | Op::Flush => 32,
        }
    }
}

pub(crate) enum Cmd {
    Write {
        op: Op,
        done: Option<Waiter>,
    },
    Checkpoint {
        done: Done,
    },
    /// Compacts every eligible segment now, unbounded (tests, operator tool).
    Compact {
        done: Done,
    },
    Shutdown {
        done: Option<Done>,
    },
}

/// Counters of one group, readable at any time.
#[derive(Default)]
pub struct GroupCounters {
    pub batches: AtomicU64,
    pub records: AtomicU64,
    pub bytes_written: AtomicU64,
    pub syncs: AtomicU64,
    pub sync_us_total: AtomicU64,
    pub gather_waits: AtomicU64,
    /// Longest gathering pause planned, in µs (never above the cap).
    pub gather_us_max: AtomicU64,
    pub netted_publishes: AtomicU64,
    pub checkpoints: AtomicU64,
    /// Checkpoints whose index was cloned on the writer's path, under the
    /// index lock (only when the journal alone cannot rebuild it).
    pub checkpoint_snapshots: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub bytes_compacted: AtomicU64,
    /// Live records compaction found unreadable (I/O error or checksum):
    /// reported and left in place.
    pub unreadable_records: AtomicU64,
}

/// What readers share with the writer.
pub(crate) struct Shared {
    pub index: Index,
    pub files: BTreeMap<u32, Arc<dyn StorageFile>>,
}

pub(crate) struct GroupShared {
    pub group: u32,
    /// The store's record salt: seeds every record checksum.
    pub salt: u32,
    pub dir: PathBuf,
    pub inner: Mutex<Shared>,
    pub poisoned: Mutex<Option<Arc<StoreError>>>,
    pub counters: GroupCounters,
}

impl GroupShared {
    pub fn poison_error(&self) -> Option<StoreError> {
        self.poisoned
            .lock()
            .as_ref()
            .map(|cause| StoreError::Poisoned {
                group: self.group,
                cause: Arc::clone(cause),
            })
    }
}

struct Active {
    seq: u32,
    file: Arc<dyn StorageFile>,
    /// Bytes written to the file.
    len: u64,
}

pub(crate) struct Writer {
    shared: Arc<GroupShared>,
    storage: Arc<dyn Storage>,
    cfg: StoreConfig,
    rx: Receiver<Cmd>,
    active: Option<Active>,
    /// Lengths of sealed segments.
    sealed: BTreeMap<u32, u64>,
    next_seq: u32,
    next_lsn: u64,
    /// Encoded bytes not yet written to `active`.
    buf: Vec<u8>,
    /// Written since the last fdatasync of `active`.
    dirty: bool,
    last_sync: Instant,
    last_write: Instant,
    last_checkpoint: Instant,
    journal_bytes_since_checkpoint: u64,
    /// Retained checkpoints (number, header), oldest first.
    checkpoints: Vec<(u64, CheckpointInfo)>,
    next_checkpoint_no: u64,
    /// What adaptive group commit remembers of recent batches.
    gather: GatherPolicy,
    clock: Arc<dyn Clock>,
    last_compaction: Instant,
    /// A checkpoint being written by its helper thread, and whether its
    /// index is a snapshot.
    checkpoint_in_flight: Option<(u64, CheckpointInfo, CheckpointResult, bool)>,
    /// The next checkpoint must snapshot the index: the journal since the
    /// newest checkpoint cannot rebuild it (recovery dropped messages of a
    /// missing segment, or the last rebuild failed).
    snapshot_next: bool,
    /// Live records compaction could not read or verify, by segment: left
    /// where they are (the broker's read reports them), not retried, and
    /// not counted when choosing what to compact, so one bad record never
    /// stalls reclamation of the rest.
    unmovable: BTreeMap<u32, Vec<(MsgId, Loc)>>,
}

/// Where a background checkpoint reports its outcome.
type CheckpointResult = Receiver<Result<(), StoreError>>;

/// How often the writer looks for a finished background checkpoint.
const CHECKPOINT_POLL_MS: u64 = 2;

/// Where a checkpoint's helper thread gets the index it writes.
enum IndexSource {
    /// A copy taken on the writer's path, under the index lock: only when
    /// the journal alone cannot rebuild the index.
    Snapshot(Index),
    /// The newest retained checkpoint (`None`: the start of the journal)
    /// and the journal after it: each segment with the offset to read to.
    Journal {
        base: Option<(u64, CheckpointInfo)>,
        segments: Vec<(u32, Arc<dyn StorageFile>, u64)>,
    },
}

/// Rebuilds the index at `to` from `base` and the journal after it, as
/// recovery would: the journal is immutable up to `to` (synced, and no
/// segment at or after the newest checkpoint's replay position is deleted
/// while a checkpoint is in flight). The replay must end exactly at
/// `to.lsn`.
fn rebuild_index(
    storage: &dyn Storage,
    dir: &std::path::Path,
    group: u32,
    salt: u32,
    base: Option<(u64, CheckpointInfo)>,
    segments: Vec<(u32, Arc<dyn StorageFile>, u64)>,
    to: CheckpointInfo,
) -> Result<Index, StoreError> {
    let (mut index, mut lsn, from) = match base {
        Some((no, info)) => {
            let path = dir.join(checkpoint::checkpoint_name(no));
            let bytes = crate::manifest::read_all(storage, &path)?;
            let (found, index) = checkpoint::decode(group, &bytes, &path)?;
            if found != info {
                return Err(StoreError::Corrupt {
                    path,
                    offset: 0,
                    reason: format!("checkpoint reads as {found:?}, was written as {info:?}"),
                });
            }
            (index, info.lsn, info.replay)
        }
        None => (
            Index::default(),
            0,
            ReplayFrom {
                seg: 1,
                offset: SEGMENT_HEADER_BYTES as u64,
            },
        ),
    };
    for (seq, file, end) in segments {
        let path = segment::segment_path(dir, seq);
        let start = if seq == from.seg {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES as u64
        };
        let corrupt = |offset: u64, reason: String| StoreError::Corrupt {
            path: path.clone(),
            offset,
            reason: format!("journal does not replay for a checkpoint: {reason}"),
        };
        let len = end
            .checked_sub(start)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| corrupt(start, format!("range {start}..{end}")))?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, start)
            .map_err(|e| StoreError::io("read", &path, e))?;
        let mut at = 0;
        while at < buf.len() {
            let offset = start + at as u64;
            match record::decode(salt, &buf[at..]) {
                Decoded::Record {
                    lsn: l,
                    record,
                    len,
                } => {
                    let loc = Loc {
                        seg: seq,
                        offset: u32::try_from(offset)
                            .map_err(|e| corrupt(offset, e.to_string()))?,
                        len: u32::try_from(len).map_err(|e| corrupt(offset, e.to_string()))?,
                    };
                    index.apply(&record, loc);
                    if !matches!(record, Record::Hole { .. }) {
                        lsn = l;
                    }
                    at += len;
                }
                Decoded::Incomplete { needed } => {
                    return Err(corrupt(offset, format!("record needs {needed} bytes")))
                }
                Decoded::Corrupt(c) => return Err(corrupt(offset, format!("{c:?}"))),
                Decoded::Unparseable { reason, .. } => return Err(corrupt(offset, reason)),
            }
        }
    }
    if lsn != to.lsn {
        return Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            offset: 0,
            reason: format!(
                "journal replay for a checkpoint ended at lsn {lsn}, the checkpoint is at {}",
                to.lsn
            ),
        });
    }
    Ok(index)
}

/// Writes checkpoint `no` durably (see [`crate::storage::write_atomically`]).
fn write_checkpoint(
    storage: &dyn Storage,
    dir: &std::path::Path,
    group: u32,
    no: u64,
    info: CheckpointInfo,
    index: &Index,
) -> Result<(), StoreError> {
    let bytes = checkpoint::encode(group, info, index);
    crate::storage::write_atomically(
        storage,
        dir,
        CHECKPOINT_TMP_NAME,
        &checkpoint::checkpoint_name(no),
        &bytes,
    )
}

pub(crate) struct WriterInit {
    pub index: Index,
    pub files: BTreeMap<u32, (Arc<dyn StorageFile>, u64)>,
    pub next_seq: u32,
    pub next_lsn: u64,
    pub checkpoints: Vec<(u64, CheckpointInfo)>,
    pub next_checkpoint_no: u64,
    /// The index is what the newest checkpoint and the journal after it
    /// give (false if recovery dropped messages without a record).
    pub index_from_journal: bool,
    /// The store's record salt (from the manifest).
    pub salt: u32,
}

impl Writer {
    pub fn new(
        group: u32,
        dir: PathBuf,
        storage: Arc<dyn Storage>,
        cfg: StoreConfig,
        rx: Receiver<Cmd>,
        init: WriterInit,
        clock: Arc<dyn Clock>,
    ) -> (Self, Arc<GroupShared>) {
        let sealed = init.files.iter().map(|(s, (_, len))| (*s, *len)).collect();
        let files = init.files.into_iter().map(|(s, (f, _))| (s, f)).collect();
        let shared = Arc::new(GroupShared {
            group,
            salt: init.salt,
            dir,
            inner: Mutex::new(Shared {
                index: init.index,
                files,
            }),
            poisoned: Mutex::new(None),
            counters: GroupCounters::default(),
        });
        let now = clock.now();
        let w = Writer {
            shared: Arc::clone(&shared),
            storage,
            cfg,
            rx,
            active: None,
            sealed,
            next_seq: init.next_seq,
            next_lsn: init.next_lsn,
            buf: Vec::new(),
            dirty: false,
            last_sync: now,
            last_write: now,
            last_checkpoint: now,
            journal_bytes_since_checkpoint: 0,
            checkpoints: init.checkpoints,
            next_checkpoint_no: init.next_checkpoint_no,
            gather: GatherPolicy::default(),
            clock,
            last_compaction: now,
            checkpoint_in_flight: None,
            snapshot_next: !init.index_from_journal,
            unmovable: BTreeMap::new(),
        };
        (w, shared)
    }

    fn group(&self) -> u32 {
        self.shared.group
    }

    fn err(
        &self,
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |e| StoreError::io(op, path, e)
    }

    /// The writer thread's body: runs the group until shutdown and, should
    /// it panic (a bug), poisons the group and fails every request instead
    /// of leaving its callers waiting.
    pub fn run_contained(mut self) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
        if let Err(panic) = outcome {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_owned());
            self.died(reason);
        }
    }

    /// After a panic: poison the group and fail everything sent to it until
    /// the store shuts it down.
    fn died(&mut self, reason: String) {
        let cause = StoreError::WriterDied {
            group: self.group(),
            reason,
        };
        tracing::error!(group = self.group(), error = %cause, "log group poisoned");
        *self.shared.poisoned.lock() = Some(Arc::new(cause));
        let e = self.shared.poison_error().expect("just poisoned");
        while let Ok(cmd) = self.rx.recv() {
            match cmd {
                Cmd::Write { done, .. } => {
                    if let Some(w) = done {
                        w.complete(Err(e.clone()));
                    }
                }
                Cmd::Checkpoint { done } | Cmd::Compact { done } => done(Err(e.clone())),
                Cmd::Shutdown { done } => {
                    if let Some(done) = done {
                        done(Err(e));
                    }
                    return;
                }
            }
        }
    }

    fn run(&mut self) {
        let mut batch: Vec<Cmd> = Vec::new();
        loop {
            let first = match self.next_deadline() {
                None => self
                    .rx
                    .recv()
                    .map_err(|mpsc::RecvError| RecvTimeoutError::Disconnected),
                Some(at) => self
                    .rx
                    .recv_timeout(at.saturating_duration_since(self.clock.now())),
            };
            let mut disconnected = false;
            match first {
                Ok(cmd) => batch.push(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => disconnected = true,
            }
            if !batch.is_empty() {
                disconnected |= self.drain(&mut batch);
                self.gather(&mut batch);
            }
            let mut shutdown: Option<Option<Done>> = disconnected.then_some(None);
            let mut writes = Vec::new();
            let mut controls = Vec::new();
            for cmd in batch.drain(..) {
                match cmd {
                    Cmd::Write { op, done } => writes.push((op, done)),
                    Cmd::Shutdown { done } => shutdown = Some(done),
                    other => controls.push(other),
                }
            }
            if !writes.is_empty() {
                self.commit(writes);
            }
            for c in controls {
                self.control(c);
            }
            if let Some(done) = shutdown {
                let result = self.close();
                if let Some(done) = done {
                    done(result);
                }
                // Nothing can be sent after shutdown; be sure anyway.
                while let Ok(cmd) = self.rx.try_recv() {
                    if let Cmd::Write { done: Some(w), .. } = cmd {
                        w.complete(Err(StoreError::Closed));
                    }
                }
                return;
            }
            self.housekeeping();
        }
    }

    /// Takes everything already queued, up to `batch_bytes_max`. Returns
    /// whether the channel is disconnected.
    fn drain(&mut self, batch: &mut Vec<Cmd>) -> bool {
        let mut bytes: usize = batch.iter().map(cmd_size).sum();
        while bytes < self.cfg.batch_bytes_max {
            match self.rx.try_recv() {
                Ok(cmd) => {
                    bytes += cmd_size(&cmd);
                    batch.push(cmd);
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => return true,
            }
        }
        false
    }

    /// Adaptive group commit: when the previous batch was shared by several
    /// committers who came straight back, wait (at most
    /// `commit_delay_us_max`, and at most about one fsync) for as many as
    /// usually come. A lone committer never waits.
    fn gather(&mut self, batch: &mut Vec<Cmd>) {
        let writes = batch
            .iter()
            .filter(|c| matches!(c, Cmd::Write { .. }))
            .count();
        let now = self.clock.now();
        let Some((expected, delay)) = self.gather.plan(writes, now, &self.cfg) else {
            return;
        };
        let deadline = now + delay;
        let mut got = writes;
        let mut bytes: usize = batch.iter().map(cmd_size).sum();
        let c = &self.shared.counters;
        c.gather_waits.fetch_add(1, Ordering::Relaxed);
        c.gather_us_max.fetch_max(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        while got < expected && bytes < self.cfg.batch_bytes_max {
            match self
                .rx
                .recv_timeout(deadline.saturating_duration_since(self.clock.now()))
            {
                Ok(cmd) => {
                    if matches!(cmd, Cmd::Write { .. }) {
                        got += 1;
                    }
                    bytes += cmd_size(&cmd);
                    batch.push(cmd);
                }
                Err(_) => break,
            }
        }
    }

    fn commit(&mut self, writes: Vec<(Op, Option<Waiter>)>) {
        let batch_writes = writes.len();
        if let Some(e) = self.shared.poison_error() {
            for w in writes.into_iter().filter_map(|(_, d)| d) {
                w.complete(Err(e.clone()));
            }
            return;
        }
        let mut writes: Vec<(Op, Option<Waiter>)> = writes
            .into_iter()
            .filter_map(|(op, done)| match op.invalid() {
                None => Some((op, done)),
                Some(why) => {
                    match done {
                        Some(w) => w.complete(Err(StoreError::Invalid(why))),
                        None => tracing::warn!(group = self.group(), "request refused: {why}"),
                    }
                    None
                }
            })
            .collect();
        net_out(&mut writes, &self.shared.counters);
        let force_sync = writes.iter().any(|(op, _)| matches!(op, Op::Flush));
        let result = self.append(&writes, force_sync);
        self.gather.batch_done(batch_writes, self.clock.now());
        match result {
            Ok(()) => {
                for w in writes.into_iter().filter_map(|(_, d)| d) {
                    w.complete(Ok(()));
                }
            }
            Err(e) => {
                let e = self.poison(e);
                for w in writes.into_iter().filter_map(|(_, d)| d) {
                    w.complete(Err(e.clone()));
                }
            }
        }
    }

    /// Encodes, writes, applies and (per mode) syncs a batch.
    fn append(
        &mut self,
        writes: &[(Op, Option<Waiter>)],
        force_sync: bool,
    ) -> Result<(), StoreError> {
        let mut placed: Vec<(Record<'_>, Loc)> = Vec::with_capacity(writes.len());
        for (op, _) in writes {
            for rec in op.records() {
                let loc = self.encode(&rec)?;
                placed.push((rec, loc));
            }
        }
        self.write_buf()?;
        {
            let mut inner = self.shared.inner.lock();
            for (rec, loc) in &placed {
                inner.index.apply(rec, *loc);
            }
        }
        let c = &self.shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(placed.len() as u64, Ordering::Relaxed);
        let due = match self.cfg.sync {
            SyncMode::Always => true,
            SyncMode::Interval => {
                self.clock.now().saturating_duration_since(self.last_sync)
                    >= Duration::from_millis(self.cfg.sync_interval_ms)
            }
            SyncMode::Never => false,
        };
        if due || force_sync {
            self.sync()?;
        }
        Ok(())
    }

    /// Encodes one record into `buf`, rolling the segment if needed.
    fn encode(&mut self, rec: &Record<'_>) -> Result<Loc, StoreError> {
        let len = rec.encoded_len() as u64;
        if let Some(a) = &self.active {
            let cur = a.len + self.buf.len() as u64;
            if cur + len > self.cfg.segment_size_bytes && cur > SEGMENT_HEADER_BYTES as u64 {
                self.write_buf()?;
                self.seal()?;
            }
        }
        if self.active.is_none() {
            self.open_segment()?;
        }
        let a = self.active.as_ref().expect("opened");
        let loc = Loc {
            seg: a.seq,
            offset: u32::try_from(a.len + self.buf.len() as u64)
                .expect("segment_size_bytes < 4 GiB"),
            len: u32::try_from(len).expect("record < 4 GiB"),
        };
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        record::encode(self.shared.salt, lsn, rec, &mut self.buf);
        Ok(loc)
    }

    fn open_segment(&mut self) -> Result<(), StoreError> {
        let seq = self.next_seq;
        let path = segment::segment_path(&self.shared.dir, seq);
        let file = self
            .storage
            .create(&path)
            .map_err(self.err("create", &path))?;
        // The entry must be durable before any record in it is completed.
        self.storage
            .sync_dir(&self.shared.dir)
            .map_err(self.err("fsync dir", &self.shared.dir))?;
        self.next_seq += 1;
        self.buf
            .extend_from_slice(&segment::encode_header(self.group(), seq));
        self.shared
            .inner
            .lock()
            .files
            .insert(seq, Arc::clone(&file));
        self.active = Some(Active { seq, file, len: 0 });
        tracing::debug!(group = self.group(), seq, "segment opened");
        Ok(())
    }

    fn write_buf(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let a = self
            .active
            .as_mut()
            .expect("buffered bytes belong to a segment");
        let path = segment::segment_path(&self.shared.dir, a.seq);
        a.file
            .write_all_at(&self.buf, a.len)
            .map_err(|e| StoreError::io("write", path, e))?;
        a.len += self.buf.len() as u64;
        self.journal_bytes_since_checkpoint += self.buf.len() as u64;
        self.shared
            .counters
            .bytes_written
            .fetch_add(self.buf.len() as u64, Ordering::Relaxed);
        self.buf.clear();
        self.dirty = true;
        self.last_write = self.clock.now();
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        let Some(a) = &self.active else { return Ok(()) };
        if !self.dirty {
            return Ok(());
        }
        let started = self.clock.now();
        let path = segment::segment_path(&self.shared.dir, a.seq);
        a.file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", path, e))?;
        let us = u64::try_from(
            self.clock
                .now()
                .saturating_duration_since(started)
                .as_micros(),
        )
        .unwrap_or(u64::MAX);
        self.gather.sync_took(us);
        let c = &self.shared.counters;
        c.syncs.fetch_add(1, Ordering::Relaxed);
        c.sync_us_total.fetch_add(us, Ordering::Relaxed);
        self.dirty = false;
        self.last_sync = self.clock.now();
        Ok(())
    }

    /// fdatasyncs and closes the active segment; the next write opens a new one.
    fn seal(&mut self) -> Result<(), StoreError> {
        self.write_buf()?;
        self.sync()?;
        if let Some(a) = self.active.take() {
            tracing::debug!(
                group = self.group(),
                seq = a.seq,
                bytes = a.len,
                "segment sealed"
            );
            self.sealed.insert(a.seq, a.len);
        }
        Ok(())
    }

    fn poison(&mut self, cause: StoreError) -> StoreError {
        tracing::error!(group = self.group(), error = %cause,
            "log group poisoned: refusing writes until the store is reopened");
        let cause = Arc::new(cause);
        *self.shared.poisoned.lock() = Some(Arc::clone(&cause));
        // Nothing buffered may be written after the failure.
        self.buf.clear();
        StoreError::Poisoned {
            group: self.group(),
            cause,
        }
    }

    fn control(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Checkpoint { done } => done(self.checkpoint()),
            Cmd::Compact { done } => {
                let mut result = Ok(());
                while result.is_ok() && self.compaction_candidate().is_some() {
                    result = self.compact_step(usize::MAX);
                }
                done(result);
            }
            Cmd::Write { .. } | Cmd::Shutdown { .. } => unreachable!("handled by run"),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.shared.poisoned.lock().is_some() {
            return None;
        }
        let mut at: Option<Instant> = None;
        let mut consider = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        if self.dirty && self.cfg.sync == SyncMode::Interval {
            consider(self.last_sync + Duration::from_millis(self.cfg.sync_interval_ms));
        }
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.len > SEGMENT_HEADER_BYTES as u64)
        {
            consider(self.last_write + Duration::from_millis(self.cfg.segment_idle_roll_ms));
        }
        if self.checkpoint_in_flight.is_some() {
            consider(self.clock.now() + Duration::from_millis(CHECKPOINT_POLL_MS));
        } else if self.checkpoint_wanted() {
            consider(self.last_checkpoint + Duration::from_millis(self.cfg.checkpoint_interval_ms));
        }
        if self.compaction_candidate().is_some() {
            consider(self.last_compaction + Duration::from_millis(self.cfg.compaction_pause_ms));
        }
        at
    }

    /// The replay position a checkpoint taken now would record.
    fn position(&self) -> ReplayFrom {
        match &self.active {
            Some(a) => ReplayFrom {
                seg: a.seq,
                offset: a.len + self.buf.len() as u64,
            },
            None => ReplayFrom {
                seg: self.next_seq,
                offset: SEGMENT_HEADER_BYTES as u64,
            },
        }
    }

    /// Whether a checkpoint now would move the oldest retained one forward.
    fn checkpoint_wanted(&self) -> bool {
        self.checkpoints.len() < 2 && self.next_lsn > 1
            || self
                .checkpoints
                .first()
                .is_some_and(|(_, c)| c.replay != self.position())
    }

    fn housekeeping(&mut self) {
        if self.shared.poisoned.lock().is_some() {
            return;
        }
        let now = self.clock.now();
        let result = (|| {
            if self.dirty
                && self.cfg.sync == SyncMode::Interval
                && now >= self.last_sync + Duration::from_millis(self.cfg.sync_interval_ms)
            {
                self.sync()?;
            }
            if self
                .active
                .as_ref()
                .is_some_and(|a| a.len > SEGMENT_HEADER_BYTES as u64)
                && now >= self.last_write + Duration::from_millis(self.cfg.segment_idle_roll_ms)
            {
                self.seal()?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.poison(e);
            return;
        }
        let ckpt_due = self.journal_bytes_since_checkpoint >= self.cfg.checkpoint_journal_bytes
            || (self.checkpoint_wanted()
                && now
                    >= self.last_checkpoint
                        + Duration::from_millis(self.cfg.checkpoint_interval_ms));
        // A checkpoint still in flight when the next is due is waited for:
        // that keeps the journal since the older retained checkpoint within
        // 2 × checkpoint_journal_bytes (DURABILITY.md's space bound) even
        // when the helper thread is slow to be scheduled.
        let block = ckpt_due && self.checkpoint_in_flight.is_some();
        if let Err(e) = self.finish_checkpoint(block) {
            tracing::error!(group = self.group(), error = %e, "checkpoint failed; will retry");
        }
        if ckpt_due && self.checkpoint_in_flight.is_none() {
            if let Err(e) = self.start_checkpoint() {
                tracing::error!(group = self.group(), error = %e, "checkpoint failed; will retry");
                self.last_checkpoint = now;
            }
        }
        if self.compaction_candidate().is_some()
            && now >= self.last_compaction + Duration::from_millis(self.cfg.compaction_pause_ms)
        {
            if let Err(e) = self.compact_step(self.cfg.compaction_bytes_per_turn) {
                tracing::error!(group = self.group(), error = %e, "compaction failed");
            }
            self.last_compaction = self.clock.now();
        }
    }

    /// Starts a checkpoint of the whole index at the current position. The
    /// journal is synced and the index snapshotted here; encoding, writing
    /// and fsyncing happen on a helper thread so commits are not held up.
    fn start_checkpoint(&mut self) -> Result<(), StoreError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        if self.checkpoint_in_flight.is_some() {
            return Ok(());
        }
        // The journal the checkpoint points into must be durable first.
        if let Err(e) = self.write_buf().and_then(|()| self.sync()) {
            return Err(self.poison(e));
        }
        let info = CheckpointInfo {
            lsn: self.next_lsn - 1,
            replay: self.position(),
        };
        let source = self.index_source(info);
        let snapshot = matches!(source, IndexSource::Snapshot(_));
        if snapshot {
            self.shared
                .counters
                .checkpoint_snapshots
                .fetch_add(1, Ordering::Relaxed);
        }
        let no = self.next_checkpoint_no;
        self.next_checkpoint_no += 1;
        let (tx, rx) = mpsc::sync_channel(1);
        let storage = Arc::clone(&self.storage);
        let dir = self.shared.dir.clone();
        let (group, salt) = (self.group(), self.shared.salt);
        std::thread::Builder::new()
            .name(format!("berth-ckpt-{group}"))
            .spawn(move || {
                let index = match source {
                    IndexSource::Snapshot(index) => Ok(index),
                    IndexSource::Journal { base, segments } => {
                        rebuild_index(storage.as_ref(), &dir, group, salt, base, segments, info)
                    }
                };
                let result = index.and_then(|index| {
                    write_checkpoint(storage.as_ref(), &dir, group, no, info, &index)
                });
                if tx.send(result).is_err() {
                    tracing::debug!(group, no, "checkpoint finished after its writer stopped");
                }
            })
            .map_err(|e| StoreError::io("spawn checkpoint thread", &self.shared.dir, e))?;
        self.checkpoint_in_flight = Some((no, info, rx, snapshot));
        self.last_checkpoint = self.clock.now();
        self.journal_bytes_since_checkpoint = 0;
        Ok(())
    }

    /// What the checkpoint at `to` gets its index from: the journal since
    /// the newest retained checkpoint, normally (no copy on this path);
    /// a snapshot when that cannot rebuild it.
    fn index_source(&self, to: CheckpointInfo) -> IndexSource {
        let snapshot = |w: &Self| IndexSource::Snapshot(w.shared.inner.lock().index.clone());
        if self.snapshot_next {
            return snapshot(self);
        }
        let base = self.checkpoints.last().copied();
        let from = base.map_or(1, |(_, c)| c.replay.seg);
        let inner = self.shared.inner.lock();
        let mut segments = Vec::new();
        for seq in from..=to.replay.seg {
            let end = if seq == to.replay.seg {
                to.replay.offset
            } else if let Some(&len) = self.sealed.get(&seq) {
                len
            } else {
                drop(inner);
                return snapshot(self);
            };
            match inner.files.get(&seq) {
                Some(f) => segments.push((seq, Arc::clone(f), end)),
                // The position at the start of a segment not created yet.
                None if seq == to.replay.seg && end == SEGMENT_HEADER_BYTES as u64 => {}
                None => {
                    drop(inner);
                    return snapshot(self);
                }
            }
        }
        IndexSource::Journal { base, segments }
    }

    /// Collects the checkpoint in flight, if it finished (or waiting for it
    /// with `block`): keeps it, drops the oldest beyond two, and deletes the
    /// segments that are no longer needed.
    fn finish_checkpoint(&mut self, block: bool) -> Result<(), StoreError> {
        let Some((no, info, rx, snapshot)) = &self.checkpoint_in_flight else {
            return Ok(());
        };
        let result = if block {
            rx.recv().unwrap_or(Err(StoreError::Closed))
        } else {
            match rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => Err(StoreError::Closed),
            }
        };
        let (no, info, snapshot) = (*no, *info, *snapshot);
        self.checkpoint_in_flight = None;
        if let Err(e) = result {
            // Whatever failed (the previous checkpoint unreadable, a write),
            // the next attempt does not depend on the journal replaying.
            self.snapshot_next = true;
            return Err(e);
        }
        if snapshot {
            self.snapshot_next = false;
        }
        self.checkpoints.push((no, info));
        self.shared
            .counters
            .checkpoints
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            group = self.group(),
            no,
            lsn = info.lsn,
            "checkpoint written"
        );
        while self.checkpoints.len() > 2 {
            let (old, _) = self.checkpoints.remove(0);
            let path = self.shared.dir.join(checkpoint::checkpoint_name(old));
            if let Err(e) = self.storage.remove(&path) {
                tracing::warn!(group = self.group(), file = %path.display(), error = %e, "could not remove old checkpoint");
            }
        }
        self.delete_dead_segments()
    }

    /// A checkpoint, start to finish (explicit requests and shutdown).
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        if let Err(e) = self.finish_checkpoint(true) {
            tracing::error!(group = self.group(), error = %e, "background checkpoint failed");
        }
        self.start_checkpoint()?;
        match self.finish_checkpoint(true) {
            // The journal did not replay (damaged since it was written):
            // the same checkpoint from a snapshot of the index instead.
            Err(e) if self.snapshot_next && self.shared.poisoned.lock().is_none() => {
                tracing::error!(group = self.group(), error = %e,
                    "checkpoint could not be rebuilt from the journal; writing it from a snapshot");
                self.start_checkpoint()?;
                self.finish_checkpoint(true)
            }
            other => other,
        }
    }

    /// Deletes the sealed segments no live message and neither retained
    /// checkpoint needs. Their messages may have left them through
    /// compaction's `Relocate` records, which must be on stable storage
    /// before the deletion can be: a file system may make an unlink durable
    /// ahead of unsynced data, and a power loss would then leave index
    /// entries pointing at a missing segment. So the journal is synced
    /// first, and the directory after the unlinks.
    fn delete_dead_segments(&mut self) -> Result<(), StoreError> {
        if self.checkpoints.len() < 2 {
            return Ok(());
        }
        let horizon = self
            .checkpoints
            .iter()
            .map(|(_, c)| c.replay.seg)
            .min()
            .expect("two checkpoints");
        let dead: Vec<u32> = {
            let inner = self.shared.inner.lock();
            self.sealed
                .keys()
                .copied()
                .filter(|&s| s < horizon && inner.index.seg_live(s).count == 0)
                .collect()
        };
        if dead.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.write_buf().and_then(|()| self.sync()) {
            return Err(self.poison(e));
        }
        let mut deleted = 0;
        for seq in dead {
            let path = segment::segment_path(&self.shared.dir, seq);
            match self.storage.remove(&path) {
                Ok(()) => {
                    deleted += 1;
                    self.sealed.remove(&seq);
                    self.unmovable.remove(&seq);
                    self.shared.inner.lock().files.remove(&seq);
                    self.shared
                        .counters
                        .segments_deleted
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(group = self.group(), seq, "segment deleted");
                }
                Err(e) => {
                    tracing::warn!(group = self.group(), file = %path.display(), error = %e, "could not delete dead segment");
                }
            }
        }
        if deleted > 0 {
            // Not needed for safety (a resurrected dead segment is deleted
            // again), but space is only reclaimed for good once it is durable.
            self.storage
                .sync_dir(&self.shared.dir)
                .map_err(self.err("fsync dir", &self.shared.dir))?;
        }
        Ok(())
    }

    /// The oldest sealed segment that is mostly dead and still holds live
    /// records compaction can move.
    fn compaction_candidate(&self) -> Option<u32> {
        let inner = self.shared.inner.lock();
        let pct = u64::from(self.cfg.compaction_live_percent_max);
        self.sealed
            .iter()
            .find(|(s, len)| {
                let live = inner.index.seg_live(**s);
                let stuck = self.unmovable.get(*s).map_or(0, |v| {
                    v.iter().filter(|(m, l)| inner.index.is_at(*m, *l)).count() as u64
                });
                live.count > stuck && live.bytes * 100 < **len * pct
            })
            .map(|(s, _)| *s)
    }

    /// Copies up to `bytes_max` of live records out of the candidate
    /// segment into the active one (as `Relocate` records). A record that
    /// cannot be read or does not verify is reported and skipped for good.
    fn compact_step(&mut self, bytes_max: usize) -> Result<(), StoreError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        let Some(seq) = self.compaction_candidate() else {
            return Ok(());
        };
        let (file, live) = {
            let inner = self.shared.inner.lock();
            (
                inner.files.get(&seq).cloned(),
                inner.index.live_in_segment(seq),
            )
        };
        let Some(file) = file else { return Ok(()) };
        let path = segment::segment_path(&self.shared.dir, seq);
        let mut copied = 0usize;
        let mut moved: Vec<(MsgId, Vec<QueueId>, Loc)> = Vec::new();
        for (msg, loc) in live {
            if copied >= bytes_max {
                break;
            }
            if self
                .unmovable
                .get(&seq)
                .is_some_and(|v| v.contains(&(msg, loc)))
            {
                continue;
            }
            let mut rec = vec![0u8; loc.len as usize];
            let payload = match file.read_exact_at(&mut rec, u64::from(loc.offset)) {
                Err(e) => Err(format!("read failed: {e}")),
                Ok(()) => record::message_payload(self.shared.salt, &rec, msg)
                    .map_err(|found| format!("record does not verify: {found:?}")),
            };
            let payload = match payload {
                Ok(payload) => payload,
                Err(why) => {
                    let queues = self.shared.inner.lock().index.queues_of(msg);
                    tracing::error!(group = self.group(), file = %path.display(), offset = loc.offset,
                        %msg, ?queues, "live record unreadable ({why}); left in place, compaction moves on");
                    self.unmovable.entry(seq).or_default().push((msg, loc));
                    self.shared
                        .counters
                        .unreadable_records
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let queues = self.shared.inner.lock().index.queues_of(msg);
            let new_loc = match self.encode(&Record::Relocate {
                msg,
                queues: queues.as_slice().into(),
                payload,
            }) {
                Ok(l) => l,
                Err(e) => return Err(self.poison(e)),
            };
            moved.push((msg, queues, new_loc));
            copied += loc.len as usize;
        }
        if let Err(e) = self.write_buf() {
            return Err(self.poison(e));
        }
        let mut inner = self.shared.inner.lock();
        for (msg, queues, loc) in &moved {
            inner.index.apply(
                &Record::Relocate {
                    msg: *msg,
                    queues: queues.as_slice().into(),
                    payload: &[],
                },
                *loc,
            );
        }
        drop(inner);
        self.shared
            .counters
            .bytes_compacted
            .fetch_add(copied as u64, Ordering::Relaxed);
        tracing::debug!(
            group = self.group(),
            seq,
            messages = moved.len(),
            bytes = copied,
            "compacted"
        );
        Ok(())
    }

    /// Clean shutdown: everything written and synced, and a checkpoint so
    /// the next start replays nothing.
    fn close(&mut self) -> Result<(), StoreError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        if let Err(e) = self.write_buf().and_then(|()| self.sync()) {
            return Err(self.poison(e));
        }
        if self
            .checkpoints
            .last()
            .is_none_or(|(_, c)| c.replay != self.position())
        {
            self.checkpoint()?;
        }
        Ok(())
    }
}

/// Adaptive group commit's memory of recent batches, and its one decision:
/// whether to hold a batch open for more committers, for how long.
///
/// A batch is held only if (a) recent batches were shared by about
/// `expected` ≥ 2 committers (a smoothed count), (b) the previous batch
/// itself was shared (a committer alone last time is alone now: the
/// smoothed count alone decays too slowly after a burst), and (c) this
/// batch began promptly after the previous one completed, as committers
/// woken together do (after a longer pause the burst is over). The pause is
/// at most `commit_delay_us_max` and at most the smoothed fsync time.
#[derive(Debug)]
struct GatherPolicy {
    /// Smoothed writes per batch: the committers we expect to meet.
    committers_ewma: f64,
    /// Writes in the previous batch.
    last_batch_writes: usize,
    /// When the previous batch completed.
    last_batch_done: Option<Instant>,
    /// Smoothed fdatasync duration, µs.
    sync_us_ewma: f64,
}

impl Default for GatherPolicy {
    fn default() -> Self {
        GatherPolicy {
            committers_ewma: 1.0,
            last_batch_writes: 0,
            last_batch_done: None,
            sync_us_ewma: 0.0,
        }
    }
}

impl GatherPolicy {
    fn batch_done(&mut self, writes: usize, now: Instant) {
        #[allow(clippy::cast_precision_loss)]
        let n = writes as f64;
        self.committers_ewma = 0.75 * self.committers_ewma + 0.25 * n;
        self.last_batch_writes = writes;
        self.last_batch_done = Some(now);
    }

    fn sync_took(&mut self, us: u64) {
        #[allow(clippy::cast_precision_loss)]
        let us = us as f64;
        self.sync_us_ewma = 0.8 * self.sync_us_ewma + 0.2 * us;
    }

    /// For a batch of `writes` formed at `now`: how many writes to wait
    /// for, and for at most how long; `None` to write at once.
    fn plan(&self, writes: usize, now: Instant, cfg: &StoreConfig) -> Option<(usize, Duration)> {
        if cfg.sync != SyncMode::Always || cfg.commit_delay_us_max == 0 || writes == 0 {
            return None;
        }
        let expected = self.committers_ewma.round();
        if expected < 2.0 || self.last_batch_writes < 2 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let expected = expected as usize;
        if writes >= expected {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let delay_us = cfg.commit_delay_us_max.min(self.sync_us_ewma as u64);
        let prompt = Duration::from_micros(cfg.commit_delay_us_max.max(delay_us));
        let came_back = self
            .last_batch_done
            .is_some_and(|t| now.saturating_duration_since(t) <= prompt);
        (delay_us > 0 && came_back).then(|| (expected, Duration::from_micros(delay_us)))
    }
}

/// Why a publish of `payload_len` bytes to `queue_count` queues of one
/// group cannot be one record, if it cannot.
pub(crate) fn publish_invalid(queue_count: usize, payload_len: usize) -> Option<String> {
    body_invalid(
        record::PUBLISH_OFF_QUEUES
            .saturating_add(queue_count.saturating_mul(8))
            .saturating_add(payload_len),
    )
}

fn body_invalid(body: usize) -> Option<String> {
    (body > RECORD_BODY_BYTES_MAX as usize).then(|| {
        format!(
            "a record body of {body} bytes exceeds the limit of {RECORD_BODY_BYTES_MAX} \
             (payload plus 8 bytes per queue of the group, or key plus value)"
        )
    })
}

fn cmd_size(cmd: &Cmd) -> usize {
    match cmd {
        Cmd::Write { op, .. } => op.size_hint(),
        _ => 0,
    }
}

/// A message acked in the same batch that publishes it need not be written:
/// drop the queue from the publish and the message from the removal.
fn net_out(writes: &mut [(Op, Option<Waiter>)], counters: &GroupCounters) {
    let has_remove = writes.iter().any(|(op, _)| matches!(op, Op::Remove { .. }));
    if !has_remove {
        return;
    }
    let mut published: HashMap<u64, usize> = HashMap::new();
    for i in 0..writes.len() {
        match &writes[i].0 {
            Op::Publish { msg, .. } => {
                published.insert(msg.0, i);
            }
            Op::Remove { queue, msgs } => {
                let queue = *queue;
                let mut keep = Vec::with_capacity(msgs.len());
                let msgs = msgs.clone();
                for m in msgs {
                    let netted = published.get(&m.0).is_some_and(|&p| {
                        let Op::Publish { queues, .. } = &mut writes[p].0 else {
                            unreachable!()
                        };
                        let before = queues.len();
                        queues.retain(|q| *q != queue);
                        let hit = queues.len() < before;
                        if hit && queues.is_empty() {
                            counters.netted_publishes.fetch_add(1, Ordering::Relaxed);
                        }
                        hit
                    });
                    if !netted {
                        keep.push(m);
                    }
                }
                if let Op::Remove { msgs, .. } = &mut writes[i].0 {
                    *msgs = keep;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completion these tests never run (dropping it reports `Poisoned`).
    fn noop() -> Option<Waiter> {
        Some(Waiter::new(Box::new(|_| {}), 0))
    }

    #[test]
    fn publish_acked_in_the_same_batch_is_not_written() {
        let counters = GroupCounters::default();
        let mut writes = vec![
            (
                Op::Publish {
                    msg: MsgId(1),
                    queues: vec![QueueId(1), QueueId(2)],
                    payload: Bytes::from_static(b"x"),
                },
                noop(),
            ),
            (
                Op::Publish {
                    msg: MsgId(2),
                    queues: vec![QueueId(1)],
                    payload: Bytes::from_static(b"y"),
                },
                noop(),
            ),
            (
                Op::Remove {
                    queue: QueueId(1),
                    msgs: vec![MsgId(1), MsgId(2), MsgId(9)],
                },
                None,
            ),
        ];
        net_out(&mut writes, &counters);
        assert!(matches!(&writes[0].0, Op::Publish { queues, .. } if queues == &[QueueId(2)]));
        assert!(
            writes[1].0.records().is_empty(),
            "fully acked publish writes nothing"
        );
        assert!(matches!(&writes[2].0, Op::Remove { msgs, .. } if msgs == &[MsgId(9)]));
        assert_eq!(counters.netted_publishes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn gather_policy_waits_only_for_committers_that_came_back() {
        let cfg = StoreConfig::new("/x");
        let t0 = Instant::now();
        let mut p = GatherPolicy::default();
        p.sync_took(10_000);
        // Alone from the start: never.
        for i in 0..20 {
            let now = t0 + Duration::from_micros(i * 100);
            assert_eq!(p.plan(1, now, &cfg), None);
            p.batch_done(1, now);
        }
        // A burst of 8: a short batch right after a shared one waits,
        // capped by commit_delay_us_max (the fsync takes 10 ms).
        for _ in 0..10 {
            p.batch_done(8, t0);
        }
        let at = t0 + Duration::from_micros(50);
        assert_eq!(
            p.plan(3, at, &cfg),
            Some((8, Duration::from_micros(cfg.commit_delay_us_max)))
        );
        assert_eq!(p.plan(8, at, &cfg), None, "all expected are there");
        // The burst ends: after a pause, a lone committer does not wait...
        let later = t0 + Duration::from_secs(1);
        assert_eq!(p.plan(1, later, &cfg), None);
        // ...and once it was alone in a batch, never again, though the
        // smoothed count is still high.
        p.batch_done(1, at);
        assert!(p.committers_ewma >= 2.0);
        assert_eq!(p.plan(1, at, &cfg), None);
    }

    #[test]
    fn removal_before_its_publish_is_not_netted() {
        let counters = GroupCounters::default();
        let mut writes = vec![
            (
                Op::Remove {
                    queue: QueueId(1),
                    msgs: vec![MsgId(1)],
                },
                None,
            ),
            (
                Op::Publish {
                    msg: MsgId(1),
                    queues: vec![QueueId(1)],
                    payload: Bytes::new(),
                },
                None,
            ),
        ];
        net_out(&mut writes, &counters);
        assert!(matches!(&writes[0].0, Op::Remove { msgs, .. } if msgs == &[MsgId(1)]));
        assert_eq!(writes[1].0.records().len(), 1);
    }
}
