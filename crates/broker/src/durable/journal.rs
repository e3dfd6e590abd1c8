//! The journal seam: what the broker asks of "a set of log groups that
//! make records durable and say when". The server's store
//! (`crates/server/src/journal.rs` over `berth-store`) is one
//! implementation; a replicated log is meant to be the next. The contract
//! below is what the broker relies on; an implementation that cannot keep
//! it must not implement this trait.

use std::task::{Context, Poll};

use bytes::Bytes;

use super::{complete, Done, JournalError, MessageParts};
use crate::meta::MetaCommand;

/// Durable storage as the broker needs it.
///
/// # Log groups and positions
///
/// Every write lands in one *log group*: a message's records in the group
/// of its queue (a publish to queues of several groups is one write per
/// group), a metadata record in the group of its key. Within a group each
/// write takes the next *position* of that group, in the order of the
/// calls that reach it (calls from one thread keep their order; calls from
/// several threads are ordered as the group receives them). Positions are
/// strictly increasing and never reused; replay after a restart (or on a
/// replica) applies a group's records in position order, so a later write
/// to the same key or message wins. Groups are independent: nothing orders
/// a write of one group against a write of another, which is why a removal
/// that must follow a write of another group waits for that write's
/// completion first (see [`super::Durability::defer_removal`]).
///
/// # What "durable" means
///
/// A completion runs with `Ok(())` only when its write, *and every earlier
/// position of its group*, will be found by replay after a crash — under
/// the operator's `store.sync` mode (docs/DURABILITY.md: with `always`,
/// after an fdatasync covering it; a replicated journal: once a majority
/// holds it durably). So completions of one group run in position order,
/// and a completion is never reported before the write it stands for.
///
/// # Failure
///
/// A write that cannot be made durable completes with `Err`, the cause
/// kept. A group that failed a sync (or a write for another reason than
/// a full disk) refuses every later write (each completes with `Err`), so
/// nothing after a lost write is reported durable. A write that found the
/// disk full is taken back whole — it keeps no position, later writes take
/// the positions it had — and the group refuses writes until space
/// returns, then takes them again. What was pending is failed, never
/// silently dropped. The
/// broker turns an `Err` into a publisher nack, a channel error or a
/// refused `-ok`; a message whose removal failed stays (and is redelivered
/// after a restart).
///
/// # Threads and blocking
///
/// `publish`, `remove` and `purge` never block: they hand the write to
/// the group's queue and return at once, however long that queue is;
/// `done` runs later on the group's completion thread (the store's group
/// writer), or at once on the caller's thread when the write is refused
/// up front.
///
/// # Back-pressure
///
/// A group's queue is bounded by admission, not by blocking the sender:
/// [`Journal::poll_room`] is `Pending` while some group's queue is at its
/// bound, and wakes the caller's task once it is below. A caller that
/// makes writes on behalf of a peer (the server's connection reading
/// frames) awaits it before it takes on more work, so a full queue stops
/// that peer being read and never holds a thread; writes made anyway
/// (one frame's worth per caller, a timer's expiries, an HTTP request)
/// are accepted, so the bound is exceeded by at most that. A completion must be short and must
/// not call back into the journal (it would wait on the thread running
/// it). `put_meta`, `delete_meta`, `read` and `read_many` block the
/// calling thread until the write is durable (or the bytes are read): the
/// broker calls them off the publish path, and the server runs them so a
/// tokio worker hands its other tasks on meanwhile.
pub trait Journal: Send + Sync {
    /// Stores a persistent message for these durable queues.
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>);
    /// [`Journal::publish`] of a message given in the parts of its payload
    /// (head, properties, body: [`MessageParts`]). A journal that can
    /// write them one after another need not join them first — a copy of
    /// every body, per message, on the publisher's thread. This one joins
    /// them.
    fn publish_message(
        &self,
        msg: u64,
        queues: &[u64],
        payload: MessageParts<'_>,
        done: Option<Done>,
    ) {
        self.publish(msg, queues, payload.to_bytes(), done);
    }
    /// These messages left the queue for good (ack, drop, expiry, dead-letter).
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>);
    /// Every message of the queue left it (purge, delete).
    fn purge(&self, queue: u64, done: Option<Done>);
    /// Stores a definition; returns once it is durable.
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError>;
    /// Removes a definition; returns once that is durable.
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError>;
    /// Appends a stream's message at `offset` of stream `queue`: one write
    /// in the queue's group, which the journal keeps no per-message entry
    /// for (it finds offsets through a sparse index). A stream's offsets
    /// are given in increasing order. `done` as for [`Journal::publish`].
    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        let _ = (queue, offset, payload);
        complete(
            done,
            Err(JournalError::new("this journal keeps no streams")),
        );
    }
    /// Removes stream `queue`'s messages below `below` (retention).
    fn stream_trim(&self, queue: u64, below: u64, done: Option<Done>) {
        let _ = (queue, below);
        complete(done, Ok(()));
    }
    /// Reads stream `queue` from offset `from` (the first message at or
    /// after it): at most `count_max` messages, stopping once `bytes_max`
    /// bytes are read; `(offset, payload)` in offset order. Only written
    /// messages (their completion ran) are sure to be found.
    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        let _ = (queue, from, count_max, bytes_max);
        Err(JournalError::new("this journal keeps no streams"))
    }
    /// The offset after the newest record of stream `queue` that
    /// [`Journal::stream_read`] finds now, for a journal whose completions
    /// can run before its own copy is readable (a cluster's: a completion
    /// is the commit on a majority, and this member's store writes the
    /// record when it applies the entry). `None`: every completed append
    /// is readable, as on one node.
    fn stream_readable_end(&self, queue: u64) -> Option<u64> {
        let _ = queue;
        None
    }
    /// Reads a stored message of a queue back (the payload given to
    /// `publish`). Valid once [`Journal::written`] says so.
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        let _ = (queue, msg);
        Err(JournalError::new("this journal keeps no messages"))
    }
    /// [`Journal::read`] for several messages of a queue at once (the
    /// journal may read neighbouring records together): one result per
    /// message, in order.
    fn read_many(&self, queue: u64, msgs: &[u64]) -> Vec<Result<Bytes, JournalError>> {
        msgs.iter().map(|m| self.read(queue, *m)).collect()
    }
    /// The first `len` bytes of each stored message's payload (all of it
    /// when shorter), for what a payload says up front without its body (a
    /// delayed message's due time at restart): one result per message, in
    /// order. A journal that cannot read less reads whole payloads.
    fn read_heads(&self, queue: u64, msgs: &[u64], len: usize) -> Vec<Result<Bytes, JournalError>> {
        (self.read_many(queue, msgs).into_iter())
            .map(|r| r.map(|p| p.slice(..len.min(p.len()))))
            .collect()
    }
    /// Can messages be written for paging and read back? (A journal that
    /// keeps nothing says no, and queues keep every body in memory.)
    fn pages(&self) -> bool {
        false
    }
    /// For each message: is it written, so that [`Journal::read`] finds it
    /// and its body need not stay in memory? A journal that cannot read
    /// messages back says no.
    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        let _ = queue;
        vec![false; msgs.len()]
    }
    /// How many log groups this journal has (a journal with one, or none,
    /// says 1). Durable queues are spread over them (see
    /// [`super::Placement`]).
    fn groups(&self) -> u32 {
        1
    }
    /// The log group (below [`Journal::groups`]) whose writes hold
    /// `queue`'s records: a fixed function of the id, so the same queue id
    /// lands in the same group after every restart and on every replica.
    fn group_of(&self, queue: u64) -> u32 {
        let _ = queue;
        0
    }
    /// On how many members' disks a completed write is kept (1 on one
    /// node; a cluster's voting members). Every quorum queue is on all of
    /// them (`quorum_args.rs`).
    fn copies(&self) -> u32 {
        1
    }
    /// Whether every group's queue of writes is below its bound now.
    fn has_room(&self) -> bool {
        true
    }
    /// `Ready` once every group's queue of writes is below its bound;
    /// else `Pending`, and `cx`'s waker is woken when it is (see
    /// "Back-pressure" above).
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let _ = cx;
        Poll::Ready(())
    }
}

impl dyn Journal + '_ {
    /// Makes one metadata change durable: the command's key and value, as
    /// [`MetaCommand::encode`] writes them (the one encoder). Returns once
    /// it is durable, or with the reason it is not (the caller then leaves
    /// its state unchanged and answers with an error, never an `-ok`).
    pub fn record(&self, cmd: &MetaCommand) -> Result<(), JournalError> {
        let (key, value) = cmd.encode();
        match value {
            Some(v) => self.put_meta(&key, &v),
            None => self.delete_meta(&key),
        }
    }
}

/// Where lifecycle events go (`event_log.enabled`): the sink frames,
/// stamps (time, per-group sequence) and writes the broker's encoded
/// events (see [`crate::events`]). `key` chooses the group.
pub trait EventSink: Send + Sync {
    fn append(&self, key: u64, payload: &[u8]);
}
