//! The store: N log groups behind one handle. Splits requests by group,
//! joins multi-group completions, serves reads, and opens (recovers) the
//! whole thing in parallel.
//!
//! Invariants:
//! - A queue's records all go to `group_of(queue)`; a metadata key's to
//!   `crc32c(key) % groups`; so per-queue and per-key order is journal order.
//! - A multi-group publish completes once, after every group it touched
//!   completed, with the first error if any did not.
//! - Message ids handed out by [`Store::next_msg_id`] exceed every id found
//!   on disk (checkpoint high-water marks included), so they are unique
//!   across restarts.

use std::collections::{btree_map, BTreeMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use rand::Rng;

use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::index::Loc;
use crate::manifest::{self, Manifest, MANIFEST_NAME};
use crate::payload::Payload;
use crate::record;
use crate::recovery::{self, GroupRecovery, Progress};
use crate::storage::{OsStorage, Storage, StorageFile};
use crate::writer::{self, Cmd, Done, GroupShared, Op, Outbox, Waiter, Writer, WriterInit};
use crate::{group_of, MsgId, QueueId, StoreConfig};

mod heads;
mod live;
mod online_backup;
mod open;
mod streams;

pub use live::LiveState;
pub use streams::RecoveredStream;

pub use crate::report::{GroupStats, Recovered, RecoveredMessage, RecoveryStats};

struct Group {
    /// How long this group's recovery took when the store opened.
    recovery: Duration,
    /// Requests to the group's writer: never blocks a sender; bounded by
    /// admission (see [`Store::poll_room`]).
    tx: Outbox,
    shared: Arc<GroupShared>,
    thread: Option<JoinHandle<()>>,
}

/// The durable store. `Send + Sync`; share it behind an `Arc`.
pub struct Store {
    groups: Vec<Group>,
    next_msg_id: AtomicU64,
    payload_bytes_max: u32,
    /// What the store's files are read through (a backup reads them).
    storage: Arc<dyn Storage>,
    /// The configured data directories (a backup reads their manifests).
    data_dirs: Vec<PathBuf>,
}

/// A blocking completion, for callers without an async runtime (tests,
/// tools). Async callers pass their own [`Done`] that sends on a oneshot.
pub struct Ticket(mpsc::Receiver<Result<(), StoreError>>);

impl Ticket {
    /// A callback and the ticket it completes.
    pub fn new() -> (Done, Ticket) {
        let (tx, rx) = mpsc::sync_channel(1);
        let done: Done = Box::new(move |r| {
            // The ticket may have been dropped: the caller stopped caring.
            if tx.send(r).is_err() {
                tracing::trace!("completion for a dropped ticket");
            }
        });
        (done, Ticket(rx))
    }

    /// Blocks until the request completed.
    pub fn wait(self) -> Result<(), StoreError> {
        self.0.recv().unwrap_or(Err(StoreError::Closed))
    }
}

/// Joins completions of one request split over several groups.
struct Join {
    remaining: AtomicUsize,
    first_error: Mutex<Option<StoreError>>,
    done: Mutex<Option<Done>>,
}

impl Join {
    fn part(self: &Arc<Self>) -> Done {
        let join = Arc::clone(self);
        Box::new(move |r| {
            if let Err(e) = r {
                join.first_error.lock().get_or_insert(e);
            }
            if join.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                let result = join.first_error.lock().take().map_or(Ok(()), Err);
                if let Some(done) = join.done.lock().take() {
                    done(result);
                }
            }
        })
    }
}

fn fail(done: Option<Done>, e: StoreError) {
    match done {
        Some(done) => done(Err(e)),
        None => tracing::warn!(error = %e, "store request without a completion failed"),
    }
}

fn meta_group(key: &[u8], groups: u32) -> u32 {
    crc32c::crc32c(key) % groups
}

impl Store {
    /// Opens (creating if needed) the store on the real file system.
    /// Number of log groups (fixed at creation).
    pub fn group_count(&self) -> u32 {
        u32::try_from(self.groups.len()).expect("validated")
    }

    /// The lsn of the newest record of `group` known fdatasynced: a
    /// position in the group's journal, every record up to it on stable
    /// storage (0 before the group's first sync since it opened). It never
    /// decreases, except when a write that found the disk full is taken
    /// back after a segment roll had synced part of its batch: those
    /// positions are gone from disk and will be handed out again.
    /// Read from a completion under `store.sync = always`, it is at least
    /// the completed record's position. Panics if `group` is not below
    /// [`Store::group_count`].
    pub fn durable_lsn(&self, group: u32) -> u64 {
        self.groups[group as usize]
            .shared
            .counters
            .durable_lsn
            .load(Ordering::Acquire)
    }

    /// The group holding `queue`.
    pub fn group_of(&self, queue: QueueId) -> u32 {
        group_of(queue, self.group_count())
    }

    /// A fresh message id, never used before in this store.
    pub fn next_msg_id(&self) -> MsgId {
        MsgId(self.next_msg_id.fetch_add(1, Ordering::Relaxed))
    }

    fn send(&self, group: u32, op: Op, done: Option<Done>) {
        let g = &self.groups[group as usize];
        if let Some(e) = g.shared.poison_error() {
            fail(done, e);
            return;
        }
        if let Some(e) = g.shared.no_space.lock().clone() {
            fail(done, e);
            return;
        }
        let done = done.map(|d| Waiter::new(d, group));
        if let Err(mpsc::SendError(Cmd::Write { done, .. })) = g.tx.send(Cmd::Write { op, done }) {
            match done {
                Some(w) => w.complete(Err(StoreError::Closed)),
                None => tracing::warn!("store request without a completion failed: store closed"),
            }
        }
    }

    fn joined(&self, parts: usize, done: Option<Done>) -> Option<Arc<Join>> {
        done.map(|done| {
            Arc::new(Join {
                remaining: AtomicUsize::new(parts),
                first_error: Mutex::new(None),
                done: Mutex::new(Some(done)),
            })
        })
    }

    /// Whether every group's request queue is below `channel_requests_max`.
    pub fn has_room(&self) -> bool {
        self.groups.iter().all(|g| g.tx.room().has_room())
    }

    /// Back-pressure for async callers: `Ready` once every group's request
    /// queue is below `channel_requests_max`; else `Pending`, and `cx` is
    /// woken when the writers have taken enough. Requests are never
    /// refused or blocked for a full queue: a caller that produces writes
    /// on behalf of others (a connection) awaits this before it takes on
    /// more work, so the queues stay bounded without a thread waiting.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        for g in &self.groups {
            if g.tx.room().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        Poll::Ready(())
    }

    /// [`Store::poll_room`] for a thread off any async runtime (tools,
    /// tests): blocks until every group's request queue has room.
    pub fn wait_room(&self) {
        for g in &self.groups {
            g.tx.room().wait();
        }
    }

    /// Stores `payload` as message `msg` in `queues`. The payload is written
    /// once per group among the queues' groups. `done` runs once every group
    /// completed (see docs/DURABILITY.md for what that means per sync mode).
    /// Never blocks: back-pressure is the caller's, through
    /// [`Store::poll_room`] or [`Store::wait_room`] before it sends more.
    pub fn publish(&self, msg: MsgId, queues: &[QueueId], payload: Bytes, done: Option<Done>) {
        self.publish_payload(msg, queues, Payload::from(payload), done);
    }

    /// [`Store::publish`] of a payload handed over in pieces: the group
    /// writer copies them, one after another, straight into its batch, so
    /// the caller need not join them (the bytes stored are the same).
    pub fn publish_payload(
        &self,
        msg: MsgId,
        queues: &[QueueId],
        payload: Payload,
        done: Option<Done>,
    ) {
        if queues.is_empty() || queues.iter().any(|q| q.0 == u64::MAX) {
            fail(
                done,
                StoreError::Invalid("publish needs queues other than u64::MAX".into()),
            );
            return;
        }
        if payload.len() > self.payload_bytes_max as usize {
            fail(
                done,
                StoreError::Invalid(format!(
                    "payload of {} bytes exceeds payload_bytes_max = {}",
                    payload.len(),
                    self.payload_bytes_max
                )),
            );
            return;
        }
        // One queue (the common case) is one group's write: no map of
        // groups, no list of queues on the heap, whose allocations the
        // writer thread would free.
        if let [q] = queues {
            if let Some(why) = writer::publish_invalid(1, payload.len()) {
                fail(done, StoreError::Invalid(why));
                return;
            }
            let op = Op::Publish {
                msg,
                queues: smallvec::smallvec![*q],
                payload,
            };
            self.send(self.group_of(*q), op, done);
            return;
        }
        let mut by_group: BTreeMap<u32, Vec<QueueId>> = BTreeMap::new();
        for q in queues {
            by_group.entry(self.group_of(*q)).or_default().push(*q);
        }
        for qs in by_group.values_mut() {
            qs.sort_unstable();
            qs.dedup();
        }
        // Refused before any group writes a part of it.
        for qs in by_group.values() {
            if let Some(why) = writer::publish_invalid(qs.len(), payload.len()) {
                fail(done, StoreError::Invalid(why));
                return;
            }
        }
        if by_group.len() == 1 {
            let (g, qs) = by_group.pop_first().expect("one");
            self.send(
                g,
                Op::Publish {
                    msg,
                    queues: qs.into(),
                    payload,
                },
                done,
            );
            return;
        }
        let join = self.joined(by_group.len(), done);
        for (g, qs) in by_group {
            self.send(
                g,
                Op::Publish {
                    msg,
                    queues: qs.into(),
                    payload: payload.clone(),
                },
                join.as_ref().map(Join::part),
            );
        }
    }

    /// Removes (acknowledges) `msgs` from `queue`. Removing a message the
    /// queue does not hold is a no-op.
    pub fn remove(&self, queue: QueueId, msgs: &[MsgId], done: Option<Done>) {
        self.send(
            self.group_of(queue),
            Op::Remove {
                queue,
                msgs: msgs.into(),
            },
            done,
        );
    }

    /// Removes every message `queue` holds (queue.purge, queue.delete).
    pub fn purge(&self, queue: QueueId, done: Option<Done>) {
        self.send(self.group_of(queue), Op::Purge { queue }, done);
    }

    /// Sets a metadata key (last write wins).
    pub fn put_meta(&self, key: Bytes, value: Bytes, done: Option<Done>) {
        let g = meta_group(&key, self.group_count());
        self.send(g, Op::MetaPut { key, value }, done);
    }

    /// Deletes a metadata key.
    pub fn delete_meta(&self, key: Bytes, done: Option<Done>) {
        let g = meta_group(&key, self.group_count());
        self.send(g, Op::MetaDelete { key }, done);
    }

    /// Completes once everything requested before is fdatasync'ed in every
    /// group, whatever the sync mode (e.g. for `tx.commit` under `interval`).
    pub fn flush(&self, done: Done) {
        let join = self.joined(self.groups.len(), Some(done));
        for g in 0..self.group_count() {
            self.send(g, Op::Flush, join.as_ref().map(Join::part));
        }
    }

    /// For each message of `queue`: is its publish written (so [`Store::read`]
    /// finds it)? One lock of the queue's group for the whole batch.
    pub fn written(&self, queue: QueueId, msgs: &[MsgId]) -> Vec<bool> {
        let group = &self.groups[self.group_of(queue) as usize];
        let inner = group.shared.inner.lock();
        msgs.iter()
            .map(|m| inner.index.locate(queue, *m).is_some())
            .collect()
    }

    /// Reads message `msg` of `queue` back from disk (pread; the page cache
    /// does the caching). Valid once the publish was written (its
    /// completion ran).
    pub fn read(&self, queue: QueueId, msg: MsgId) -> Result<Bytes, StoreError> {
        self.read_many(queue, &[msg])
            .pop()
            .expect("one result per message")
    }

    /// Reads several messages of `queue` (read-ahead for a queue's next
    /// deliveries): records close to each other in one segment are read
    /// with one `pread` and each is checked against its CRC. One result per
    /// message, in the order asked.
    pub fn read_many(&self, queue: QueueId, msgs: &[MsgId]) -> Vec<Result<Bytes, StoreError>> {
        /// Largest gap between two records still read as one range.
        const GAP_BYTES_MAX: u64 = 64 * 1024;
        /// Largest single read.
        const SPAN_BYTES_MAX: u64 = 4 * 1024 * 1024;
        let group = &self.groups[self.group_of(queue) as usize];
        let located: Vec<Option<(Arc<dyn StorageFile>, Loc)>> = {
            let inner = group.shared.inner.lock();
            msgs.iter()
                .map(|m| {
                    let loc = inner.index.locate(queue, *m)?;
                    let file = inner.files.get(&loc.seg)?;
                    Some((Arc::clone(file), loc))
                })
                .collect()
        };
        let mut out: Vec<Option<Result<Bytes, StoreError>>> = msgs
            .iter()
            .zip(&located)
            .map(|(m, l)| {
                l.is_none().then(|| {
                    Err(StoreError::NotFound {
                        queue: queue.0,
                        msg: m.0,
                    })
                })
            })
            .collect();
        let mut order: Vec<usize> = (0..msgs.len()).filter(|&i| located[i].is_some()).collect();
        order.sort_by_key(|&i| located[i].as_ref().map(|(_, l)| (l.seg, l.offset)));
        let mut at = 0;
        while at < order.len() {
            let (file, first) = located[order[at]].clone().expect("located");
            let start = u64::from(first.offset);
            let mut end = start + u64::from(first.len);
            let mut run_end = at + 1;
            while let Some(&j) = order.get(run_end) {
                let (_, l) = located[j].as_ref().expect("located");
                let (lo, hi) = (u64::from(l.offset), u64::from(l.offset) + u64::from(l.len));
                if l.seg != first.seg || lo > end + GAP_BYTES_MAX || hi - start > SPAN_BYTES_MAX {
                    break;
                }
                end = end.max(hi);
                run_end += 1;
            }
            let path = crate::segment::segment_path(&group.shared.dir, first.seg);
            let read = file.read_owned(start, usize::try_from(end - start).unwrap_or(usize::MAX));
            for &i in &order[at..run_end] {
                let (_, l) = located[i].as_ref().expect("located");
                out[i] = Some(match &read {
                    Err(e) => Err(StoreError::io(
                        "read",
                        &path,
                        std::io::Error::new(e.kind(), e.to_string()),
                    )),
                    Ok(buf) => {
                        let from = (u64::from(l.offset) - start) as usize;
                        payload_of(
                            group.shared.salt,
                            &buf.slice(from..from + l.len as usize),
                            msgs[i],
                            &path,
                            l.offset,
                        )
                    }
                });
            }
            at = run_end;
        }
        out.into_iter()
            .map(|r| r.expect("every message has a result"))
            .collect()
    }

    fn all_groups(&self, make: impl Fn(Done) -> Cmd) -> Result<(), StoreError> {
        let tickets: Vec<Ticket> = self
            .groups
            .iter()
            .map(|g| {
                let (done, ticket) = Ticket::new();
                if let Err(mpsc::SendError(cmd)) = g.tx.send(make(done)) {
                    drop(cmd);
                }
                ticket
            })
            .collect();
        let mut result = Ok(());
        for t in tickets {
            if let Err(e) = t.wait() {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Writes a checkpoint of every group now (blocking).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.all_groups(|done| Cmd::Checkpoint { done })
    }

    /// Compacts every segment eligible now and returns when that is done
    /// (blocking the caller). Each group's writer runs it in steps of at
    /// most `compaction_bytes_per_turn` between its commits, so the
    /// group's publishers keep being written meanwhile. (Without this call,
    /// compaction runs in the background, one step per
    /// `compaction_pause_ms`.)
    pub fn compact(&self) -> Result<(), StoreError> {
        self.all_groups(|done| Cmd::Compact { done })
    }

    /// Per-group counters.
    pub fn stats(&self) -> Vec<GroupStats> {
        self.groups
            .iter()
            .map(|g| {
                let c = &g.shared.counters;
                let (files, live_bytes, live_messages, index_bytes, stream_index_points) = {
                    let inner = g.shared.inner.lock();
                    let files: Vec<Arc<dyn StorageFile>> = inner.files.values().cloned().collect();
                    let live: u64 = inner
                        .files
                        .keys()
                        .map(|s| inner.index.seg_live(*s).bytes)
                        .sum();
                    (
                        files,
                        live,
                        inner.index.live_messages() as u64,
                        inner.index.heap_bytes() as u64,
                        inner.index.stream_points() as u64,
                    )
                };
                let poisoned_by = g.shared.poisoned.lock().as_ref().map(|c| c.to_string());
                let no_space = g.shared.no_space.lock().as_ref().map(ToString::to_string);
                // One fstat per segment, outside the lock the writer takes.
                let segment_bytes = files.iter().map(|f| f.len().unwrap_or(0)).sum();
                GroupStats {
                    sync_latency_us: c.sync_latency_us.0.snapshot(),
                    batch_records: c.batch_records.0.snapshot(),
                    segment_bytes,
                    live_bytes,
                    recovery: g.recovery,
                    group: g.shared.group,
                    poisoned: poisoned_by.is_some(),
                    poisoned_by,
                    no_space,
                    live_messages,
                    index_bytes,
                    stream_index_points,
                    segments: files.len() as u64,
                    batches: c.batches.load(Ordering::Relaxed),
                    records: c.records.load(Ordering::Relaxed),
                    bytes_written: c.bytes_written.load(Ordering::Relaxed),
                    syncs: c.syncs.load(Ordering::Relaxed),
                    sync_us_total: c.sync_us_total.load(Ordering::Relaxed),
                    gather_waits: c.gather_waits.load(Ordering::Relaxed),
                    gather_us_max: c.gather_us_max.load(Ordering::Relaxed),
                    netted_publishes: c.netted_publishes.load(Ordering::Relaxed),
                    checkpoints: c.checkpoints.load(Ordering::Relaxed),
                    checkpoint_snapshots: c.checkpoint_snapshots.load(Ordering::Relaxed),
                    segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
                    segments_uncached: c.segments_uncached.load(Ordering::Relaxed),
                    bytes_compacted: c.bytes_compacted.load(Ordering::Relaxed),
                    unreadable_records: c.unreadable_records.load(Ordering::Relaxed),
                    durable_lsn: c.durable_lsn.load(Ordering::Acquire),
                    write_buffer_bytes: c.write_buffer_bytes.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Clean shutdown: every group writes what it has, syncs, checkpoints
    /// and stops. Returns the first error.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), StoreError> {
        let mut tickets = Vec::new();
        for g in &self.groups {
            let (done, ticket) = Ticket::new();
            if g.tx.send(Cmd::Shutdown { done: Some(done) }).is_ok() {
                tickets.push(ticket);
            }
        }
        let mut result = Ok(());
        for t in tickets {
            if let Err(e) = t.wait() {
                result = result.and(Err(e));
            }
        }
        for g in &mut self.groups {
            if let Some(t) = g.thread.take() {
                if t.join().is_err() {
                    tracing::error!(group = g.shared.group, "writer thread panicked");
                    result = result.and(Err(StoreError::WriterDied {
                        group: g.shared.group,
                        reason: "its thread panicked while failing requests".into(),
                    }));
                }
            }
            if let (Some(e), Ok(())) = (g.shared.poison_error(), &result) {
                result = Err(e);
            }
        }
        result
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "store shutdown on drop failed");
        }
    }
}

/// The payload of `msg` in `record` (its bytes as stored), after checking
/// the record's CRC and that it is the message's publish or relocation.
fn payload_of(
    salt: u32,
    record: &Bytes,
    msg: MsgId,
    path: &Path,
    offset: u32,
) -> Result<Bytes, StoreError> {
    match record::message_payload(salt, record, msg) {
        Ok(payload) => Ok(record.slice_ref(payload)),
        Err(other) => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: u64::from(offset),
            reason: format!("record of {msg} does not verify: {other:?}"),
        }),
    }
}
