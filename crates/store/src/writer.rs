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
//! - A failed fdatasync, or a failed write for any reason but a full disk,
//!   poisons the group: the batch fails, every later request fails, and
//!   nothing reports success that was not synced. A write that found the
//!   disk full is taken back and the group waits for space (see
//!   [`space`]): the batch fails, later requests fail until space returns.
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
//! - A checkpoint is built on its helper thread from the (synced,
//!   immutable) journal since the newest checkpoint: a delta of what
//!   changed, or a base rebuilt from the chain and that journal; the
//!   writer copies the live index only when the journal cannot rebuild it.
//!   That journal is not read back when the writer kept its index ops
//!   since then ([`facts`]), which stand for it record for record.
//! - A segment is sealed (fdatasync'ed) before the next one is created, and
//!   deleted only when it holds no live message and lies wholly before the
//!   replay position of both retained checkpoints.
//! - A sealed segment is dropped from the page cache only after its
//!   fdatasync, once cold, and never when a checkpoint still reads it
//!   (see [`cache`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::append_buf::AppendBuf;
use crate::checkpoint::{
    self, CheckpointInfo, DeltaBuilder, Kind, Link, ReplayFrom, CHECKPOINT_TMP_NAME,
};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::limits::{StoreConfig, SyncMode, RECORD_BODY_BYTES_MAX, REMOVE_MSGS_PER_RECORD_MAX};
use crate::limits::{CHECKPOINT_CHAIN_LINKS_MAX, INDEX_COPY_BYTES_MAX, INDEX_DRAINED_FRACTION};
use crate::record::{self, Decoded, Record};
use crate::segment::{self, SEGMENT_HEADER_BYTES};
use crate::storage::{Storage, StorageFile};
use crate::{MsgId, QueueId};
use active::Active;

mod active;
mod cache;
mod checkpoints;
mod compact;
mod facts;
mod gather;
mod inbox;
pub(crate) mod pause;
mod prepare;
mod reclaim;
mod requests;
mod space;

use checkpoints::{CheckpointResult, CHECKPOINT_POLL_MS};
use gather::GatherPolicy;
pub(crate) use inbox::{inbox, Inbox, Outbox};
pub use requests::Done;
use requests::{cmd_size, net_out};
pub(crate) use requests::{publish_invalid, Cmd, Op, Waiter};

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
    /// Sealed segments dropped from the page cache (see [`cache`]).
    pub segments_uncached: AtomicU64,
    pub bytes_compacted: AtomicU64,
    /// Live records compaction found unreadable (I/O error or checksum):
    /// reported and left in place.
    pub unreadable_records: AtomicU64,
    /// fdatasync latency, µs.
    pub sync_latency_us: crate::histogram::SyncLatencyUs,
    /// Records per write batch.
    pub batch_records: crate::histogram::BatchRecords,
    /// The lsn of the newest record this writer has fdatasynced: every
    /// record of the group up to it is on stable storage. 0 until the
    /// writer's first sync after the store opened; decreases only when a
    /// write that found the disk full is taken back (see [`space`]). Read
    /// it from a completion to learn a position at least as far as the
    /// completed record's (under `store.sync = always`).
    pub durable_lsn: AtomicU64,
    /// Capacity of the writer's encode buffer, bytes (kept between
    /// batches; released when the group goes idle).
    pub write_buffer_bytes: AtomicU64,
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
    /// Set while the group waits for disk space ([`StoreError::NoSpace`]):
    /// what every write is refused with meanwhile.
    pub no_space: Mutex<Option<StoreError>>,
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

/// Requests whose room the writer keeps between batches; a larger list
/// (a burst of many small requests) is freed after its batch.
const WRITES_KEPT_MAX: usize = 4096;

/// Empties `writes`, completing each waiter with `result`, then runs the
/// work the completions left for after the batch ([`crate::completion`]);
/// `waiting`: requests queued for the writer behind this batch.
fn complete_all(
    writes: &mut Vec<(Op, Option<Waiter>)>,
    result: &Result<(), StoreError>,
    waiting: usize,
) {
    crate::completion::completing(waiting, || {
        for w in writes.drain(..).filter_map(|(_, d)| d) {
            w.complete(result.clone());
        }
    });
}

pub(crate) struct Writer {
    shared: Arc<GroupShared>,
    storage: Arc<dyn Storage>,
    cfg: StoreConfig,
    rx: Inbox,
    active: Option<Active>,
    /// Lengths of sealed segments.
    sealed: BTreeMap<u32, u64>,
    next_seq: u32,
    next_lsn: u64,
    /// Encoded bytes not yet written to `active`, placed for the offset
    /// they go to (`append_buf.rs`).
    buf: AppendBuf,
    /// Written since the last fdatasync of `active`.
    dirty: bool,
    last_sync: Instant,
    last_write: Instant,
    last_checkpoint: Instant,
    journal_bytes_since_checkpoint: u64,
    /// Messages the index held when the last checkpoint started.
    live_at_last_checkpoint: usize,
    /// Retained checkpoints, oldest first: the chains of the two newest.
    checkpoints: Vec<Link>,
    next_checkpoint_no: u64,
    /// What adaptive group commit remembers of recent batches.
    gather: GatherPolicy,
    clock: Arc<dyn Clock>,
    last_compaction: Instant,
    /// A checkpoint being written by its helper thread, and whether its
    /// index is a snapshot.
    checkpoint_in_flight: Option<(Link, CheckpointResult, bool)>,
    /// The next checkpoint must snapshot the index: the journal since the
    /// newest checkpoint cannot rebuild it (recovery dropped messages of a
    /// missing segment, or the last rebuild failed).
    snapshot_next: bool,
    /// Live records compaction could not read or verify, by segment: left
    /// where they are (the broker's read reports them), not retried, and
    /// not counted when choosing what to compact, so one bad record never
    /// stalls reclamation of the rest.
    unmovable: BTreeMap<u32, Vec<(MsgId, Loc)>>,
    /// Set while a write found the disk full and space has not returned.
    space: Option<space::SpaceWait>,
    /// The next segment, prepared (zero-filled) by a helper thread.
    prepared: prepare::Slot,
    /// The next segment opened takes the prepared file: the first one
    /// after start, and one after a segment filled up. A segment sealed
    /// because it sat idle is followed by one that grows, so a trickle of
    /// writes does not cost a segment of zeros per idle roll.
    use_prepared: bool,
    /// The active segment grows only because the prepared file was not
    /// ready when it was opened (a busy start): once it is, the next
    /// batch rolls into it rather than filling 64 MiB the slow way.
    awaiting_prepared: bool,
    /// Bytes written since the last fdatasync.
    unsynced_bytes: u64,
    /// The size of the fdatasync a recently written byte went out with, a
    /// moving average weighted by bytes (over `PREPARE_SYNC_AVG_BYTES`):
    /// preparation pays only while it is small (`PREPARE_SYNC_BYTES_MAX`).
    sync_bytes_avg: u64,
    /// Compaction requested with [`Cmd::Compact`], run a bounded step per
    /// turn of the loop (see `compact.rs`).
    compaction: compact::Requested,
    /// The lowest segment that may still be dropped from the page cache:
    /// every sealed one below it was, or was on disk at open (see
    /// [`cache`]).
    cache_drop_next: u32,
    /// A seal or a checkpoint may have made a segment cold since the last
    /// look.
    cache_check_due: bool,
    /// What the records since the last checkpoint started did to the
    /// index, so the next checkpoint need not read them back (see
    /// [`facts`]); `None` when dropped.
    facts: Option<facts::Facts>,
}

pub(crate) struct WriterInit {
    pub index: Index,
    pub files: BTreeMap<u32, (Arc<dyn StorageFile>, u64)>,
    pub next_seq: u32,
    pub next_lsn: u64,
    pub checkpoints: Vec<Link>,
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
        rx: Inbox,
        init: WriterInit,
        clock: Arc<dyn Clock>,
    ) -> (Self, Arc<GroupShared>) {
        let sealed = init.files.iter().map(|(s, (_, len))| (*s, *len)).collect();
        let live_at_open = init.index.live_messages();
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
            no_space: Mutex::new(None),
            counters: GroupCounters::default(),
        });
        let now = clock.now();
        let prepared = prepare::Slot::new(Arc::clone(&storage), &shared.dir, cfg.direct_appends);
        let mut w = Writer {
            shared: Arc::clone(&shared),
            storage,
            cfg,
            rx,
            active: None,
            sealed,
            next_seq: init.next_seq,
            next_lsn: init.next_lsn,
            buf: AppendBuf::new(),
            dirty: false,
            last_sync: now,
            last_write: now,
            last_checkpoint: now,
            journal_bytes_since_checkpoint: 0,
            live_at_last_checkpoint: live_at_open,
            checkpoints: init.checkpoints,
            next_checkpoint_no: init.next_checkpoint_no,
            gather: GatherPolicy::default(),
            clock,
            last_compaction: now,
            checkpoint_in_flight: None,
            snapshot_next: !init.index_from_journal,
            unmovable: BTreeMap::new(),
            space: None,
            prepared,
            use_prepared: true,
            awaiting_prepared: false,
            unsynced_bytes: 0,
            sync_bytes_avg: 0,
            compaction: compact::Requested::default(),
            cache_drop_next: init.next_seq,
            cache_check_due: false,
            facts: None,
        };
        // Used only if the newest checkpoint is at this very position (a
        // new store, or one whose last checkpoint left no journal after it).
        w.restart_facts(w.position(), w.next_lsn - 1);
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
                Cmd::Pause(barrier) => barrier.refuse(self.group(), e.to_string()),
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
        self.prepare_next();
        // Kept from batch to batch (emptied by `commit`), so a busy writer
        // does not grow a fresh list, moving every request, per batch.
        let mut batch: Vec<Cmd> = Vec::new();
        let mut writes: Vec<(Op, Option<Waiter>)> = Vec::new();
        let mut controls: Vec<Cmd> = Vec::new();
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
            for cmd in batch.drain(..) {
                match cmd {
                    Cmd::Write { op, done } => writes.push((op, done)),
                    Cmd::Shutdown { done } => shutdown = Some(done),
                    other => controls.push(other),
                }
            }
            if !writes.is_empty() {
                self.commit(&mut writes);
                if writes.capacity() > WRITES_KEPT_MAX {
                    writes = Vec::new();
                }
            }
            for c in controls.drain(..) {
                self.control(c);
            }
            self.compaction_turn();
            if let Some(done) = shutdown {
                self.compaction_abandoned();
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
            self.probe_space_if_due();
            self.housekeeping();
            self.drop_cold_segments();
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
    /// were served within the last two fsyncs (see [`GatherPolicy`]). A
    /// lone committer never waits.
    fn gather(&mut self, batch: &mut Vec<Cmd>) {
        let writes_in = |batch: &[Cmd]| {
            batch
                .iter()
                .filter(|c| matches!(c, Cmd::Write { .. }))
                .count()
        };
        let max = self.cfg.batch_bytes_max;
        let full = |batch: &[Cmd]| batch.iter().map(cmd_size).sum::<usize>() >= max;
        let writes = writes_in(batch);
        let now = self.clock.now();
        let Some((expected, delay)) = self.gather.plan(writes, now, &self.cfg) else {
            return;
        };
        let deadline = now + delay;
        let mut got = writes;
        let c = &self.shared.counters;
        c.gather_waits.fetch_add(1, Ordering::Relaxed);
        c.gather_us_max.fetch_max(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        while got < expected && !full(batch) {
            // One wake-up when all that are expected have come (or at the
            // deadline), then take them: not one wake-up per arrival.
            let left = deadline.saturating_duration_since(self.clock.now());
            let came = self.rx.wait_queued(expected - got, left);
            let disconnected = self.drain(batch);
            got = writes_in(batch);
            if !came || disconnected {
                break;
            }
        }
        if got < expected && !full(batch) {
            self.gather.ran_out(got);
        }
    }

    /// Writes a batch and completes its requests; `writes` is left empty
    /// (its memory kept for the next batch).
    fn commit(&mut self, writes: &mut Vec<(Op, Option<Waiter>)>) {
        let batch_writes = writes.len();
        if let Some(e) = self
            .shared
            .poison_error()
            .or_else(|| self.refused_for_space())
        {
            complete_all(writes, &Err(e), self.rx.queued());
            return;
        }
        let group = self.group();
        writes.retain_mut(|(op, done)| match op.invalid() {
            None => true,
            Some(why) => {
                match done.take() {
                    Some(w) => w.complete(Err(StoreError::Invalid(why))),
                    None => tracing::warn!(group, "request refused: {why}"),
                }
                false
            }
        });
        net_out(writes, &self.shared.counters);
        let force_sync = writes.iter().any(|(op, _)| matches!(op, Op::Flush));
        let mark = self.mark();
        let result = self.append(writes, force_sync);
        self.gather.batch_done(batch_writes, self.clock.now());
        let result = result.map_err(|e| self.write_failed(&mark, e));
        complete_all(writes, &result, self.rx.queued());
    }

    /// Encodes, writes, applies and (per mode) syncs a batch.
    fn append(
        &mut self,
        writes: &[(Op, Option<Waiter>)],
        force_sync: bool,
    ) -> Result<(), StoreError> {
        if self.awaiting_prepared
            && self.active.is_some()
            && self.buf.is_empty()
            && self.prepared.is_ready()
        {
            // Between batches: an early roll into the prepared segment.
            self.seal()?;
            self.use_prepared = true;
        }
        let mut placed: Vec<(Record<'_>, Loc)> = Vec::with_capacity(writes.len());
        for (op, _) in writes {
            let rest = op.payload_rest();
            for rec in op.records() {
                let loc = self.encode(&rec, &rest)?;
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
        self.note_facts(placed.iter().map(|(rec, loc)| (rec, *loc)));
        let c = &self.shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(placed.len() as u64, Ordering::Relaxed);
        c.batch_records.0.observe(placed.len() as u64);
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

    /// Encodes one record into `buf`, its payload continued by `more`
    /// (a payload handed over in pieces), rolling the segment if needed.
    fn encode(&mut self, rec: &Record<'_>, more: &[&[u8]]) -> Result<Loc, StoreError> {
        let more_len: usize = more.iter().map(|m| m.len()).sum();
        let len = (rec.encoded_len() + more_len) as u64;
        if let Some(a) = &self.active {
            let cur = a.len + self.buf.len() as u64;
            if cur + len > self.cfg.segment_size_bytes && cur > SEGMENT_HEADER_BYTES as u64 {
                self.write_buf()?;
                self.seal()?;
                self.use_prepared = true;
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
        self.buf.place(a.len);
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        record::encode_continued(self.shared.salt, lsn, rec, more, self.buf.encoder());
        Ok(loc)
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
            Cmd::Compact { done } => self.compaction_requested(done),
            Cmd::Pause(barrier) => {
                // A backup copies the newest segment as long as the file
                // is at its cut: a prepared one must end at its records.
                match self.active.as_ref().map(|a| self.cut_to_written(a, false)) {
                    Some(Err(e)) => barrier.refuse(self.group(), e.to_string()),
                    Some(Ok(())) | None => barrier.hold(self.group()),
                }
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
        if self.compaction.is_pending() && !self.waiting_for_space() {
            // The next step is due as soon as pending requests are taken.
            consider(self.clock.now());
        }
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
        if self.buf.capacity() > 0 {
            // Released once idle (housekeeping).
            consider(self.last_write + Duration::from_millis(self.cfg.segment_idle_roll_ms));
        }
        if self.checkpoint_in_flight.is_some() {
            consider(self.clock.now() + Duration::from_millis(CHECKPOINT_POLL_MS));
        } else if self.checkpoint_wanted() {
            consider(self.last_checkpoint + Duration::from_millis(self.cfg.checkpoint_interval_ms));
        }
        if let Some(retry_at) = self.space_retry_at() {
            consider(retry_at);
        } else if self.compaction_candidate().is_some() {
            consider(self.last_compaction + Duration::from_millis(self.cfg.compaction_pause_ms));
        }
        at
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
        if let Some(a) = &self.active {
            // The next start finds the segment as a grown one ends.
            if let Err(e) = self.cut_to_written(a, true) {
                return Err(self.poison(e));
            }
        }
        if self
            .checkpoints
            .last()
            .is_none_or(|l| l.info.replay != self.position())
        {
            self.checkpoint()?;
        }
        Ok(())
    }
}
