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
//! - Nothing is ever removed by a consumer; retention journals a trim of
//!   whole segments from the head (under the lock: journal calls never
//!   block).
//! - Nothing is kept per message: the journal finds an offset through its
//!   sparse index (`Journal::stream_read`), the log keeps segments.
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
use crate::stream::log::{Resident, StoredStream, StreamLog, StreamStats};
use crate::stream::offset::OffsetSpec;
use crate::stream::retention::{head_segments_to_drop, Limits};

/// The header every delivery from a stream carries.
pub const OFFSET_HEADER: &str = "x-stream-offset";

impl StreamState {
    pub(super) fn stats(&self) -> StreamStats {
        self.log.stats()
    }
}

/// A stream message stored the way berth stored them before the journal
/// had streams (one publish per message, with a message id), given back
/// after a restart: restore moves it to the stream's appends.
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
            let bytes = record.len() as u64;
            let done = q.commit_done(&st.commit, offset, done);
            q.env
                .dur
                .journal()
                .stream_append(qid, offset, record, Some(done));
            let segments_before = st.log.stats().segments;
            st.log.append(bytes, ts, Some(tagged), segment_max);
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

    /// Lets resident messages go once they are durable and the journal
    /// reads them back, keeping the newest `STREAM_TAIL_MESSAGES_MAX`.
    fn release_written_tail(&self, s: &mut QueueState) {
        let Some(st) = s.stream.as_mut() else {
            return;
        };
        let resident = st.log.resident_count();
        if resident <= 2 * STREAM_TAIL_MESSAGES_MAX {
            return;
        }
        let mut committed = st.commit.end.load(Ordering::Acquire);
        // Committed is not always readable yet (a cluster member's store
        // writes what Raft committed when it applies it): a message let go
        // before the journal can read it back would be skipped by every
        // reader behind it.
        if let Some(end) = self
            .store_id
            .and_then(|qid| self.env.dur.journal().stream_readable_end(qid))
        {
            committed = committed.min(end);
        }
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
    pub(super) fn stream_retention(&self, s: &mut QueueState, unix_ms: u64, _fx: &mut Effects) {
        let Some(st) = s.stream.as_mut() else {
            return;
        };
        let a = self.args();
        let limits = Limits {
            max_bytes: a.max_length_bytes,
            max_age_ms: a.max_age_ms,
        };
        let n = head_segments_to_drop(&st.log.segment_facts(), limits, unix_ms);
        let Some(first) = st.log.drop_head_segments(n) else {
            return;
        };
        if let Some(qid) = self.store_id {
            self.env.dur.journal().stream_trim(qid, first, None);
        }
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

    /// The next message of reader `i` at or after its position, with its
    /// offset: resident, in the chunk it reads, in a chunk another reader
    /// read, or read back from the journal with the offsets after it (a
    /// new chunk, kept for the others). `None` if nothing could be read
    /// there (logged; the reader skips the offset).
    fn stream_message(&self, st: &mut StreamState, i: usize) -> Option<(u64, Arc<Message>)> {
        let offset = st.readers[i].next;
        if let Some(r) = st.log.resident(offset) {
            st.readers[i].chunk = None;
            return Some((offset, Arc::clone(&r.msg)));
        }
        if let Some((o, m)) = st.readers[i].chunk.as_ref().and_then(|c| c.get(offset)) {
            return Some((o, Arc::clone(m)));
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
        let m = chunk.get(offset).map(|(o, m)| (o, Arc::clone(m)));
        st.readers[i].chunk = Some(chunk);
        m
    }

    /// Reads the messages from `offset` on back from the journal: up to a
    /// read-ahead batch, stopping before a resident message, a kept chunk
    /// or an unreadable entry (logged). `None` if not even the first could
    /// be read.
    fn stream_read_chunk(&self, st: &StreamState, offset: u64) -> Option<Chunk> {
        let qid = self.store_id?;
        let s = st.log.stats();
        let average = (s.bytes / s.messages.max(1)).max(1);
        let batch = (STREAM_READ_AHEAD_BYTES / average).clamp(1, STREAM_READ_AHEAD_MESSAGES as u64);
        let last = st
            .chunks
            .read_end(offset, (offset + batch).min(st.log.resident_first()));
        if last <= offset {
            return None;
        }
        let count = usize::try_from(last - offset).unwrap_or(usize::MAX);
        let bytes_max = usize::try_from(STREAM_READ_AHEAD_BYTES).unwrap_or(usize::MAX);
        let read = match self
            .env
            .dur
            .journal()
            .stream_read(qid, offset, count, bytes_max)
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost_name, offset, error = %e, "stream unreadable here; skipped");
                return None;
            }
        };
        let mut offsets = Vec::with_capacity(read.len());
        let mut msgs = Vec::with_capacity(read.len());
        let mut bytes = 0;
        for (o, p) in read {
            if o >= last {
                break;
            }
            bytes += p.len() as u64;
            match decode_entry(&p) {
                Ok(x) => {
                    offsets.push(o);
                    msgs.push(x.msg);
                }
                Err(why) => {
                    tracing::error!(queue = %self.name, vhost = %self.vhost_name, offset = o, error = %why, "stream entry unreadable; skipped");
                    // The chunk ends before it; the reader skips it.
                    break;
                }
            }
        }
        (!msgs.is_empty()).then_some(Chunk {
            first: offset,
            offsets,
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
                let Some((at, msg)) = self.stream_message(&mut st, i) else {
                    st.readers[i].next += 1;
                    continue;
                };
                if at >= committed {
                    // A gap up to a message not yet durable: wait there.
                    st.readers[i].next = at;
                    st.readers[i].chunk = None;
                    continue;
                }
                st.readers[i].next = at;
                let m = QueuedMessage {
                    msg,
                    seq: at,
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

    /// The first offset whose timestamp is at or after `ts`: the
    /// segments' newest timestamps are the time index (in memory), then a
    /// binary search inside the segment, reading single entries back
    /// (timestamps never decrease along the log).
    fn stream_seek_time(&self, st: &mut StreamState, ts: u64) -> u64 {
        let Some((seg, after)) = st.log.segments().find(|(g, _)| g.last_timestamp_ms >= ts) else {
            return st.log.end();
        };
        let (mut lo, mut hi) = (seg.first, after.saturating_sub(1).max(seg.first));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.stream_timestamp(st, mid) {
                Some((at, t)) if t < ts => lo = at.max(mid) + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// The timestamp of the first message at or after `offset`, with its
    /// offset.
    fn stream_timestamp(&self, st: &mut StreamState, offset: u64) -> Option<(u64, u64)> {
        if let Some(r) = st.log.resident(offset) {
            return Some((offset, r.timestamp_ms));
        }
        let qid = self.store_id?;
        let (at, p) = self
            .env
            .dur
            .journal()
            .stream_read(qid, offset, 1, 1)
            .ok()?
            .into_iter()
            .next()?;
        entry::decode(&p).ok().map(|e| (at, e.timestamp_ms))
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

    /// Rebuilds a stream from what the journal gives back after a
    /// restart, reading no message but one per segment (its newest
    /// timestamp, for retention by age and timestamp seeks). `legacy`
    /// holds messages stored before the journal had streams (one publish
    /// each): they are appended again at their offsets, and their old
    /// records removed once those appends are durable. Returns how many
    /// messages the stream holds, and what it skipped.
    pub fn restore_stream(
        &self,
        stored: Option<&StoredStream>,
        legacy: Vec<StoredEntry>,
    ) -> (usize, Vec<String>) {
        let Some(qid) = self.store_id else {
            return (0, Vec::new());
        };
        let journal = self.env.dur.journal();
        let segment_max = self.segment_bytes_max();
        let mut log =
            stored.map_or_else(StreamLog::default, |s| StreamLog::restored(s, segment_max));
        let mut skipped = Vec::new();
        if !legacy.is_empty() {
            self.migrate_legacy(&mut log, legacy, &mut skipped);
        }
        // Each segment's newest timestamp, for retention by age.
        let lasts: Vec<(usize, u64)> = log
            .segments()
            .enumerate()
            .map(|(i, (_, after))| (i, after.saturating_sub(1)))
            .collect();
        for (i, offset) in lasts {
            let ts = journal
                .stream_read(qid, offset, 1, 1)
                .ok()
                .and_then(|r| r.into_iter().next())
                .and_then(|(_, p)| entry::decode(&p).ok())
                .map_or(0, |e| e.timestamp_ms);
            log.set_segment_timestamp(i, ts);
        }
        let count = usize::try_from(log.stats().messages).unwrap_or(usize::MAX);
        let mut s = self.state.lock();
        if let Some(st) = s.stream.as_mut() {
            st.commit.end.store(log.end(), Ordering::Release);
            st.log = log;
        }
        (count, skipped)
    }

    /// Appends messages stored one publish each (berth before the
    /// journal's streams) at their offsets, after what `log` holds; their
    /// old records go once the appends are durable (a crash before that
    /// keeps both, and the next restore appends only what is not yet
    /// appended).
    fn migrate_legacy(
        &self,
        log: &mut StreamLog,
        legacy: Vec<StoredEntry>,
        skipped: &mut Vec<String>,
    ) {
        let Some(qid) = self.store_id else {
            return;
        };
        let journal = self.env.dur.journal();
        let segment_max = self.segment_bytes_max();
        let ids: Vec<u64> = legacy.iter().map(|e| e.id).collect();
        let mut appended = 0usize;
        let mut already = 0usize;
        let mut pending: Vec<(u64, Bytes)> = Vec::new();
        for chunk in legacy.chunks(STREAM_READ_AHEAD_MESSAGES) {
            let unread: Vec<u64> = chunk
                .iter()
                .filter(|e| e.payload.is_none())
                .map(|e| e.id)
                .collect();
            let mut read = journal.read_many(qid, &unread).into_iter();
            for e in chunk {
                let p = match &e.payload {
                    Some(p) => Ok(p.clone()),
                    None => read
                        .next()
                        .unwrap_or_else(|| Err(crate::durable::JournalError::new("not read")))
                        .map_err(|e| e.to_string()),
                };
                let decoded = p.and_then(|p| {
                    let x = entry::decode(&p).map_err(|e| e.to_string())?;
                    Ok((x.offset, x.timestamp_ms, p))
                });
                let empty = log.stats().messages == 0;
                match decoded {
                    Ok((offset, _, _))
                        if !empty
                            && offset
                                > log.end().saturating_add(STREAM_RESTORE_GAP_OFFSETS_MAX) =>
                    {
                        skipped.push(format!(
                            "stream '{}': message {} at offset {offset} is past a gap of more than {STREAM_RESTORE_GAP_OFFSETS_MAX} offsets after {}; skipped",
                            self.name,
                            e.id,
                            log.end()
                        ));
                    }
                    Ok((offset, ts, p)) if offset >= log.end() || empty => {
                        if empty {
                            *log = StreamLog::starting_at(offset);
                        }
                        // A gap: a write lost before a crash.
                        log.skip_to(offset);
                        log.append(p.len() as u64, ts, None, segment_max);
                        pending.push((offset, p));
                        appended += 1;
                    }
                    // Appended before a crash cut the last move short.
                    Ok(_) => already += 1,
                    Err(why) => {
                        skipped.push(format!("stream '{}': message {}: {why}", self.name, e.id))
                    }
                }
            }
        }
        tracing::info!(queue = %self.name, vhost = %self.vhost_name, messages = appended, already, "moving a stream's messages stored one publish each to the journal's stream appends");
        let shared = self.env.dur.journal_shared();
        let Some(last) = pending.len().checked_sub(1) else {
            journal.remove(qid, &ids, None);
            return;
        };
        let failed = Arc::new(AtomicBool::new(false));
        let mut ids = Some(ids);
        for (i, (offset, p)) in pending.into_iter().enumerate() {
            let failed = Arc::clone(&failed);
            // Only the last completion removes the old records: those of
            // one group run in order, so it sees every earlier result.
            let old = if i == last { ids.take() } else { None };
            let remover = Arc::clone(&shared);
            let done: Done = Box::new(move |r| {
                if r.is_err() {
                    failed.store(true, Ordering::Release);
                }
                if let Some(ids) = old {
                    if !failed.load(Ordering::Acquire) {
                        remover.remove(qid, &ids, None);
                    }
                }
            });
            shared.stream_append(qid, offset, p, Some(done));
        }
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
