//! A connection's output, and the broker's deliveries to it as PUBLISH
//! packets: queues call [`MqttOut`] (the broker's
//! `berth_broker::channel::Outlet`) under their channel's lock, and the
//! connection's writer task sends what it buffered.
//!
//! Invariants:
//! - Packets are appended whole, under one lock, so they never interleave.
//! - A QoS 1 delivery gets a packet id not in use by another delivery
//!   awaiting its PUBACK; the id maps back to the broker's delivery tag.
//! - Output is bounded: above `limit_bytes` the outlet reports congestion
//!   and queues keep their messages; every buffered byte counts toward
//!   the memory alarm (`crate::memory::OUTPUT_BYTES`).
//! - A delivery that the client may not receive (above its v5 maximum
//!   packet size) or that it gets at QoS 0 from a queue that waits for
//!   acks is acked by the connection task, never under the channel lock.

use std::collections::HashMap;
use std::sync::Arc;

use berth_broker::channel::Outlet;
use berth_broker::message::Message;
use berth_protocol::{AMQPValue, FieldTable};
use bytes::BytesMut;
use mqtt5_protocol::packet::publish::PublishPacket;
use mqtt5_protocol::QoS;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::codec;
use super::topic;
use crate::memory::{Counted, OUTPUT_BYTES};

/// The consumer tag of a session's QoS 1 queue (deliveries wait for
/// PUBACK); its QoS 0 queue's consumer has [`TAG_QOS0`].
pub const TAG_QOS1: &str = "mqtt-qos1";
pub const TAG_QOS0: &str = "mqtt-qos0";

/// The AMQP header carrying the QoS an MQTT client published with, as
/// RabbitMQ's plugin names it.
pub const HEADER_PUBLISH_QOS: &str = "x-mqtt-publish-qos";

struct Buffer {
    bytes: BytesMut,
    counted: Counted,
    closed: bool,
}

/// Deliveries sent at QoS 1 and not yet PUBACKed.
#[derive(Default)]
struct Inflight {
    last_packet_id: u16,
    by_packet_id: HashMap<u16, u64>,
    /// Deliveries to ack at once (QoS 0 from the QoS 1 queue, or too
    /// large for the client), by delivery tag.
    settle_now: Vec<u64>,
}

/// One MQTT connection's output.
pub struct MqttOut {
    /// 4 (3.1.1) or 5.
    version: u8,
    /// The client's maximum packet size (v5), or no limit.
    client_packet_bytes_max: usize,
    limit_bytes: usize,
    buf: Mutex<Buffer>,
    inflight: Mutex<Inflight>,
    /// Wakes the writer task.
    pub wake_writer: Notify,
    /// Wakes the connection task (settle_now has work, or the queue went
    /// away).
    pub wake_connection: Notify,
    /// A queue of the session was deleted under it (`consumer_cancelled`).
    cancelled: std::sync::atomic::AtomicBool,
}

impl MqttOut {
    pub fn new(version: u8, client_packet_bytes_max: usize, limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            version,
            client_packet_bytes_max,
            limit_bytes,
            buf: Mutex::new(Buffer {
                bytes: BytesMut::new(),
                counted: Counted::new(&OUTPUT_BYTES),
                closed: false,
            }),
            inflight: Mutex::new(Inflight::default()),
            wake_writer: Notify::new(),
            wake_connection: Notify::new(),
            cancelled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Appends one packet that `write` encodes, and wakes the writer.
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

    /// No more output after what is buffered; the writer ends once it
    /// has sent it.
    pub fn close(&self) {
        self.buf.lock().closed = true;
        self.wake_writer.notify_one();
    }

    /// Above the limit: the connection stops reading too (a client that
    /// never reads its PUBACKs cannot grow this without bound).
    pub fn is_full(&self) -> bool {
        self.buf.lock().bytes.len() >= 2 * self.limit_bytes
    }

    /// The delivery tag a PUBACK's packet id answers, if it is one of ours.
    pub fn acked(&self, packet_id: u16) -> Option<u64> {
        self.inflight.lock().by_packet_id.remove(&packet_id)
    }

    /// Deliveries to ack now (see [`Inflight::settle_now`]).
    pub fn take_settle_now(&self) -> Vec<u64> {
        std::mem::take(&mut self.inflight.lock().settle_now)
    }

    pub fn was_cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A free packet id for a QoS 1 delivery of `tag`.
    fn packet_id_for(&self, tag: u64) -> u16 {
        let mut f = self.inflight.lock();
        loop {
            f.last_packet_id = f.last_packet_id.checked_add(1).unwrap_or(1);
            let id = f.last_packet_id;
            if let std::collections::hash_map::Entry::Vacant(free) = f.by_packet_id.entry(id) {
                free.insert(tag);
                return id;
            }
        }
    }

    fn settle_later(&self, tag: u64) {
        self.inflight.lock().settle_now.push(tag);
        self.wake_connection.notify_one();
    }
}

/// The QoS a message was published with: the MQTT publisher's (header),
/// or for an AMQP publisher 1 if persistent, else 0 (RabbitMQ's rule).
fn published_qos(msg: &Message) -> u8 {
    let header = berth_protocol::codec::decode_properties(&msg.properties)
        .ok()
        .and_then(|p| p.headers().clone())
        .and_then(|h: FieldTable| h.inner().get(HEADER_PUBLISH_QOS).cloned());
    match header {
        Some(AMQPValue::ShortShortUInt(q)) => q.min(1),
        Some(AMQPValue::ShortShortInt(q)) => u8::try_from(q.clamp(0, 1)).unwrap_or(0),
        Some(AMQPValue::LongInt(q)) => u8::try_from(q.clamp(0, 1)).unwrap_or(0),
        _ => u8::from(msg.persistent),
    }
}

impl Outlet for MqttOut {
    fn deliver(
        &self,
        _channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
    ) {
        let from_qos1_queue = consumer_tag == TAG_QOS1;
        let qos = if from_qos1_queue {
            published_qos(msg)
        } else {
            0
        };
        let name = topic::topic_name(&msg.routing_key);
        let mut p = if self.version == 5 {
            PublishPacket::new(name, msg.body.clone(), QoS::from(qos))
        } else {
            PublishPacket::new_v311(name, msg.body.clone(), QoS::from(qos))
        };
        // Packet size: body, topic and a fixed header's worth.
        let size = msg.body.len() + msg.routing_key.len() + 16;
        if size > self.client_packet_bytes_max {
            tracing::debug!(
                size,
                max = self.client_packet_bytes_max,
                "MQTT delivery above the client's maximum packet size dropped"
            );
            if from_qos1_queue {
                self.settle_later(delivery_tag);
            }
            return;
        }
        if qos == 1 {
            p = p
                .with_packet_id(self.packet_id_for(delivery_tag))
                .with_dup(redelivered);
        } else if from_qos1_queue {
            self.settle_later(delivery_tag);
        }
        self.push(|b| {
            if let Err(e) = codec::encode(&p, b) {
                tracing::error!(error = %e, "could not encode an MQTT PUBLISH");
            }
        });
    }

    fn get_ok(&self, _: u16, _: u64, _: bool, _: &Message, _: u32) {
        // MQTT has no basic.get; nothing calls it for an MQTT session.
    }

    fn consumer_cancelled(&self, _channel: u16, _consumer_tag: &str) {
        self.cancelled
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake_connection.notify_one();
    }

    fn is_congested(&self) -> bool {
        self.buf.lock().bytes.len() >= self.limit_bytes
    }
}
