//! A member's own copy of the replicated state: every committed journal
//! command applied, in log order, to this member's store — on followers
//! and on the leader alike. A follower that becomes leader opens its broker
//! from this store, as after a restart.
//!
//! Invariants:
//! - The store records, under [`HELD_THROUGH_KEY`], a log index through
//!   which it durably holds every committed entry's writes: written after
//!   the flush of a snapshot's capture and after a snapshot is restored.
//! - At a start whose store holds at least the last snapshot (that key at
//!   or past the snapshot's index, no store damage, an undamaged Raft log
//!   that reaches it), the store is kept as it is, and Raft re-applies
//!   every entry after the snapshot *as a replay*: up to the last entry of
//!   this member's log, a publish or append the store already holds is
//!   skipped, unless a purge of its queue came earlier in the replay (a
//!   purge still queued in the store would hide it). Every other write
//!   sets its state whatever came before (a publish sets a message's
//!   queues, a removal or trim of what is gone does nothing), so writing
//!   it again ends in the same state. Any other start makes the store
//!   equal to the snapshot (or empty, with none) first, as a follower
//!   that installs a snapshot does.
//! - A snapshot lists the whole state as commands (every metadata key,
//!   every live message of every queue with its body); restoring one makes
//!   the store equal to it, whatever the store held before.
//! - A snapshot being written reaches the store through the replica, one
//!   read at a time, never holding it across reads: a member that becomes
//!   leader during a long build reopens the store at once, and the build
//!   goes on reading from the reopened one.
//! - A command this member cannot apply (undecodable, or its store failed
//!   a write) is never skipped silently: the replica is marked failed, and
//!   the member stops serving and restarts (see `member`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use berth_cluster::{Resume, SnapshotSource, WriteSnapshot};
use berth_store::{LiveState, MsgId, QueueId, StoreError, Ticket};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use super::command::Command;
use super::view::{Announcements, Serves};
use crate::limits::{
    REOPEN_WAIT, REPLICA_UNWRITTEN_BYTES_MAX, SNAPSHOT_COMMAND_BYTES_MAX, SNAPSHOT_READ_BYTES_MAX,
    SNAPSHOT_READ_COUNT_MAX,
};
use crate::store_journal::{blocking, StoreJournal};

/// Bytes counted as unwritten until the write's completion runs or is
/// dropped (a writer that died): so a lost completion never leaves the
/// replica waiting for it.
struct Owed {
    unwritten: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.unwritten.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Where the replica's store is: swapped (under the write lock) when a new
/// leader reopens it for its broker.
type Slot = Arc<RwLock<Option<Arc<StoreJournal>>>>;

pub struct Replica {
    /// The store commands are applied to.
    store: Slot,
    /// Where each leader said it serves clients.
    announced: Arc<Announcements>,
    /// The first reason this replica diverged from the log, if it did.
    failed: Arc<Mutex<Option<String>>>,
    /// Bytes of bodies handed to the store whose write has not completed.
    unwritten: Arc<AtomicUsize>,
    /// What the store held when it was opened: [`HELD_THROUGH_KEY`]'s
    /// index, `None` if absent or if the store's recovery found damage.
    held_at_open: Option<u64>,
    /// Entries up to this index are a replay (see the module doc); 0: none.
    replay_through: AtomicU64,
    /// The queues purged so far in the replay.
    replay_purged: Mutex<BTreeSet<QueueId>>,
}

/// The metadata key (kind `r`, docs/FORMAT.md) under which a member's
/// store records the Raft log index through which it durably holds every
/// committed entry's writes, as a `u64` LE. It is this member's own: never
/// replicated, never in a snapshot.
pub const HELD_THROUGH_KEY: &[u8] = b"r\0held-through";

/// The index a store holds through, from its recovered metadata and damage.
pub fn held_through(recovered: &berth_store::Recovered) -> Option<u64> {
    if !recovered.damage.is_empty() {
        return None;
    }
    let v = recovered.metadata.get(HELD_THROUGH_KEY)?;
    Some(u64::from_le_bytes(v.as_ref().try_into().ok()?))
}

impl Replica {
    /// A replica of `store`, which holds every entry's writes through
    /// `held_at_open` ([`held_through`] of its recovery; `None` if unknown).
    pub fn new(
        store: Arc<StoreJournal>,
        announced: Arc<Announcements>,
        held_at_open: Option<u64>,
    ) -> Self {
        Self {
            store: Arc::new(RwLock::new(Some(store))),
            announced,
            failed: Arc::default(),
            unwritten: Arc::default(),
            held_at_open,
            replay_through: AtomicU64::new(0),
            replay_purged: Mutex::default(),
        }
    }

    /// Why this replica no longer follows the log, if it does not.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// The store as it is now (`None` only after a failed reopen).
    pub fn store(&self) -> Option<Arc<StoreJournal>> {
        self.store.read().clone()
    }

    /// Replaces the store while no command is applied: `reopen` gets the
    /// current one, once no other part of the process holds it (a
    /// snapshot's writer lets go after its current read), and returns its
    /// successor (or an error, and the replica is marked failed).
    pub fn reopen<E: std::fmt::Display>(
        &self,
        reopen: impl FnOnce(StoreJournal) -> Result<Arc<StoreJournal>, E>,
    ) -> Result<Arc<StoreJournal>, String> {
        let mut slot = self.store.write();
        let Some(mut current) = slot.take() else {
            return Err("the store is closed".into());
        };
        let waited = std::time::Instant::now();
        let current = loop {
            match Arc::try_unwrap(current) {
                Ok(only) => break only,
                Err(shared) if waited.elapsed() < REOPEN_WAIT => {
                    current = shared;
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(_) => {
                    let why = format!(
                        "the store could not be reopened: still in use by another part of \
                         this process after {REOPEN_WAIT:?}"
                    );
                    self.fail(why.clone());
                    return Err(why);
                }
            }
        };
        match reopen(current) {
            Ok(next) => {
                *slot = Some(Arc::clone(&next));
                Ok(next)
            }
            Err(e) => {
                let why = format!("the store could not be reopened: {e}");
                self.fail(why.clone());
                Err(why)
            }
        }
    }

    fn fail(&self, why: String) {
        tracing::error!("this member's store no longer follows the Raft log: {why}");
        self.failed.lock().get_or_insert(why);
    }

    /// A completion that marks the replica failed if its write fails.
    fn watch(&self, index: u64) -> berth_store::Done {
        self.watch_bytes(index, 0)
    }

    /// [`Replica::watch`] of a write of `bytes` of bodies, counted as
    /// unwritten until it completes.
    fn watch_bytes(&self, index: u64, bytes: usize) -> berth_store::Done {
        let failed = Arc::clone(&self.failed);
        self.unwritten.fetch_add(bytes, Ordering::AcqRel);
        let owed = Owed {
            unwritten: Arc::clone(&self.unwritten),
            bytes,
        };
        Box::new(move |r: Result<(), StoreError>| {
            drop(owed);
            if let Err(e) = r {
                let why = format!("applying entry {index} failed: {e}");
                tracing::error!("this member's store no longer follows the Raft log: {why}");
                failed.lock().get_or_insert(why);
            }
        })
    }

    /// Applies `cmd`.
    fn apply_command(&self, index: u64, cmd: Command) {
        let slot = self.store.read();
        let Some(journal) = slot.as_ref() else {
            drop(slot);
            self.fail(format!("entry {index} came while the store was closed"));
            return;
        };
        let store = &journal.store;
        if index <= self.replay_through.load(Ordering::Acquire) && self.held(store, &cmd) {
            return;
        }
        match cmd {
            Command::Publish {
                msg,
                queues,
                payload,
            } => {
                let queues: Vec<QueueId> = queues.into_iter().map(QueueId).collect();
                let done = self.watch_bytes(index, payload.len());
                store.publish(MsgId(msg), &queues, payload, Some(done));
            }
            Command::Remove { queue, msgs } => {
                let msgs: Vec<MsgId> = msgs.into_iter().map(MsgId).collect();
                store.remove(QueueId(queue), &msgs, Some(self.watch(index)));
            }
            Command::Purge { queue } => store.purge(QueueId(queue), Some(self.watch(index))),
            Command::PutMeta { key, value } => {
                store.put_meta(key, value, Some(self.watch(index)));
            }
            Command::DeleteMeta { key } => store.delete_meta(key, Some(self.watch(index))),
            Command::Append {
                queue,
                offset,
                payload,
            } => {
                let done = self.watch_bytes(index, payload.len());
                store.append(QueueId(queue), offset, payload, Some(done));
            }
            Command::Trim { queue, below } => {
                store.trim(QueueId(queue), below, Some(self.watch(index)));
            }
            Command::Announce { name, amqp, http } => {
                tracing::info!(member = %name, amqp = %amqp, http = %http, "a new leader serves clients");
                self.announced.set(name, Serves { amqp, http });
            }
            Command::Member { name } => {
                tracing::info!(member = %name, "a member is named");
                self.announced.set_name(super::peers::raft_id(&name), name);
            }
        }
    }

    /// In a replay: does the store hold `cmd`'s write already (a publish
    /// in every one of its queues, an append), with no purge of its queue
    /// earlier in the replay? A purge is noted here.
    fn held(&self, store: &berth_store::Store, cmd: &Command) -> bool {
        let mut purged = self.replay_purged.lock();
        match cmd {
            Command::Publish { msg, queues, .. } => queues.iter().all(|q| {
                !purged.contains(&QueueId(*q)) && store.written(QueueId(*q), &[MsgId(*msg)])[0]
            }),
            Command::Append { queue, offset, .. } => {
                !purged.contains(&QueueId(*queue))
                    && store
                        .stream_bounds(QueueId(*queue))
                        .is_some_and(|(_, end)| *offset < end)
            }
            Command::Purge { queue } => {
                purged.insert(QueueId(*queue));
                false
            }
            _ => false,
        }
    }

    /// Records that the store holds every entry's writes through `at`, once
    /// everything handed to it so far is durable (the record itself may
    /// follow later: until it does, a start restores the snapshot).
    fn note_held_through(&self, at: u64) -> Result<(), StoreError> {
        self.flush()?;
        let Some(journal) = self.store() else {
            return Err(StoreError::Invalid("the store is closed".into()));
        };
        journal.store.put_meta(
            Bytes::from_static(HELD_THROUGH_KEY),
            Bytes::copy_from_slice(&at.to_le_bytes()),
            Some(self.watch(at)),
        );
        Ok(())
    }

    /// Waits while the store has more than [`REPLICA_UNWRITTEN_BYTES_MAX`]
    /// of bodies to write (a start applying hundreds of MB of log), until
    /// half of that is left; nothing to wait for while it keeps up.
    fn keep_up(&self) {
        if self.unwritten.load(Ordering::Acquire) <= REPLICA_UNWRITTEN_BYTES_MAX {
            return;
        }
        blocking(|| {
            while self.unwritten.load(Ordering::Acquire) > REPLICA_UNWRITTEN_BYTES_MAX / 2
                && self.failure().is_none()
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
    }

    /// Waits until everything handed to the store is durable.
    fn flush(&self) -> Result<(), StoreError> {
        let Some(journal) = self.store() else {
            return Err(StoreError::Invalid("the store is closed".into()));
        };
        let (done, ticket) = Ticket::new();
        journal.store.flush(done);
        blocking(|| ticket.wait())
    }
}

impl berth_cluster::Apply for Replica {
    fn apply(&self, index: u64, command: Bytes) {
        match Command::decode(&command) {
            Ok(cmd) => self.apply_command(index, cmd),
            Err(e) => self.fail(format!("entry {index} does not decode: {e}")),
        }
        self.keep_up();
    }

    fn capture(&self, at: u64) -> WriteSnapshot {
        // Everything applied so far must be in the index before it is
        // listed; the listing is ids only, the bodies are read later.
        // Durable too: a start then keeps the store instead of restoring
        // this snapshot into it.
        if let Err(e) = self.note_held_through(at) {
            refuse_snapshot(&format!("the store could not be flushed: {e}"));
        }
        let Some(journal) = self.store() else {
            refuse_snapshot("the store is closed");
        };
        let live = journal.store.live_state();
        drop(journal);
        let names = self.announced.names();
        let serving = self.announced.all();
        let slot = Arc::clone(&self.store);
        let store = move || {
            slot.read()
                .clone()
                .ok_or_else(|| io::Error::other("the store closed during the snapshot"))
        };
        Box::new(move |out: &mut dyn Write| write_snapshot(&store, live, names, serving, out))
    }

    fn start_empty(&self) {
        self.restore(&Vec::new(), 0);
    }

    fn restore(&self, snapshot: &dyn SnapshotSource, at: u64) {
        self.replay_through.store(0, Ordering::Release);
        let restored = self.restore_from(snapshot).and_then(|()| {
            self.note_held_through(at)
                .map_err(|e| format!("the store could not be flushed after a snapshot: {e}"))
        });
        if let Err(e) = restored {
            self.fail(e);
        }
    }

    fn resume(&self, from: Resume<'_>) {
        let at = from.snapshot.map_or(0, |(_, at)| at);
        let keep = self
            .held_at_open
            .filter(|held| !from.log_damaged && at <= *held && *held <= from.log_last);
        let Some(held) = keep else {
            match from.snapshot {
                Some((s, at)) => {
                    tracing::info!(
                        snapshot = at,
                        store_held = ?self.held_at_open,
                        log_last = from.log_last,
                        log_damaged = from.log_damaged,
                        "the store is made equal to the last snapshot before the log after it is applied again"
                    );
                    self.restore(s, at);
                }
                None => self.start_empty(),
            }
            return;
        };
        tracing::info!(
            snapshot = at,
            store_held = held,
            log_last = from.log_last,
            "the store holds the last snapshot: kept, and the log after it is replayed"
        );
        if let Some((s, _)) = from.snapshot {
            if let Err(e) = self.restore_members(s) {
                self.fail(e);
            }
        }
        self.replay_purged.lock().clear();
        self.replay_through.store(from.log_last, Ordering::Release);
    }
}

/// Writes a snapshot's commands (`u32 LE length | command`, repeated):
/// the members and where they serve, every metadata key, every stream's
/// records and every queue's live messages with their bodies, read a few
/// at a time. Runs off the apply path, while later commands are applied:
/// a message removed since the capture is left out (its removal is in
/// the log after the snapshot), a stream is copied only up to where it
/// ended at the capture.
fn write_snapshot(
    store: &dyn Fn() -> io::Result<Arc<StoreJournal>>,
    live: LiveState,
    names: BTreeMap<u64, String>,
    serving: BTreeMap<String, Serves>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut put = |c: Command| -> io::Result<()> {
        let bytes = c.encode();
        let len =
            u32::try_from(bytes.len()).expect("one command is bounded by the store's record size");
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&bytes)
    };
    for name in names.into_values() {
        put(Command::Member { name })?;
    }
    for (name, serves) in serving {
        put(Command::Announce {
            name,
            amqp: serves.amqp,
            http: serves.http,
        })?;
    }
    for (key, value) in live.metadata {
        if key.as_ref() == HELD_THROUGH_KEY {
            continue; // this member's own
        }
        put(Command::PutMeta { key, value })?;
    }
    for (queue, (first, end)) in live.streams {
        let mut from = first;
        let mut trim_written = false;
        loop {
            let batch = store()?
                .store
                .read_stream(
                    queue,
                    from,
                    SNAPSHOT_READ_COUNT_MAX,
                    SNAPSHOT_READ_BYTES_MAX,
                )
                .unwrap_or_else(|e| {
                    refuse_snapshot(&format!("stream {} could not be read: {e}", queue.0))
                });
            let batch: Vec<(u64, Bytes)> =
                batch.into_iter().take_while(|(o, _)| *o < end).collect();
            if !trim_written {
                // The trim point first, so the copy keeps the same first
                // offset (later if a trim since the capture moved it).
                let below = batch.first().map_or(end, |(o, _)| *o).max(first);
                put(Command::Trim {
                    queue: queue.0,
                    below,
                })?;
                trim_written = true;
            }
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            for (offset, payload) in batch {
                put(Command::Append {
                    queue: queue.0,
                    offset,
                    payload,
                })?;
            }
            from = last + 1;
            if from >= end {
                break;
            }
        }
    }
    for (queue, msgs) in live.queues {
        let mut at = 0;
        while at < msgs.len() {
            let ids = &msgs[at..(at + SNAPSHOT_READ_COUNT_MAX).min(msgs.len())];
            // As many bodies as fit the byte bound, by the index's sizes.
            let bodies = store()?
                .store
                .read_within(queue, ids, SNAPSHOT_READ_BYTES_MAX);
            let read = bodies.len();
            for (msg, body) in ids.iter().zip(bodies) {
                match body {
                    Ok(payload) => {
                        put(Command::Publish {
                            msg: msg.0,
                            queues: vec![queue.0],
                            payload,
                        })?;
                    }
                    // Removed since the capture: its removal follows the
                    // snapshot in the log.
                    Err(StoreError::NotFound { .. }) => {}
                    Err(e) => refuse_snapshot(&format!(
                        "message {} of queue {} could not be read: {e}",
                        msg.0, queue.0
                    )),
                }
            }
            at += read.max(1);
        }
    }
    Ok(())
}

/// Reads a snapshot's commands one at a time.
struct Commands<'a> {
    from: Box<dyn Read + 'a>,
}

impl Commands<'_> {
    fn next(&mut self) -> Result<Option<Command>, String> {
        let mut len = [0u8; 4];
        match self.from.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(format!("the snapshot could not be read: {e}")),
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > SNAPSHOT_COMMAND_BYTES_MAX {
            return Err(format!(
                "a snapshot command of {n} bytes is claimed (damage)"
            ));
        }
        let mut bytes = vec![0u8; n];
        self.from
            .read_exact(&mut bytes)
            .map_err(|e| format!("a command of {n} bytes is cut short: {e}"))?;
        Command::decode(&Bytes::from(bytes)).map(Some)
    }
}

impl Replica {
    fn commands<'a>(snapshot: &'a dyn SnapshotSource) -> Result<Commands<'a>, String> {
        snapshot
            .open()
            .map(|from| Commands { from })
            .map_err(|e| format!("the snapshot could not be opened: {e}"))
    }

    /// Makes the store equal to the snapshot in two passes over it: the
    /// first lists what it holds (keys and ids, never bodies), the store's
    /// extra state is then removed, and the second writes what the store
    /// lacks. Memory: the metadata and the message ids, not the bodies.
    ///
    /// A snapshot names a message held by several queues once per queue
    /// (it lists queue by queue). A store publish sets a message's queues
    /// in its group, it does not add to them: so a message is written
    /// once, to every queue the snapshot gives it, when any of them lacks
    /// it (one queue at a time, each publish undid the one before).
    /// Takes the members and where they serve from a snapshot (its first
    /// commands), leaving the store alone.
    fn restore_members(&self, snapshot: &dyn SnapshotSource) -> Result<(), String> {
        let mut commands = Self::commands(snapshot)?;
        while let Some(c) = commands.next()? {
            match c {
                Command::Announce { name, amqp, http } => {
                    self.announced.set(name, Serves { amqp, http });
                }
                Command::Member { name } => {
                    self.announced.set_name(super::peers::raft_id(&name), name);
                }
                _ => break,
            }
        }
        Ok(())
    }

    fn restore_from(&self, snapshot: &dyn SnapshotSource) -> Result<(), String> {
        let mut meta: BTreeMap<Bytes, Bytes> = BTreeMap::new();
        let mut wanted: BTreeMap<MsgId, SmallVec<[QueueId; 1]>> = BTreeMap::new();
        let mut commands = Self::commands(snapshot)?;
        while let Some(c) = commands.next()? {
            match c {
                Command::PutMeta { key, value } => {
                    meta.insert(key, value);
                }
                Command::Publish {
                    msg, queues: qs, ..
                } => {
                    let at = wanted.entry(MsgId(msg)).or_default();
                    for q in qs {
                        if !at.contains(&QueueId(q)) {
                            at.push(QueueId(q));
                        }
                    }
                }
                Command::Announce { name, amqp, http } => {
                    self.announced.set(name, Serves { amqp, http });
                }
                Command::Member { name } => {
                    self.announced.set_name(super::peers::raft_id(&name), name);
                }
                Command::Trim { .. } | Command::Append { .. } => {}
                other => return Err(format!("a snapshot holds {other:?}")),
            }
        }
        // What this member applied before the snapshot may still be on
        // its way to the index: read the state only once it is there, or
        // those writes would land after the snapshot and outlive it.
        self.flush()
            .map_err(|e| format!("the store could not be flushed before a snapshot: {e}"))?;
        let journal = self
            .store()
            .ok_or("a snapshot came while the store was closed")?;
        let store = &journal.store;
        let live = store.live_state();
        for key in live.metadata.keys().filter(|k| !meta.contains_key(*k)) {
            store.delete_meta(key.clone(), Some(self.watch(0)));
        }
        for (key, value) in &meta {
            if live.metadata.get(key) != Some(value) {
                store.put_meta(key.clone(), value.clone(), Some(self.watch(0)));
            }
        }
        drop(meta);
        let queues: BTreeSet<QueueId> = wanted.values().flatten().copied().collect();
        for queue in live.queues.keys().filter(|q| !queues.contains(*q)) {
            store.purge(*queue, Some(self.watch(0)));
        }
        // A stream is taken as the snapshot has it: its records replace
        // whatever this member held (offsets are the stream's own, so a
        // partial copy could not be merged record by record).
        for queue in live.streams.keys() {
            store.purge(*queue, Some(self.watch(0)));
        }
        let mut held: BTreeMap<QueueId, BTreeSet<MsgId>> = BTreeMap::new();
        for (queue, msgs) in live.queues {
            if !queues.contains(&queue) {
                continue;
            }
            let extra: Vec<MsgId> = msgs
                .iter()
                .filter(|m| !wanted.get(m).is_some_and(|qs| qs.contains(&queue)))
                .copied()
                .collect();
            if !extra.is_empty() {
                store.remove(queue, &extra, Some(self.watch(0)));
            }
            held.insert(queue, msgs.into_iter().collect());
        }
        drop(queues);
        // The second pass: what the store lacks, written as apply writes
        // (waiting while the store is behind, so its queue stays bounded).
        let mut commands = Self::commands(snapshot)?;
        while let Some(c) = commands.next()? {
            match c {
                Command::Publish { msg, payload, .. } => {
                    // Taken: a later command naming the message again
                    // (for another of its queues) finds it done.
                    let Some(qs) = wanted.remove(&MsgId(msg)) else {
                        continue;
                    };
                    let lacking = qs
                        .iter()
                        .any(|q| !held.get(q).is_some_and(|h| h.contains(&MsgId(msg))));
                    if !lacking {
                        continue;
                    }
                    let done = self.watch_bytes(0, payload.len());
                    store.publish(MsgId(msg), &qs, payload, Some(done));
                }
                Command::Trim { queue, below } if below > 0 => {
                    store.trim(QueueId(queue), below, Some(self.watch(0)));
                }
                Command::Append {
                    queue,
                    offset,
                    payload,
                } => {
                    let done = self.watch_bytes(0, payload.len());
                    store.append(QueueId(queue), offset, payload, Some(done));
                }
                _ => {}
            }
            self.keep_up();
        }
        // Made durable by the caller's `note_held_through`, which flushes.
        Ok(())
    }
}

/// A snapshot that would miss part of the state must never be built
/// (Raft would purge the log behind it): the process ends instead, and
/// restarts from its Raft log and last good snapshot.
fn refuse_snapshot(why: &str) -> ! {
    tracing::error!("cannot build a complete snapshot: {why}; this member stops");
    std::process::exit(3)
}
