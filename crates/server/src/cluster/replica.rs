//! A member's own copy of the replicated state: every committed journal
//! command applied, in log order, to this member's store — on followers
//! and on the leader alike. A follower that becomes leader opens its broker
//! from this store, as after a restart.
//!
//! Invariants:
//! - At a start the store is first made equal to the last snapshot (or
//!   emptied, with none), and then Raft re-applies every entry after it:
//!   so a command is never applied on top of its own effects, and the store
//!   need not be durable ahead of the Raft log. (Skipping publishes the
//!   store already holds is not enough: a removal or purge still queued
//!   in the store would hide a later publish of the same message.)
//! - A snapshot lists the whole state as commands (every metadata key,
//!   every live message of every queue with its body); restoring one makes
//!   the store equal to it, whatever the store held before.
//! - A command this member cannot apply (undecodable, or its store failed
//!   a write) is never skipped silently: the replica is marked failed, and
//!   the member stops serving and restarts (see `member`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use berth_store::{MsgId, QueueId, StoreError, Ticket};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use super::command::Command;
use super::view::{Announcements, Serves};
use crate::journal::{blocking, StoreJournal};

pub struct Replica {
    /// The store commands are applied to; swapped (under the write lock)
    /// when a new leader reopens it for its broker.
    store: RwLock<Option<Arc<StoreJournal>>>,
    /// Where each leader said it serves clients.
    announced: Arc<Announcements>,
    /// The first reason this replica diverged from the log, if it did.
    failed: Arc<Mutex<Option<String>>>,
}

impl Replica {
    pub fn new(store: Arc<StoreJournal>, announced: Arc<Announcements>) -> Self {
        Self {
            store: RwLock::new(Some(store)),
            announced,
            failed: Arc::default(),
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
    /// current one and returns its successor (or an error, and the
    /// replica is marked failed).
    pub fn reopen<E: std::fmt::Display>(
        &self,
        reopen: impl FnOnce(Arc<StoreJournal>) -> Result<Arc<StoreJournal>, E>,
    ) -> Result<Arc<StoreJournal>, String> {
        let mut slot = self.store.write();
        let Some(current) = slot.take() else {
            return Err("the store is closed".into());
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
        let failed = Arc::clone(&self.failed);
        Box::new(move |r: Result<(), StoreError>| {
            if let Err(e) = r {
                let why = format!("applying entry {index} failed: {e}");
                tracing::error!("this member's store no longer follows the Raft log: {why}");
                failed.lock().get_or_insert(why);
            }
        })
    }

    fn apply_command(&self, index: u64, cmd: Command) {
        let slot = self.store.read();
        let Some(journal) = slot.as_ref() else {
            drop(slot);
            self.fail(format!("entry {index} came while the store was closed"));
            return;
        };
        let store = &journal.store;
        match cmd {
            Command::Publish {
                msg,
                queues,
                payload,
            } => {
                let queues: Vec<QueueId> = queues.into_iter().map(QueueId).collect();
                store.publish(MsgId(msg), &queues, payload, Some(self.watch(index)));
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
            } => store.append(QueueId(queue), offset, payload, Some(self.watch(index))),
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
    }

    fn snapshot(&self) -> Vec<u8> {
        if let Err(e) = self.flush() {
            refuse_snapshot(&format!("the store could not be flushed: {e}"));
        }
        let Some(journal) = self.store() else {
            refuse_snapshot("the store is closed");
        };
        let live = journal.store.live_state();
        let mut out = Vec::new();
        let mut put = |c: Command| {
            let bytes = c.encode();
            out.extend_from_slice(
                &u32::try_from(bytes.len())
                    .expect("one command is bounded by the store's record size")
                    .to_le_bytes(),
            );
            out.extend_from_slice(&bytes);
        };
        for name in self.announced.names().into_values() {
            put(Command::Member { name });
        }
        for (name, serves) in &self.announced.all() {
            put(Command::Announce {
                name: name.clone(),
                amqp: serves.amqp.clone(),
                http: serves.http.clone(),
            });
        }
        for (key, value) in live.metadata {
            put(Command::PutMeta { key, value });
        }
        for (queue, (first, _)) in live.streams {
            // The trim point first, so the copy keeps the same first offset.
            put(Command::Trim {
                queue: queue.0,
                below: first,
            });
            let mut from = first;
            loop {
                let batch = blocking(|| journal.store.read_stream(queue, from, 1024, 8 << 20))
                    .unwrap_or_else(|e| {
                        refuse_snapshot(&format!("stream {} could not be read: {e}", queue.0))
                    });
                let Some(&(last, _)) = batch.last() else {
                    break;
                };
                for (offset, payload) in batch {
                    put(Command::Append {
                        queue: queue.0,
                        offset,
                        payload,
                    });
                }
                from = last + 1;
            }
        }
        for (queue, msgs) in live.queues {
            let bodies = blocking(|| journal.store.read_many(queue, &msgs));
            for (msg, body) in msgs.into_iter().zip(bodies) {
                match body {
                    Ok(payload) => put(Command::Publish {
                        msg: msg.0,
                        queues: vec![queue.0],
                        payload,
                    }),
                    Err(e) => refuse_snapshot(&format!(
                        "message {} of queue {} could not be read: {e}",
                        msg.0, queue.0
                    )),
                }
            }
        }
        out
    }

    fn start_empty(&self) {
        self.restore(&[]);
    }

    fn restore(&self, snapshot: &[u8]) {
        let commands = match split(&Bytes::copy_from_slice(snapshot)) {
            Ok(c) => c,
            Err(e) => {
                self.fail(format!("the snapshot does not decode: {e}"));
                return;
            }
        };
        let mut meta: BTreeMap<Bytes, Bytes> = BTreeMap::new();
        let mut queues: BTreeMap<QueueId, BTreeMap<MsgId, Bytes>> = BTreeMap::new();
        let mut streams: BTreeMap<QueueId, (u64, Vec<(u64, Bytes)>)> = BTreeMap::new();
        for c in commands {
            match c {
                Command::PutMeta { key, value } => {
                    meta.insert(key, value);
                }
                Command::Publish {
                    msg,
                    queues: qs,
                    payload,
                } => {
                    for q in qs {
                        queues
                            .entry(QueueId(q))
                            .or_default()
                            .insert(MsgId(msg), payload.clone());
                    }
                }
                Command::Announce { name, amqp, http } => {
                    self.announced.set(name, Serves { amqp, http });
                }
                Command::Member { name } => {
                    self.announced.set_name(super::peers::raft_id(&name), name);
                }
                Command::Trim { queue, below } => {
                    streams.entry(QueueId(queue)).or_default().0 = below;
                }
                Command::Append {
                    queue,
                    offset,
                    payload,
                } => streams
                    .entry(QueueId(queue))
                    .or_default()
                    .1
                    .push((offset, payload)),
                other => self.fail(format!("a snapshot holds {other:?}")),
            }
        }
        // What this member applied before the snapshot may still be on
        // its way to the index: read the state only once it is there, or
        // those writes would land after the snapshot and outlive it.
        if let Err(e) = self.flush() {
            self.fail(format!(
                "the store could not be flushed before a snapshot: {e}"
            ));
            return;
        }
        let Some(journal) = self.store() else {
            self.fail("a snapshot came while the store was closed".into());
            return;
        };
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
        for queue in live.queues.keys().filter(|q| !queues.contains_key(*q)) {
            store.purge(*queue, Some(self.watch(0)));
        }
        // A stream is taken as the snapshot has it: its records replace
        // whatever this member held (offsets are the stream's own, so a
        // partial copy could not be merged record by record).
        for queue in live.streams.keys() {
            store.purge(*queue, Some(self.watch(0)));
        }
        for (queue, (first, records)) in streams {
            if first > 0 {
                store.trim(queue, first, Some(self.watch(0)));
            }
            for (offset, payload) in records {
                store.append(queue, offset, payload, Some(self.watch(0)));
            }
        }
        for (queue, wanted) in &queues {
            let held: BTreeSet<MsgId> = live
                .queues
                .get(queue)
                .map(|m| m.iter().copied().collect())
                .unwrap_or_default();
            let extra: Vec<MsgId> = held
                .iter()
                .filter(|m| !wanted.contains_key(m))
                .copied()
                .collect();
            if !extra.is_empty() {
                store.remove(*queue, &extra, Some(self.watch(0)));
            }
            for (msg, payload) in wanted.iter().filter(|(m, _)| !held.contains(m)) {
                store.publish(*msg, &[*queue], payload.clone(), Some(self.watch(0)));
            }
        }
        if let Err(e) = self.flush() {
            self.fail(format!(
                "the store could not be flushed after a snapshot: {e}"
            ));
        }
    }
}

/// A snapshot that would miss part of the state must never be built
/// (Raft would purge the log behind it): the process ends instead, and
/// restarts from its Raft log and last good snapshot.
fn refuse_snapshot(why: &str) -> ! {
    tracing::error!("cannot build a complete snapshot: {why}; this member stops");
    std::process::exit(3)
}

/// The commands of a snapshot (`u32 LE length | command`, repeated).
fn split(whole: &Bytes) -> Result<Vec<Command>, String> {
    let mut bytes: &[u8] = whole;
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 4 {
            return Err(format!("{} bytes where a length belongs", bytes.len()));
        }
        let n = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let rest = &bytes[4..];
        if rest.len() < n {
            return Err(format!("a command of {n} bytes in {}", rest.len()));
        }
        out.push(Command::decode(&whole.slice_ref(&rest[..n]))?);
        bytes = &rest[n..];
    }
    Ok(out)
}
