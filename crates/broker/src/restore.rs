//! Restore after a restart: the broker's exchanges, queues, bindings and
//! messages rebuilt from what the journal gave back — the stored metadata
//! commands replayed through [`Broker::apply`], and each queue's messages
//! put back into it.
//!
//! Invariants:
//! - Exchanges are restored before queues, and queues before bindings: each
//!   needs the former (see [`MetaCommand::replay_rank`]).
//! - Nothing the journal gave back is dropped silently: an entry that
//!   cannot be used stays in the journal and is reported.
//! - Messages are orphaned (for the caller to purge) only when no stored
//!   queue definition claims their queue id: none names it, and every
//!   stored queue definition could be read. Otherwise they are kept and
//!   reported, as the queue they belong to may come back.
//! - Restored messages are flagged redelivered (they may have been
//!   delivered before the crash).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use berth_protocol::codec::decode_field_table;
use parking_lot::Mutex;

use crate::broker::Broker;
use crate::durable::{
    decode_retry_mark, due_of, retry_id, retry_id_of, times_of, JournalError, RetryMark, DUE_BYTES,
};
use crate::limits::{RESTORE_PAGED_RUN_MESSAGES, RESTORE_READ_BATCH_MESSAGES, RESTORE_THREADS_MAX};
use crate::message::Message;
use crate::meta::{key_kind, queue_id_of, ExchangeDef, MetaCommand};
use crate::queue::{Queue, StoredEntry};

/// A queue, its stored messages and its retry marks (mark id, mark), to be
/// put back.
type QueueJob = (Arc<Queue>, u64, Held, Vec<(u64, RetryMark)>);

/// One queue's (or delayed exchange's) stored messages, in id order.
enum Held {
    Stored(Vec<(u64, StoredBody)>),
    /// Every body still on disk: (id, payload bytes).
    Paged(Vec<(u64, u32)>),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Held::Stored(v) => v.len(),
            Held::Paged(v) => v.len(),
        }
    }

    fn into_stored(self) -> Vec<(u64, StoredBody)> {
        match self {
            Held::Stored(v) => v,
            Held::Paged(v) => v
                .into_iter()
                .map(|(id, len)| (id, StoredBody::OnDisk { len }))
                .collect(),
        }
    }
}

/// What a journal gave back after a restart.
#[derive(Default)]
pub struct Recovered {
    /// Stored definitions (key, value).
    pub meta: Vec<(Vec<u8>, Vec<u8>)>,
    /// Per durable queue id, its messages (journal id, body) in order.
    pub messages: HashMap<u64, Vec<(u64, StoredBody)>>,
    /// Per durable queue id, messages whose bodies are all still on disk:
    /// (journal id, payload bytes) in order. What a store gives back after
    /// a restart: 16 bytes a message, where `messages` takes 40.
    pub paged: HashMap<u64, Vec<(u64, u32)>>,
    /// Per stream's queue id, what the journal holds of it
    /// (`Journal::stream_append`).
    pub streams: HashMap<u64, crate::durable::StoredStream>,
}

/// A recovered message as the journal gives it back.
pub enum StoredBody {
    /// The stored payload, already read.
    Payload(bytes::Bytes),
    /// Still only on disk, `len` bytes: read back (with
    /// [`Journal::read`]) when it is delivered.
    OnDisk { len: u32 },
}

impl Recovered {
    /// (next message id, next queue id): one past the largest recovered.
    pub fn next_ids(&self) -> (u64, u64) {
        let stored = self.messages.values().flatten().map(|(m, _)| *m);
        // Paged lists are in id order: the last id is the largest.
        let paged = self
            .paged
            .values()
            .filter_map(|v| v.last())
            .map(|(m, _)| *m);
        let msg = stored.chain(paged).max().unwrap_or(0) + 1;
        let queue = self
            .meta
            .iter()
            .filter(|(k, _)| matches!(key_kind(k), Some(b'q' | b'x')))
            .filter_map(|(_, v)| queue_id_of(v))
            .max()
            .unwrap_or(0)
            + 1;
        // A retry id is a queue's, with a bit set: not a queue id itself.
        let stored = (self.messages.keys())
            .chain(self.paged.keys())
            .chain(self.streams.keys())
            .filter(|q| retry_id_of(**q).is_none())
            .max();
        (msg, queue.max(stored.map_or(1, |m| m + 1)))
    }
}

/// What [`Broker::restore`] rebuilt.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
    pub messages: usize,
    /// Messages pending in delayed exchanges.
    pub delayed_messages: usize,
    /// Entries that could not be restored, and why.
    pub skipped: Vec<String>,
    /// Queue ids with stored messages but no definition (the queue was
    /// deleted and the crash came before its purge was durable, or a
    /// publish raced the deletion), in id order: the caller purges them.
    pub orphaned_queues: Vec<u64>,
    /// Messages stored for the orphaned queues.
    pub orphaned_messages: usize,
}

/// Which queue ids the stored queue definitions name, read from their raw
/// values (so a definition that does not decode or apply still claims its
/// messages).
struct QueueClaims {
    ids: HashSet<u64>,
    /// A stored queue definition whose id cannot be read: any queue's
    /// messages may be its.
    unreadable: bool,
}

impl QueueClaims {
    fn of(meta: &[(Vec<u8>, Vec<u8>)]) -> Self {
        let mut claims = QueueClaims {
            ids: HashSet::new(),
            unreadable: false,
        };
        for (k, v) in meta {
            match (key_kind(k), queue_id_of(v)) {
                (Some(b'q' | b'x'), Some(id)) => {
                    claims.ids.insert(id);
                }
                (Some(b'q'), None) => claims.unreadable = true,
                // A delayed exchange's value says it is one: one that does
                // not decode may be one.
                (Some(b'x'), None) if decode_field_table(v).is_none() => {
                    claims.unreadable = true;
                }
                _ => {}
            }
        }
        claims
    }

    /// Whether messages stored for `queue` belong to no queue at all.
    fn orphans(&self, queue: u64) -> bool {
        !self.unreadable && !self.ids.contains(&queue)
    }
}

impl Broker {
    /// Rebuilds durable exchanges, queues, bindings and their messages from
    /// what the journal gave back. Entries that cannot be used are kept in
    /// the journal and reported, never silently dropped.
    pub fn restore(&self, recovered: Recovered, now: Instant) -> RestoreReport {
        let mut messages = recovered.messages;
        let mut paged = recovered.paged;
        // A queue given both ways gets one list, in id order.
        let both: Vec<u64> = paged
            .keys()
            .filter(|q| messages.contains_key(q))
            .copied()
            .collect();
        for q in both {
            let p = paged.remove(&q).expect("listed above");
            let m = messages.get_mut(&q).expect("listed above");
            m.extend(Held::Paged(p).into_stored());
            m.sort_by_key(|(id, _)| *id);
        }
        let mut take = |id: u64| match paged.remove(&id) {
            Some(p) => Held::Paged(p),
            None => Held::Stored(messages.remove(&id).unwrap_or_default()),
        };
        let mut streams = recovered.streams;
        let claims = QueueClaims::of(&recovered.meta);
        let (cmds, skipped) = crate::broker::decode_stored(&recovered.meta, b"xqb");
        let mut report = RestoreReport {
            skipped,
            ..RestoreReport::default()
        };
        // Queues' messages go back after every definition, several
        // queues at once (a restart of millions is otherwise one core's).
        let mut queued: Vec<QueueJob> = Vec::new();
        for (parts, cmd) in &cmds {
            if let Err(why) = self.apply(cmd, now) {
                report.skipped.push(format!("{parts:?}: {why}"));
                continue;
            }
            match cmd {
                MetaCommand::PutExchange(x) => {
                    report.exchanges += 1;
                    if let Some(id) = x.delayed_id {
                        self.restore_delayed(x, id, take(id), &mut report);
                    }
                }
                MetaCommand::PutBinding(_) => report.bindings += 1,
                MetaCommand::PutQueue(d) => {
                    report.queues += 1;
                    let held = take(d.id);
                    let v = self.vhost(&d.vhost).expect("applied in this vhost");
                    let q = v.find_queue(&d.name).expect("just applied");
                    if q.is_stream() {
                        let appended = streams.remove(&d.id);
                        self.restore_stream(&q, appended.as_ref(), held.into_stored(), &mut report);
                    } else {
                        let marks = self.read_retry_marks(&q, take(retry_id(d.id)), &mut report);
                        queued.push((q, d.id, held, marks));
                    }
                }
                _ => {}
            }
        }
        self.restore_queues(queued, now, &mut report);
        let mut left: Vec<(u64, usize)> = (messages.into_iter())
            .map(|(qid, msgs)| (qid, msgs.len()))
            .chain(paged.into_iter().map(|(qid, msgs)| (qid, msgs.len())))
            .filter(|(_, n)| *n > 0)
            .chain(
                streams
                    .into_iter()
                    .map(|(qid, s)| (qid, usize::try_from(s.messages).unwrap_or(usize::MAX))),
            )
            .collect();
        left.sort_unstable();
        for (qid, count) in left {
            if claims.orphans(retry_id_of(qid).unwrap_or(qid)) {
                report.orphaned_queues.push(qid);
                report.orphaned_messages += count;
            } else {
                report
                    .skipped
                    .push(format!("{count} messages of unknown queue id {qid}"));
            }
        }
        report
    }

    /// Puts a delayed exchange's stored messages back in it: each one's due
    /// time is read from the first 8 bytes of its record's payload, not
    /// its body (time and memory in proportion to the messages pending,
    /// not to their bytes or to history); bodies stay on disk.
    fn restore_delayed(&self, x: &ExchangeDef, id: u64, stored: Held, report: &mut RestoreReport) {
        let v = self.vhost(&x.vhost).expect("applied in this vhost");
        let ex = v.exchange(&x.name).expect("just applied");
        let mut held = Vec::with_capacity(stored.len());
        let mut put = |mid: u64, head: Result<bytes::Bytes, JournalError>| match head
            .map_err(|e| e.to_string())
            .and_then(|p| due_of(&p).ok_or_else(|| "no due time".to_owned()))
        {
            Ok(due) => held.push((due, mid)),
            Err(why) => report.skipped.push(format!(
                "delayed message {mid} of exchange '{}': {why}",
                x.name
            )),
        };
        match stored {
            // After a restart: ids and sizes only, never converted to a
            // list of bodies (40 bytes a message, at its peak).
            Held::Paged(list) => {
                for chunk in list.chunks(RESTORE_READ_BATCH_MESSAGES) {
                    let ids: Vec<u64> = chunk.iter().map(|(m, _)| *m).collect();
                    let heads = self.journal().read_heads(id, &ids, DUE_BYTES);
                    for (mid, head) in ids.into_iter().zip(heads) {
                        put(mid, head);
                    }
                }
            }
            Held::Stored(list) => {
                for chunk in list.chunks(RESTORE_READ_BATCH_MESSAGES) {
                    let on_disk: Vec<u64> = (chunk.iter())
                        .filter(|(_, b)| matches!(b, StoredBody::OnDisk { .. }))
                        .map(|(m, _)| *m)
                        .collect();
                    let heads = self.journal().read_heads(id, &on_disk, DUE_BYTES);
                    let mut read = heads.into_iter();
                    for (mid, body) in chunk {
                        let head = match body {
                            StoredBody::Payload(p) => Ok(p.clone()),
                            StoredBody::OnDisk { .. } => {
                                read.next().expect("one result per message")
                            }
                        };
                        put(*mid, head);
                    }
                }
            }
        }
        report.delayed_messages += held.len();
        v.restore_delayed(&ex, held);
    }

    /// Rebuilds a stream from what the journal holds of it: its appends
    /// (`appended`), and any messages stored one publish each by an
    /// earlier berth (`stored`), which move to appends.
    fn restore_stream(
        &self,
        q: &Arc<Queue>,
        appended: Option<&crate::durable::StoredStream>,
        stored: Vec<(u64, StoredBody)>,
        report: &mut RestoreReport,
    ) {
        {
            let entries = stored
                .into_iter()
                .map(|(id, body)| match body {
                    StoredBody::Payload(p) => StoredEntry {
                        id,
                        len: p.len() as u64,
                        payload: Some(p),
                    },
                    StoredBody::OnDisk { len } => StoredEntry {
                        id,
                        len: u64::from(len),
                        payload: None,
                    },
                })
                .collect();
            let (n, skipped) = q.restore_stream(appended, entries);
            // Restore filled the stream's log without a queue operation.
            q.report_totals();
            report.messages += n;
            report.skipped.extend(skipped);
        }
    }

    /// Puts each job's messages back in its queue, on up to
    /// [`RESTORE_THREADS_MAX`] threads (one per core), largest queues
    /// first; what each reports is added in the jobs' order.
    fn restore_queues(&self, mut jobs: Vec<QueueJob>, now: Instant, report: &mut RestoreReport) {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(RESTORE_THREADS_MAX)
            .min(jobs.len());
        if threads <= 1 {
            for (q, id, held, marks) in jobs {
                self.restore_messages(&q, id, held, marks, now, report);
            }
            return;
        }
        jobs.sort_by_key(|(_, _, held, _)| std::cmp::Reverse(held.len()));
        let slots: Vec<Mutex<Option<QueueJob>>> =
            jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
        let done: Vec<Mutex<RestoreReport>> = slots.iter().map(|_| Mutex::default()).collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slot) = slots.get(i) else { break };
                    let (q, id, held, marks) = slot.lock().take().expect("each job taken once");
                    self.restore_messages(&q, id, held, marks, now, &mut done[i].lock());
                });
            }
        });
        for r in done {
            let r = r.into_inner();
            report.messages += r.messages;
            report.skipped.extend(r.skipped);
        }
    }

    /// A queue's retry marks, read back (20 bytes each); one that does not
    /// decode is reported and left in the journal.
    fn read_retry_marks(
        &self,
        q: &Queue,
        held: Held,
        report: &mut RestoreReport,
    ) -> Vec<(u64, RetryMark)> {
        let Some(qid) = q.store_id else {
            return Vec::new();
        };
        let stored = held.into_stored();
        let mut marks = Vec::with_capacity(stored.len());
        for chunk in stored.chunks(RESTORE_READ_BATCH_MESSAGES) {
            let ids: Vec<u64> = chunk.iter().map(|(m, _)| *m).collect();
            let mut read = self.journal().read_many(retry_id(qid), &ids).into_iter();
            for (mark_id, body) in chunk {
                let payload = match body {
                    StoredBody::Payload(p) => {
                        read.next();
                        Ok(p.clone())
                    }
                    StoredBody::OnDisk { .. } => read.next().expect("one result per message"),
                };
                match payload
                    .map_err(|e| e.to_string())
                    .and_then(|p| decode_retry_mark(&p).ok_or_else(|| format!("{} bytes", p.len())))
                {
                    Ok(m) => marks.push((*mark_id, m)),
                    Err(why) => report
                        .skipped
                        .push(format!("retry mark {mark_id} of queue '{}': {why}", q.name)),
                }
            }
        }
        marks
    }

    /// Puts a restored queue's messages back in it, in order, then gives
    /// the marked ones their count of returns and the rest of their wait;
    /// marks that name no message of it are removed.
    fn restore_messages(
        &self,
        q: &Arc<Queue>,
        id: u64,
        held: Held,
        marks: Vec<(u64, RetryMark)>,
        now: Instant,
        report: &mut RestoreReport,
    ) {
        self.restore_entries(q, id, held, now, report);
        let stale = q.restore_retries(marks, now);
        if !stale.is_empty() {
            self.journal().remove(retry_id(id), &stale, None);
        }
    }

    /// Puts a restored queue's messages back in it, in order.
    fn restore_entries(
        &self,
        q: &Arc<Queue>,
        id: u64,
        held: Held,
        now: Instant,
        report: &mut RestoreReport,
    ) {
        let stored = match held {
            // The common case after a restart: a list of ids and sizes,
            // put back as it is.
            Held::Paged(list) if q.declared_args.max_priority.is_none() => {
                for run in list.chunks(RESTORE_PAGED_RUN_MESSAGES) {
                    q.restore_paged_many(run, 0, now);
                    report.messages += run.len();
                }
                return;
            }
            held => held.into_stored(),
        };
        // Runs of bodies still on disk go back under one lock each.
        let mut paged: Vec<(u64, u32)> = Vec::new();
        let flush = |paged: &mut Vec<(u64, u32)>, report: &mut RestoreReport| {
            q.restore_paged_many(paged, 0, now);
            report.messages += paged.len();
            paged.clear();
        };
        for (mid, body) in stored {
            // A priority queue needs each message's priority now; other
            // queues read bodies on delivery.
            let body = match body {
                StoredBody::OnDisk { len } if q.declared_args.max_priority.is_none() => {
                    paged.push((mid, len));
                    if paged.len() >= RESTORE_PAGED_RUN_MESSAGES {
                        flush(&mut paged, report);
                    }
                    continue;
                }
                StoredBody::OnDisk { .. } => self.journal().read(id, mid),
                StoredBody::Payload(p) => Ok(p),
            };
            // In order: the paged ones before this one go in first.
            if !paged.is_empty() {
                flush(&mut paged, report);
            }
            match body
                .map_err(|e| e.to_string())
                .and_then(|p| Ok((Message::from_stored(&p)?, times_of(&p))))
            {
                Ok((m, times)) => {
                    q.restore(m, mid, times, now);
                    report.messages += 1;
                }
                Err(why) => report
                    .skipped
                    .push(format!("message {mid} of queue '{}': {why}", q.name)),
            }
        }
        flush(&mut paged, report);
    }
}
