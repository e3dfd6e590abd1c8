//! A stream protocol connection's output, and the broker's deliveries to
//! its subscriptions as Deliver frames of chunks ([`super::chunk`]).
//!
//! A subscription is an ordinary broker consumer of the stream on a
//! broker channel of its own, with a prefetch of
//! `STREAM_PROTO_DELIVERIES_PENDING_MAX` messages. The queue hands it
//! messages one by one (under the channel's lock, [`StreamOut::deliver`]
//! only appends them to the subscription's pending list); the writer task,
//! before each write, cuts what is pending into chunks while the
//! subscription has credit ([`StreamOut::flush`]): one chunk per credit,
//! as RabbitMQ counts it. A message is acked to the broker (which, on a
//! stream, only gives the consumer its credit back) once it is in a
//! chunk, so a subscription without credit holds at most its prefetch.
//!
//! Invariants:
//! - A chunk's entries have consecutive offsets: a client numbers them
//!   from the chunk's first offset.
//! - Frames are appended whole, under one lock, so they never interleave.
//! - Output is bounded: while the buffered frames or the messages pending
//!   in subscriptions reach `limit_bytes` the outlet reports congestion
//!   and queues keep their messages (the connection resumes them once it
//!   clears); above twice it the connection stops reading; every buffered
//!   byte counts toward the memory alarm.
//! - A chunk fits the client's frame_max (but for a single message larger
//!   than it, which goes alone).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use berth_broker::channel::Outlet;
use berth_broker::message::Message;
use berth_protocol::AMQPValue;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::chunk::Chunk;
use super::frame::{code, key, Frame};
use super::message::{self, HEADER_OFFSET};
use crate::limits::{STREAM_PROTO_CHUNK_BYTES_MAX, STREAM_PROTO_CHUNK_MESSAGES_MAX};
use crate::memory::{Counted, OUTPUT_BYTES};

/// The consumer tag of subscription `id`.
pub fn consumer_tag(id: u8) -> String {
    format!("stream-subscription-{id}")
}

fn subscription_of(tag: &str) -> Option<u8> {
    tag.strip_prefix("stream-subscription-")?.parse().ok()
}

struct Buffer {
    bytes: BytesMut,
    counted: Counted,
    closed: bool,
}

struct Pending {
    tag: u64,
    offset: u64,
    timestamp_ms: i64,
    data: Bytes,
}

/// One subscription's deliveries.
struct Sub {
    stream: String,
    credit: u32,
    pending: VecDeque<Pending>,
    /// The delivery tag up to which the broker can be acked.
    ack_due: Option<u64>,
}

/// One stream protocol connection's output.
pub struct StreamOut {
    limit_bytes: usize,
    buf: Mutex<Buffer>,
    subs: Mutex<HashMap<u8, Sub>>,
    /// Wakes the writer task.
    pub wake_writer: Notify,
    /// Wakes the connection task: acks are due.
    pub wake_connection: Notify,
    acks_due: AtomicBool,
    /// Bytes of the messages pending in subscriptions.
    pending_bytes: AtomicUsize,
    /// Congestion was reported: queues wait for a resume.
    congested_seen: AtomicBool,
    /// The most message bytes in one chunk (from the client's frame_max).
    chunk_bytes_max: AtomicUsize,
    /// The connection task is acking: the deliveries the acks let the
    /// queues make wake the writer once, after them, so they go out as
    /// one chunk rather than as many as the writer could wake for.
    settling: AtomicBool,
}

impl StreamOut {
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit_bytes,
            buf: Mutex::new(Buffer {
                bytes: BytesMut::new(),
                counted: Counted::new(&OUTPUT_BYTES),
                closed: false,
            }),
            subs: Mutex::new(HashMap::new()),
            wake_writer: Notify::new(),
            wake_connection: Notify::new(),
            acks_due: AtomicBool::new(false),
            pending_bytes: AtomicUsize::new(0),
            congested_seen: AtomicBool::new(false),
            chunk_bytes_max: AtomicUsize::new(STREAM_PROTO_CHUNK_BYTES_MAX),
            settling: AtomicBool::new(false),
        })
    }

    /// Appends one frame that `write` encodes, and wakes the writer.
    pub fn push(&self, write: impl FnOnce(&mut BytesMut)) {
        let mut b = self.buf.lock();
        if b.closed {
            return;
        }
        write(&mut b.bytes);
        let n = b.bytes.len() as u64;
        b.counted.set(n);
        drop(b);
        self.wake_writer.notify_one();
    }

    /// Everything buffered, for the writer; `None` once closed and empty.
    pub fn take(&self) -> Option<BytesMut> {
        let mut b = self.buf.lock();
        if b.bytes.is_empty() && b.closed {
            return None;
        }
        let out = b.bytes.split();
        b.counted.set(0);
        Some(out)
    }

    /// No more output after what is buffered.
    pub fn close(&self) {
        self.buf.lock().closed = true;
        self.wake_writer.notify_one();
    }

    /// Above twice the limit: the connection stops reading.
    pub fn is_full(&self) -> bool {
        self.buf.lock().bytes.len() >= 2 * self.limit_bytes
    }

    /// Deliveries made while `f` runs wake the writer once, after it.
    pub fn settling<T>(&self, f: impl FnOnce() -> T) -> T {
        self.settling.store(true, Ordering::Release);
        let r = f();
        self.settling.store(false, Ordering::Release);
        self.wake_writer.notify_one();
        r
    }

    /// Chunks of at most this frame size (Tune's frame_max).
    pub fn set_frame_max(&self, frame_max: u32) {
        let room = (frame_max as usize).saturating_sub(super::chunk::HEADER_BYTES + 64);
        self.chunk_bytes_max.store(
            room.clamp(1, STREAM_PROTO_CHUNK_BYTES_MAX),
            Ordering::Relaxed,
        );
    }

    /// Whether queues were held back and may deliver again now (then the
    /// connection resumes its subscriptions' channels).
    pub fn take_resume(&self) -> bool {
        if !self.congested_seen.load(Ordering::Acquire) || self.congested() {
            return false;
        }
        self.congested_seen.swap(false, Ordering::AcqRel)
    }

    /// Congestion was reported: after a write the connection looks again.
    pub fn may_resume(&self) -> bool {
        self.congested_seen.load(Ordering::Acquire)
    }

    fn congested(&self) -> bool {
        self.buf.lock().bytes.len() >= self.limit_bytes
            || self.pending_bytes.load(Ordering::Acquire) >= self.limit_bytes
    }

    /// A new subscription, without credit until [`StreamOut::add_credit`].
    pub fn subscribe(&self, id: u8, stream: &str) {
        self.subs.lock().insert(
            id,
            Sub {
                stream: stream.to_owned(),
                credit: 0,
                pending: VecDeque::new(),
                ack_due: None,
            },
        );
    }

    pub fn unsubscribe(&self, id: u8) {
        if let Some(s) = self.subs.lock().remove(&id) {
            let bytes: usize = s.pending.iter().map(|p| p.data.len()).sum();
            self.pending_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Credit for subscription `id`; false if there is no such one.
    pub fn add_credit(&self, id: u8, credit: u16) -> bool {
        let known = match self.subs.lock().get_mut(&id) {
            Some(s) => {
                s.credit = s.credit.saturating_add(u32::from(credit));
                true
            }
            None => false,
        };
        if known {
            self.wake_writer.notify_one();
        }
        known
    }

    /// The acks due, by subscription: (id, delivery tag, multiple).
    pub fn take_acks(&self) -> Vec<(u8, u64)> {
        if !self.acks_due.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        let mut subs = self.subs.lock();
        subs.iter_mut()
            .filter_map(|(id, s)| s.ack_due.take().map(|t| (*id, t)))
            .collect()
    }

    /// Cuts pending messages into chunks while their subscriptions have
    /// credit (the writer calls it before each write).
    pub fn flush(&self) {
        let mut subs = self.subs.lock();
        let mut acked = false;
        let chunk_bytes_max = self.chunk_bytes_max.load(Ordering::Relaxed);
        for (id, s) in subs.iter_mut() {
            while s.credit > 0 && !s.pending.is_empty() {
                let mut c = Chunk::default();
                let mut last_tag = None;
                while let Some(p) = s.pending.front() {
                    if c.len() >= STREAM_PROTO_CHUNK_MESSAGES_MAX
                        || (!c.is_empty() && c.data_bytes() + p.data.len() > chunk_bytes_max)
                        || !c.push(p.offset, p.timestamp_ms, &p.data)
                    {
                        break;
                    }
                    last_tag = Some(p.tag);
                    self.pending_bytes.fetch_sub(p.data.len(), Ordering::AcqRel);
                    s.pending.pop_front();
                }
                let Some(tag) = last_tag else {
                    // Cannot happen (an empty chunk takes any message);
                    // drop the message rather than loop.
                    if let Some(p) = s.pending.pop_front() {
                        self.pending_bytes.fetch_sub(p.data.len(), Ordering::AcqRel);
                    }
                    continue;
                };
                s.credit -= 1;
                s.ack_due = Some(tag);
                acked = true;
                self.push(|b| c.write_deliver(*id, b));
            }
        }
        drop(subs);
        if acked {
            self.acks_due.store(true, Ordering::Release);
            self.wake_connection.notify_one();
        }
    }
}

/// A delivery's offset and timestamp, from the headers the stream put
/// in its properties.
fn offset_and_time(props: &berth_protocol::AMQPProperties) -> Option<(u64, i64)> {
    let offset = match props.headers().as_ref()?.inner().get(HEADER_OFFSET)? {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok()?,
        AMQPValue::LongUInt(n) => u64::from(*n),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok()?,
        _ => return None,
    };
    let ts = props.timestamp().map_or_else(now_ms, |s| {
        i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
    });
    Some((offset, ts))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Outlet for StreamOut {
    fn deliver(
        &self,
        _channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        _redelivered: bool,
        msg: &Message,
    ) {
        let Some(id) = subscription_of(consumer_tag) else {
            return;
        };
        let props = match berth_protocol::codec::decode_properties(&msg.properties) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "a stream message's properties do not decode; not delivered");
                return;
            }
        };
        let Some((offset, timestamp_ms)) = offset_and_time(&props) else {
            tracing::error!("a stream delivery without its x-stream-offset; not delivered");
            return;
        };
        let data = message::to_client(&props, &msg.body);
        let mut subs = self.subs.lock();
        if let Some(s) = subs.get_mut(&id) {
            self.pending_bytes.fetch_add(data.len(), Ordering::AcqRel);
            s.pending.push_back(Pending {
                tag: delivery_tag,
                offset,
                timestamp_ms,
                data,
            });
        }
        drop(subs);
        if !self.settling.load(Ordering::Acquire) {
            self.wake_writer.notify_one();
        }
    }

    fn get_ok(&self, _: u16, _: u64, _: bool, _: &Message, _: u32) {
        // The stream protocol has no basic.get.
    }

    fn consumer_cancelled(&self, _channel: u16, consumer_tag: &str) {
        // The stream was deleted: RabbitMQ tells the client with a
        // MetadataUpdate, and the subscription is gone.
        let Some(id) = subscription_of(consumer_tag) else {
            return;
        };
        let Some(s) = self.subs.lock().remove(&id) else {
            return;
        };
        let bytes: usize = s.pending.iter().map(|p| p.data.len()).sum();
        self.pending_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.push(|b| {
            let mut f = Frame::begin(b, key::METADATA_UPDATE, 1);
            f.u16(code::STREAM_NOT_AVAILABLE).string(&s.stream);
            f.finish();
        });
    }

    fn is_congested(&self) -> bool {
        let congested = self.congested();
        if congested {
            self.congested_seen.store(true, Ordering::Release);
        }
        congested
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::codec::encode_properties;
    use berth_protocol::{AMQPProperties, FieldTable};

    fn stream_message(offset: i64) -> Arc<Message> {
        let mut h = FieldTable::default();
        h.insert(HEADER_OFFSET.into(), AMQPValue::LongLongInt(offset));
        let props = AMQPProperties::default().with_headers(h);
        let body = Bytes::from(format!("m{offset}"));
        Message::published(
            String::new(),
            "s".into(),
            encode_properties(&props),
            body,
            "u",
        )
        .unwrap()
    }

    /// (chunk id, entries) of each Deliver frame in `out`.
    fn chunks(mut out: &[u8]) -> Vec<(u64, u16)> {
        let mut v = Vec::new();
        while out.len() >= 4 {
            let size = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
            let f = &out[4..4 + size];
            assert_eq!(&f[..2], &[0, 8], "a Deliver frame");
            let chunk = &f[5..];
            let entries = u16::from_be_bytes(chunk[2..4].try_into().unwrap());
            let first = u64::from_be_bytes(chunk[24..32].try_into().unwrap());
            v.push((first, entries));
            out = &out[4 + size..];
        }
        v
    }

    #[test]
    fn chunks_go_out_by_credit_with_consecutive_offsets_and_acks_follow() {
        let out = StreamOut::new(1 << 20);
        out.subscribe(1, "s");
        let tag = consumer_tag(1);
        for (t, o) in [(1u64, 5i64), (2, 6), (3, 8)] {
            out.deliver(2, &tag, t, false, &stream_message(o));
        }
        out.flush();
        assert!(out.take().unwrap().is_empty(), "no credit, no chunk");
        assert!(out.take_acks().is_empty());
        assert!(out.add_credit(1, 1));
        out.flush();
        assert_eq!(chunks(&out.take().unwrap()), vec![(5, 2)], "cut at the gap");
        assert_eq!(out.take_acks(), vec![(1, 2)]);
        out.add_credit(1, 5);
        out.flush();
        assert_eq!(chunks(&out.take().unwrap()), vec![(8, 1)]);
        assert_eq!(out.pending_bytes.load(Ordering::Acquire), 0);
        assert!(!out.add_credit(9, 1), "no such subscription");
    }
}
