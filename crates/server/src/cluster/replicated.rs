//! The broker's journal on a cluster's leader: every write becomes a
//! command in the Raft log, and completes once the entry holding it is
//! committed — on a majority of members, each having fdatasynced it — and
//! applied to this member's store. Reads come from this member's store.
//!
//! How it keeps the contract written on
//! [`berth_broker::durable::Journal`]: positions are Raft log order, one
//! order for every group (stronger than the contract asks); a call hands
//! its command to one forwarding task through an unbounded channel, in
//! call order, and that task submits them to the Raft node one after
//! another, so the log keeps the order of the calls; completions run on
//! the node's gathering task in log order; a write that did not commit
//! (no majority, leadership lost, disk stalled) completes with `Err`.
//!
//! Invariants:
//! - A completion with `Ok` is never run before the entry is committed on
//!   a majority of disks (`ClusterNode::submit`'s contract).
//! - Paging copies (queue ids with [`PAGING_BIT`]) are not replicated:
//!   they never outlive the process that wrote them, so they go to the
//!   local store only.
//! - Writes in flight are bounded by admission ([`Journal::poll_room`]),
//!   never by blocking a caller.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use berth_broker::durable::{Done, Journal, JournalError, MessageParts, PAGING_BIT};
use berth_cluster::{ClusterNode, ProposeError};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::command::Command;
use crate::limits::CLUSTER_WRITES_IN_FLIGHT_MAX;
use crate::store_journal::{blocking, StoreJournal};

struct Pending {
    command: Vec<u8>,
    done: Option<Done>,
}

/// Room for more writes: a count and the tasks waiting for it to drop.
#[derive(Default)]
struct Room {
    in_flight: AtomicUsize,
    waiting: Mutex<Vec<Waker>>,
}

impl Room {
    fn released(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) <= CLUSTER_WRITES_IN_FLIGHT_MAX {
            for w in self.waiting.lock().drain(..) {
                w.wake();
            }
        }
    }

    fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) < CLUSTER_WRITES_IN_FLIGHT_MAX
    }
}

pub struct ReplicatedJournal {
    node: Arc<ClusterNode>,
    local: Arc<StoreJournal>,
    forward: mpsc::UnboundedSender<Pending>,
    room: Arc<Room>,
}

impl ReplicatedJournal {
    /// A journal over `node` whose reads come from `local`; starts the
    /// forwarding task on `raft` (Raft's runtime, so that broker workers
    /// blocked on a lock never stall it).
    pub fn start(
        node: Arc<ClusterNode>,
        local: Arc<StoreJournal>,
        raft: &tokio::runtime::Handle,
    ) -> Self {
        let (forward, mut queue) = mpsc::unbounded_channel::<Pending>();
        let room = Arc::new(Room::default());
        let released = Arc::clone(&room);
        let forwarding = Arc::clone(&node);
        raft.spawn(async move {
            let node = forwarding;
            while let Some(p) = queue.recv().await {
                let room = Arc::clone(&released);
                let done = p.done;
                node.submit(
                    p.command,
                    Box::new(move |r| {
                        room.released();
                        if let Some(done) = done {
                            done(r.map(|_| ()).map_err(not_committed));
                        }
                    }),
                )
                .await;
            }
        });
        Self {
            node,
            local,
            forward,
            room,
        }
    }

    fn send(&self, cmd: &Command, done: Option<Done>) {
        self.room.in_flight.fetch_add(1, Ordering::AcqRel);
        let pending = Pending {
            command: cmd.encode(),
            done,
        };
        if let Err(refused) = self.forward.send(pending) {
            self.room.released();
            if let Some(done) = refused.0.done {
                done(Err(JournalError::new(
                    "the cluster's forwarding task has stopped",
                )));
            }
        }
    }

    fn send_and_wait(&self, cmd: &Command) -> Result<(), JournalError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.send(
            cmd,
            Some(Box::new(move |r| {
                let _ = tx.send(r); // the waiter is below; it only goes at shutdown
            })),
        );
        blocking(|| {
            rx.recv()
                .unwrap_or_else(|_| Err(JournalError::new("the cluster stopped")))
        })
    }
}

fn not_committed(e: ProposeError) -> JournalError {
    JournalError::caused_by("not committed on a majority of the cluster", e)
}

fn paging(queue: u64) -> bool {
    queue & PAGING_BIT != 0
}

impl Journal for ReplicatedJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        if queues.iter().all(|q| paging(*q)) {
            return self.local.publish(msg, queues, payload, done);
        }
        let cmd = Command::Publish {
            msg,
            queues: queues.to_vec(),
            payload,
        };
        self.send(&cmd, done);
    }

    fn publish_message(
        &self,
        msg: u64,
        queues: &[u64],
        payload: MessageParts<'_>,
        done: Option<Done>,
    ) {
        // A paging copy stays local, where the store takes it in parts; a
        // replicated publish is one command, so its payload is joined.
        if queues.iter().all(|q| paging(*q)) {
            return self.local.publish_message(msg, queues, payload, done);
        }
        self.publish(msg, queues, payload.to_bytes(), done);
    }

    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        if paging(queue) {
            return self.local.remove(queue, msgs, done);
        }
        let cmd = Command::Remove {
            queue,
            msgs: msgs.to_vec(),
        };
        self.send(&cmd, done);
    }

    fn purge(&self, queue: u64, done: Option<Done>) {
        if paging(queue) {
            return self.local.purge(queue, done);
        }
        self.send(&Command::Purge { queue }, done);
    }

    // Placement follows this node's store. A replica with another
    // `store.groups` puts the queue in another of its own groups, which
    // only changes how its writes spread, never what they hold.
    fn groups(&self) -> u32 {
        self.local.groups()
    }

    fn group_of(&self, queue: u64) -> u32 {
        self.local.group_of(queue)
    }

    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.send_and_wait(&Command::PutMeta {
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
        })
    }

    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.send_and_wait(&Command::DeleteMeta {
            key: Bytes::copy_from_slice(key),
        })
    }

    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        let cmd = Command::Append {
            queue,
            offset,
            payload,
        };
        self.send(&cmd, done);
    }

    fn stream_trim(&self, queue: u64, below: u64, done: Option<Done>) {
        self.send(&Command::Trim { queue, below }, done);
    }

    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        self.local.stream_read(queue, from, count_max, bytes_max)
    }

    fn stream_readable_end(&self, queue: u64) -> Option<u64> {
        // A completion is the commit; this member's store writes the
        // record only when it applies the entry.
        Some(
            self.local
                .store
                .stream_bounds(berth_store::QueueId(queue))
                .map_or(0, |(_, end)| end),
        )
    }

    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.local.read(queue, msg)
    }

    fn read_many(&self, queue: u64, msgs: &[u64]) -> Vec<Result<Bytes, JournalError>> {
        self.local.read_many(queue, msgs)
    }

    fn read_heads(&self, queue: u64, msgs: &[u64], len: usize) -> Vec<Result<Bytes, JournalError>> {
        // The store's own: the default would read whole bodies (every
        // pending delayed message's, at a new leader's start).
        self.local.read_heads(queue, msgs, len)
    }

    fn pages(&self) -> bool {
        self.local.pages()
    }

    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        self.local.written(queue, msgs)
    }

    fn copies(&self) -> u32 {
        u32::try_from(self.node.voters().len()).unwrap_or(u32::MAX)
    }

    fn has_room(&self) -> bool {
        self.room.has_room() && self.local.has_room()
    }

    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.room.has_room() {
            self.room.waiting.lock().push(cx.waker().clone());
            // Released between the check and the push: look again.
            if !self.room.has_room() {
                return Poll::Pending;
            }
        }
        self.local.poll_room(cx)
    }
}
