//! A queue that is a stream (`x-queue-type: stream`): appends under the
//! queue's lock, one reader position per consumer, deliveries read from
//! the resident tail or back from the journal, acks that return credit
//! and remove nothing, retention of whole segments (docs/STREAMS.md).
//!
//! Invariants:
//! - An append takes its offset, its journal id and its journal write
//!   under the queue's lock (`Journal::publish` never blocks, and its
//!   completion is the publisher's confirm, which takes no queue lock), so
//!   the group receives a stream's writes in offset order and a crash can
//!   only lose a suffix of unconfirmed ones: every confirmed message keeps
//!   its offset (restore reads the offsets back, `restore_stream`).
//! - A consumer's deliveries carry strictly increasing offsets: its reader
//!   only moves forward (retention moves it to the new first offset).
//! - Consumers get only committed messages (their write durable, as
//!   RabbitMQ's readers stop at the committed offset): an offset a
//!   consumer saw is never given to another message after a crash. The
//!   completion of a write advances `committed` (completions of a group
//!   run in position order, which is offset order) and, if a reader waits
//!   for it, asks the timer service to wake the stream at once
//!   (`Timers::wake_now`: the completion runs on the store's writer
//!   thread and must not deliver itself).
//! - Nothing is ever removed by a consumer; retention journals the removal
//!   of whole segments (collected under the lock, journaled after it).
//! - A lagging reader reads from the journal in chunks (at most
//!   `STREAM_READ_AHEAD_MESSAGES` and about `STREAM_READ_AHEAD_BYTES`)
//!   that the stream keeps for its other readers (`stream/chunks.rs`), so
//!   each stored message is read and decoded about once however many
//!   readers pass it; memory does not grow with how far behind readers
//!   are, only with how many there are (one chunk each, plus at most
//!   `STREAM_READ_CHUNKS_BYTES_MAX` kept).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::effects::Effects;
use super::{Consumer, Queue, QueueState};
use crate::durable::{encode_message, Done, JournalError};
use crate::events::Origin;
use crate::limits::{
    STREAM_READ_AHEAD_BYTES, STREAM_READ_AHEAD_MESSAGES, STREAM_RESTORE_GAP_OFFSETS_MAX,
    STREAM_RETENTION_CHECK_MS, STREAM_SEGMENT_BYTES_DEFAULT, STREAM_TAIL_MESSAGES_MAX,
};
use crate::message::Message;
use crate::ready::QueuedMessage;
use crate::stream::chunks::{Chunk, ReadChunks};
use crate::stream::entry;
use crate::stream::log::{Resident, StreamLog, StreamStats};
use crate::stream::offset::OffsetSpec;
use crate::stream::retention::{head_segments_to_drop, Limits};

/// The header every delivery from a stream carries.
pub const OFFSET_HEADER: &str = "x-stream-offset";

impl StreamState {
    pub(super) fn stats(&self) -> StreamStats {
        self.log.stats()
    }
}

/// A stream message the journal gave back after a restart.
pub struct StoredEntry {
    /// Its journal message id.
    pub id: u64,
    /// Its stored bytes if already read (else read back when needed).
    pub payload: Option<Bytes>,
    /// Its stored length in bytes.
    pub len: u64,
}

/// A consumer and the next offset it gets.
struct Reader {
    consumer: Arc<Consumer>,
    next: u64,
    /// The read-back chunk it is reading (usually holds `next`).
    chunk: Option<Arc<Chunk>>,
}

/// A stream's state, under its queue's lock.
#[derive(Default)]
pub(super) struct StreamState {
    log: StreamLog,
    readers: Vec<Reader>,
    /// Chunks read back from the journal, for every reader that passes.
    chunks: ReadChunks,
    /// Shared with the completions of the stream's writes.
    commit: Arc<Commit>,
}

/// What the completions of a stream's writes tell it.
#[derive(Default)]
struct Commit {
    /// Offsets below this are durable.
    end: AtomicU64,
    /// A write failed (its message will never be readable back).
    failed: AtomicBool,
    /// A reader stopped at `end`: the next completion wakes the stream.
    waiting: AtomicBool,
}

impl Queue {
    /// Is this queue a stream?
    pub fn is_stream(&self) -> bool {
        self.declared_args.queue_type == crate::args::QueueType::Stream
    }

    /// Offsets, size and segments of a stream (`None` for other queues).
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.state.lock().stream.as_ref().map(|st| StreamStats {
            committed_next: st.commit.end.load(Ordering::Acquire).min(st.log.end()),
            ..st.log.stats()
        })
    }

    fn unix_ms(&self) -> u64 {
        self.env.clock.unix_time_us() / 1000
    }

    fn segment_bytes_max(&self) -> u64 {
        self.args()
            .stream_max_segment_size_bytes
            .unwrap_or(STREAM_SEGMENT_BYTES_DEFAULT)
    }

    /// Appends a published message to the stream; `done` runs once it is
    /// durable. Returns false if it could not be stored (`done` got the
    /// error).
    pub fn stream_append(
        self: &Arc<Self>,
        msg: &Arc<Message>,
        now: Instant,
        done: Option<Done>,
        _origin: &Origin,
    ) -> bool {
        self.counters.add_published();
        let unix_ms = self.unix_ms();
        let segment_max = self.segment_bytes_max();
        self.with_state(now, |q, s, fx| {
            let (Some(st), Some(qid), false) = (s.stream.as_mut(), q.store_id, s.deleted) else {
                if let Some(d) = done {
                    d(Ok(()));
                }
                return true;
            };
            let offset = st.log.end();
            let tagged = msg.rewritten(msg.exchange.clone(), msg.routing_key.clone(), |p| {
                let mut h = p.headers().clone().unwrap_or_default();
                h.insert(
                    OFFSET_HEADER.into(),
                    berth_protocol::AMQPValue::LongLongInt(
                        i64::try_from(offset).unwrap_or(i64::MAX),
                    ),
                );
                *p = p.clone().with_headers(h);
            });
            let stored = tagged.map_err(|e| e.reply_text()).and_then(|m| {
                encode_message(&m.exchange, &m.routing_key, &m.properties, &m.body)
                    .map(|p| (m, p))
                    .map_err(|e| e.to_string())
            });
            let (tagged, payload) = match stored {
                Ok(x) => x,
                Err(why) => {
                    if let Some(d) = done {
                        d(Err(JournalError::new(why)));
                    }
                    return false;
                }
            };
            let ts = st.log.next_timestamp(unix_ms);
            let record = entry::encode(offset, ts, &payload);
            let id = q.env.dur.new_message_id();
            let bytes = record.len() as u64;
            let done = q.commit_done(&st.commit, offset, done);
            q.env.dur.journal().publish(id, &[qid], record, Some(done));
            let segments_before = st.log.stats().segments;
            st.log.append(id, bytes, ts, Some(tagged), segment_max);
            if st.log.stats().segments != segments_before {
                q.stream_retention(s, unix_ms, fx);
            }
            q.release_written_tail(s);
            q.stream_dispatch(s, now, fx);
            true
        })
    }

    /// The completion of the write of `offset`: marks it committed,
    /// wakes the stream if a reader waits for it, then runs the
    /// publisher's `done`. Runs on the journal's thread: short, and no
    /// queue lock.
    fn commit_done(
        self: &Arc<Self>,
        commit: &Arc<Commit>,
        offset: u64,
        done: Option<Done>,
    ) -> Done {
        let commit = Arc::clone(commit);
        let me = Arc::downgrade(self);
        Box::new(move |r: Result<(), JournalError>| {
            match &r {
                Ok(()) => {
                    commit.end.fetch_max(offset + 1, Ordering::AcqRel);
                    if commit.waiting.swap(false, Ordering::AcqRel) {
                        if let Some(q) = me.upgrade() {
                            let target: Weak<dyn crate::timers::TimerTarget> =
                                Arc::downgrade(&q) as _;
                            // At once, not at the next timer tick: a
                            // caught-up reader would get every message up
                            // to a tick late, and at most a prefetch per
                            // tick.
                            q.env.timers.wake_now(q.env.clock.now(), target);
                        }
                    }
                }
                Err(_) => commit.failed.store(true, Ordering::Release),
            }
            if let Some(d) = done {
                d(r);
            }
        })
    }

    /// Lets resident messages go once they are durable (so the journal
    /// reads them back), keeping the newest `STREAM_TAIL_MESSAGES_MAX`.
    fn release_written_tail(&self, s: &mut QueueState) {
        let Some(st) = s.stream.as_mut() else {
            return;
        };
        let resident = st.log.resident_count();
        if resident <= 2 * STREAM_TAIL_MESSAGES_MAX {
            return;
        }
        let committed = st.commit.end.load(Ordering::Acquire);
        let durable = usize::try_from(committed.saturating_sub(st.log.resident_first()))
            .unwrap_or(usize::MAX);
        let mut n = durable.min(resident - STREAM_TAIL_MESSAGES_MAX);
        // A write that failed is never readable: past four times the
        // bound, after a failure, its message goes anyway (a gap).
        if st.commit.failed.load(Ordering::Acquire) && resident > 4 * STREAM_TAIL_MESSAGES_MAX {
            n = resident - STREAM_TAIL_MESSAGES_MAX;
        }
        st.log.release_resident(n);
    }

    /// Applies retention (size and age) now.
    pub(super) fn stream_retention(&self, s: &mut QueueState, unix_ms: u64, fx: &mut Effects) {
        let Some(st) = s.stream.as_mut() else {
            return;
        };
        let a = self.args();
        let limits = Limits {
            max_bytes: a.max_length_bytes,
            max_age_ms: a.max_age_ms,
        };
        let n = head_segments_to_drop(&st.log.segment_facts(), limits, unix_ms);
        if n == 0 {
            return;
        }
        fx.removed.extend(st.log.drop_head_segments(n));
        let first = st.log.first();
        for r in &mut st.readers {
            if r.next < first {
                r.next = first;
                r.chunk = None;
            }
        }
        st.chunks.forget_before(first);
    }

    /// When a stream with `max-age` should check its retention again.
    pub(super) fn stream_next_check(&self, s: &QueueState, now: Instant) -> Option<Instant> {
        let st = s.stream.as_ref()?;
        self.args().max_age_ms?;
        (st.log.stats().segments > 1)
            .then(|| now + Duration::from_millis(STREAM_RETENTION_CHECK_MS))
    }

    /// The next message of reader `i`: resident, in the chunk it reads,
    /// in a chunk another reader read, or read back from the journal with
    /// the offsets after it (a new chunk, kept for the others). `None` for
    /// a gap or an unreadable entry (logged; the reader skips it).
    fn stream_message(&self, st: &mut StreamState, i: usize) -> Option<Arc<Message>> {
        let offset = st.readers[i].next;
        if let Some(r) = st.log.resident(offset) {
            st.readers[i].chunk = None;
            return Some(Arc::clone(&r.msg));
        }
        if let Some(m) = st.readers[i].chunk.as_ref().and_then(|c| c.get(offset)) {
            return Some(Arc::clone(m));
        }
        let chunk = match st.chunks.find(offset) {
            Some(c) => c,
            None => {
                let c = Arc::new(self.stream_read_chunk(st, offset)?);
                let slowest = st.readers.iter().map(|r| r.next).min().unwrap_or(offset);
                st.chunks.keep(Arc::clone(&c), slowest);
                c
            }
        };
        let m = chunk.get(offset).cloned();
        st.readers[i].chunk = Some(chunk);
        m
    }

    /// Reads the messages from `offset` on back from the journal: up to a
    /// read-ahead batch, stopping before a resident message, a gap, a kept
    /// chunk or an unreadable entry (logged). `None` if not even the
    /// first could be read.
    fn stream_read_chunk(&self, st: &StreamState, offset: u64) -> Option<Chunk> {
        let qid = self.store_id?;
        let s = st.log.stats();
        let average = (s.bytes / s.messages.max(1)).max(1);
        let batch = (STREAM_READ_AHEAD_BYTES / average).clamp(1, STREAM_READ_AHEAD_MESSAGES as u64);
        let last = st
            .chunks
            .read_end(offset, (offset + batch).min(st.log.end()));
        let ids: Vec<u64> = (offset..last)
            .take_while(|o| st.log.resident(*o).is_none())
            .map(|o| st.log.id_at(o).unwrap_or(0))
            .take_while(|id| *id != 0)
            .collect();
        let read = self.env.dur.journal().read_many(qid, &ids);
        let mut msgs = Vec::with_capacity(ids.len());
        let mut bytes = 0;
        for (id, r) in ids.iter().zip(read) {
            let decoded = r.map_err(|e| e.to_string()).and_then(|p| {
                bytes += p.len() as u64;
                decode_entry(&p)
            });
            match decoded {
                Ok(x) => msgs.push(x.msg),
                Err(why) => {
                    tracing::error!(queue = %self.name, vhost = %self.vhost_name, msg = id, error = %why, "stream entry unreadable; skipped");
                    // The chunk ends before it; the reader skips it.
                    break;
                }
            }
        }
        (!msgs.is_empty()).then_some(Chunk {
            first: offset,
            msgs,
            bytes,
        })
    }

    /// Hands each reader the messages it has credit for, in offset order.
    pub(super) fn stream_dispatch(
        self: &Arc<Self>,
        s: &mut QueueState,
        now: Instant,
        _fx: &mut Effects,
    ) {
        let Some(mut st) = s.stream.take() else {
            return;
        };
        let mut delivered = 0usize;
        for i in 0..st.readers.len() {
            // Without credit, nothing to offer: a single ack (PerfTest's
            // way) dispatches to every reader, and the others' channel
            // locks and output checks were most of what an ack cost. Read
            // outside the channel lock; a credit returned meanwhile is
            // followed by that ack's own dispatch.
            if !st.readers[i].consumer.below_prefetch() {
                continue;
            }
            loop {
                let next = st.readers[i].next;
                let mut committed = st.commit.end.load(Ordering::Acquire).min(st.log.end());
                if next >= committed && next < st.log.end() {
                    // Wait for the write; check again after asking to be
                    // woken, in case it completed in between.
                    st.commit.waiting.store(true, Ordering::Release);
                    committed = st.commit.end.load(Ordering::Acquire).min(st.log.end());
                }
                if next >= committed {
                    break;
                }
                let Some(msg) = self.stream_message(&mut st, i) else {
                    st.readers[i].next += 1;
                    continue;
                };
                let m = QueuedMessage {
                    msg,
                    seq: next,
                    returns: 0,
                    redelivered: false,
                    expires_at: None,
                    stored: None,
                };
                let c = Arc::clone(&st.readers[i].consumer);
                match c.channel.try_deliver(&c, self, m, now) {
                    Ok(()) => {
                        st.readers[i].next += 1;
                        delivered += 1;
                        self.counters.add_delivered();
                    }
                    Err(_) => break,
                }
            }
        }
        if delivered > 0 {
            s.unacked += delivered;
            s.last_delivery = Some(now);
        }
        s.stream = Some(st);
    }

    /// Attaches a consumer at the offset its `x-stream-offset` names.
    pub(super) fn stream_attach(&self, s: &mut QueueState, c: Arc<Consumer>, spec: OffsetSpec) {
        let Some(mut st) = s.stream.take() else {
            return;
        };
        let next = match spec {
            OffsetSpec::First => st.log.first(),
            OffsetSpec::Next => st.log.end(),
            OffsetSpec::Last => st.log.end().saturating_sub(1).max(st.log.first()),
            OffsetSpec::Offset(o) => o.clamp(st.log.first(), st.log.end()),
            OffsetSpec::TimestampMs(ts) => self.stream_seek_time(&mut st, ts),
        };
        st.readers.push(Reader {
            consumer: c,
            next,
            chunk: None,
        });
        s.stream = Some(st);
    }

    /// The first offset whose timestamp is at or after `ts` (timestamps
    /// never decrease along the log: a binary search, reading entries
    /// back where they are not resident).
    fn stream_seek_time(&self, st: &mut StreamState, ts: u64) -> u64 {
        // Whole segments first (their newest timestamp is in memory).
        let Some(seg) = st
            .log
            .segments()
            .find(|g| g.last_timestamp_ms >= ts)
            .copied()
        else {
            return st.log.end();
        };
        let (mut lo, mut hi) = (seg.first, seg.first + seg.count - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.stream_timestamp(st, mid) {
                Some(t) if t < ts => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    fn stream_timestamp(&self, st: &mut StreamState, offset: u64) -> Option<u64> {
        if let Some(r) = st.log.resident(offset) {
            return Some(r.timestamp_ms);
        }
        let qid = self.store_id?;
        let id = st.log.id_at(offset)?;
        let p = self.env.dur.journal().read(qid, id).ok()?;
        entry::decode(&p).ok().map(|e| e.timestamp_ms)
    }

    /// A consumer left: its reader goes.
    pub(super) fn stream_detach(&self, s: &mut QueueState, c: &Arc<Consumer>) {
        if let Some(st) = s.stream.as_mut() {
            st.readers.retain(|r| !Arc::ptr_eq(&r.consumer, c));
            if st.readers.is_empty() {
                st.chunks.clear();
            }
        }
    }

    /// Rebuilds a stream from its recovered messages (in journal id order,
    /// which is offset order). Reads the first and last entries back: when
    /// their offsets span exactly the count, offsets follow by rank (the
    /// common case, two reads); otherwise every entry is read for its
    /// offset. Each segment's newest timestamp is read back for retention
    /// by age. Returns how many messages it restored, and what it skipped.
    pub fn restore_stream(&self, stored: Vec<StoredEntry>) -> (usize, Vec<String>) {
        let Some(qid) = self.store_id else {
            return (0, Vec::new());
        };
        let journal = self.env.dur.journal();
        let mut skipped = Vec::new();
        let read = |e: &StoredEntry| -> Result<entry::Entry, String> {
            let p = match &e.payload {
                Some(p) => p.clone(),
                None => journal.read(qid, e.id).map_err(|e| e.to_string())?,
            };
            entry::decode(&p).map_err(|e| e.to_string())
        };
        let mut log = StreamLog::default();
        let segment_max = self.segment_bytes_max();
        let ends = stored
            .first()
            .zip(stored.last())
            .map(|(a, b)| (read(a), read(b)));
        let dense = match &ends {
            Some((Ok(f), Ok(l))) => l.offset.checked_sub(f.offset) == Some(stored.len() as u64 - 1),
            _ => false,
        };
        let mut count = 0;
        if dense {
            let first = ends
                .as_ref()
                .and_then(|(f, _)| f.as_ref().ok())
                .map_or(0, |f| f.offset);
            for (i, e) in stored.iter().enumerate() {
                log.restore(first + i as u64, e.id, e.len, 0, segment_max);
                count += 1;
            }
        } else {
            for s in &stored {
                let id = s.id;
                match read(s) {
                    Ok(e)
                        if log.stats().messages > 0
                            && e.offset
                                > log.end().saturating_add(STREAM_RESTORE_GAP_OFFSETS_MAX) =>
                    {
                        skipped.push(format!(
                            "stream '{}': message {id} at offset {} is past a gap of more than {STREAM_RESTORE_GAP_OFFSETS_MAX} offsets after {}; skipped",
                            self.name,
                            e.offset,
                            log.end()
                        ));
                    }
                    Ok(e) if e.offset >= log.end() || log.stats().messages == 0 => {
                        log.restore(e.offset, id, s.len, e.timestamp_ms, segment_max);
                        count += 1;
                    }
                    Ok(e) => skipped.push(format!(
                        "stream '{}': message {id} at offset {} is out of order; skipped",
                        self.name, e.offset
                    )),
                    Err(why) => {
                        skipped.push(format!("stream '{}': message {id}: {why}", self.name))
                    }
                }
            }
        }
        // Each segment's newest timestamp, for retention by age.
        let lasts: Vec<(usize, u64)> = log
            .segments()
            .enumerate()
            .map(|(i, g)| (i, g.first + g.count - 1))
            .collect();
        for (i, offset) in lasts {
            let ts = log
                .id_at(offset)
                .and_then(|id| journal.read(qid, id).ok())
                .and_then(|p| entry::decode(&p).ok())
                .map_or(0, |e| e.timestamp_ms);
            log.set_segment_timestamp(i, ts);
        }
        let mut s = self.state.lock();
        if let Some(st) = s.stream.as_mut() {
            st.commit.end.store(log.end(), Ordering::Release);
            st.log = log;
        }
        (count, skipped)
    }
}

/// A stored stream entry as the resident message it delivers.
fn decode_entry(p: &Bytes) -> Result<Resident, String> {
    let e = entry::decode(p).map_err(|e| e.to_string())?;
    let msg = Message::from_stored(&e.message)?;
    Ok(Resident {
        msg,
        timestamp_ms: e.timestamp_ms,
    })
}
