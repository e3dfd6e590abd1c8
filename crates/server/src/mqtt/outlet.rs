//! A connection's output, and the broker's deliveries to it as PUBLISH
//! packets: queues call [`MqttOut`] (the broker's
//! `berth_broker::channel::Outlet`) under their channel's lock, and the
//! connection's writer task sends what it buffered.
//!
//! Invariants:
//! - Packets are appended whole, under one lock, so they never interleave.
//! - A QoS 1 or 2 delivery gets a packet id not in use by another
//!   delivery awaiting its PUBACK, PUBREC or PUBCOMP; the id maps back to
//!   the broker's delivery tag until PUBACK or PUBREC (which ack the
//!   message in its queue), then a QoS 2 id waits for PUBCOMP.
//! - Delivery QoS is the lower of the publisher's and the subscription's
//!   (the queue it came from); the retain flag is set only for a retained
//!   message sent at subscribe, or (v5 retain-as-published) to a
//!   subscription that asked for the flag as published.
//! - Output is bounded: above `limit_bytes` the outlet reports congestion
//!   and queues keep their messages; every buffered byte counts toward
//!   the memory alarm (`crate::memory::OUTPUT_BYTES`).
//! - A delivery that the client may not receive (above its v5 maximum
//!   packet size) or that it gets at QoS 0 from a queue that waits for
//!   acks is acked by the connection task, never under the channel lock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use berth_broker::channel::Outlet;
use berth_broker::message::Message;
use berth_protocol::{AMQPProperties, AMQPValue};
use bytes::{Bytes, BytesMut};
use mqtt5_protocol::packet::publish::PublishPacket;
use mqtt5_protocol::packet::pubrel::PubRelPacket;
use mqtt5_protocol::QoS;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::codec;
use super::properties::{HEADER_PUBLISH_QOS, HEADER_RETAIN};
use super::retained::Retained;
use super::topic;
use crate::limits;
use crate::memory::{Counted, OUTPUT_BYTES};

/// The consumer tags of a session's queues, by subscription QoS: QoS 0
/// deliveries are not acked, QoS 1 wait for PUBACK, QoS 2 for PUBREC.
pub const TAGS: [&str; 3] = ["mqtt-qos0", "mqtt-qos1", "mqtt-qos2"];

/// The delivery tag of a packet id that has no broker delivery behind it
/// (a retained message sent at subscribe): broker tags start at 1.
const NO_TAG: u64 = 0;

struct Buffer {
    bytes: BytesMut,
    counted: Counted,
    closed: bool,
}

/// Deliveries sent at QoS 1 or 2 and not yet PUBACKed / PUBRECed, and
/// QoS 2 ones PUBRECed whose PUBCOMP is awaited.
#[derive(Default)]
struct Inflight {
    last_packet_id: u16,
    by_packet_id: HashMap<u16, u64>,
    /// QoS 2 packet ids PUBRECed (message acked) and PUBRELed, awaiting
    /// the client's PUBCOMP; at `MQTT_DELIVERIES_UNCOMPLETED_MAX` queues
    /// stop delivering here.
    awaiting_comp: HashSet<u16>,
    /// v5 subscriptions with retain-as-published, by topic filter.
    retain_as_published: Vec<String>,
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

    /// The delivery tag a PUBACK's packet id answers, if it is one of
    /// ours and has a broker delivery.
    pub fn acked(&self, packet_id: u16) -> Option<u64> {
        let tag = self.inflight.lock().by_packet_id.remove(&packet_id);
        tag.filter(|t| *t != NO_TAG)
    }

    /// A PUBREC for `packet_id`: whether it was a delivery of ours, and
    /// its broker delivery tag to ack. When `accepted` its id now waits
    /// for PUBCOMP (the caller sends PUBREL).
    pub fn received(&self, packet_id: u16, accepted: bool) -> Option<Option<u64>> {
        let mut f = self.inflight.lock();
        let tag = f.by_packet_id.remove(&packet_id)?;
        if accepted {
            f.awaiting_comp.insert(packet_id);
        }
        Some((tag != NO_TAG).then_some(tag))
    }

    /// A PUBCOMP for `packet_id`: whether it was awaited, and whether
    /// queues held deliveries back for want of room (resume them).
    pub fn completed(&self, packet_id: u16) -> (bool, bool) {
        let mut f = self.inflight.lock();
        let was_full = f.awaiting_comp.len() >= limits::MQTT_DELIVERIES_UNCOMPLETED_MAX;
        (f.awaiting_comp.remove(&packet_id), was_full)
    }

    /// The QoS 2 ids awaiting PUBCOMP (kept with a persistent session).
    pub fn take_awaiting_comp(&self) -> HashSet<u16> {
        std::mem::take(&mut self.inflight.lock().awaiting_comp)
    }

    /// A resumed session's QoS 2 ids awaiting PUBCOMP: their PUBRELs go
    /// again (MQTT §4.4).
    pub fn resume_awaiting_comp(&self, ids: HashSet<u16>) {
        for id in &ids {
            let rel = PubRelPacket::new(*id);
            self.push(|b| {
                if let Err(e) = codec::encode(&rel, b) {
                    tracing::error!(error = %e, "could not encode a PUBREL");
                }
            });
        }
        self.inflight.lock().awaiting_comp.extend(ids);
    }

    /// Sets whether the v5 subscription `filter` has retain-as-published.
    pub fn set_retain_as_published(&self, filter: &str, on: bool) {
        let mut f = self.inflight.lock();
        f.retain_as_published.retain(|x| x != filter);
        if on {
            f.retain_as_published.push(filter.to_owned());
        }
    }

    /// Sends a retained message to a new subscription at `qos` (the
    /// lower of the subscription's and the publisher's), retain flag set.
    pub fn send_retained(&self, r: &Retained, granted_qos: u8) {
        let props = berth_protocol::codec::decode_properties(&r.properties).ok();
        let qos = published(props.as_ref(), false, granted_qos).0;
        let Some(mut p) = self.publish_packet(&r.topic, &r.body, qos, props.as_ref()) else {
            return;
        };
        p = p.with_retain(true);
        if qos > 0 {
            p = p.with_packet_id(self.packet_id_for(NO_TAG));
        }
        self.push(|b| {
            if let Err(e) = codec::encode(&p, b) {
                tracing::error!(error = %e, "could not encode an MQTT PUBLISH");
            }
        });
    }

    /// A PUBLISH of `body` to topic `name` at `qos` (with the 5.0
    /// properties `props` give), or `None` if it is larger than the client
    /// accepts (v5 maximum packet size).
    fn publish_packet(
        &self,
        name: &str,
        body: &Bytes,
        qos: u8,
        props: Option<&AMQPProperties>,
    ) -> Option<PublishPacket> {
        let p = if self.version == 5 {
            let mut p = PublishPacket::new(name, body.clone(), QoS::from(qos));
            if let Some(props) = props {
                super::properties::to_mqtt(props, &mut p.properties);
            }
            p
        } else {
            PublishPacket::new_v311(name, body.clone(), QoS::from(qos))
        };
        // Packet size: body, topic, properties and a fixed header's worth.
        let size = body.len() + name.len() + p.properties.encoded_len() + 16;
        if size > self.client_packet_bytes_max {
            tracing::debug!(
                size,
                max = self.client_packet_bytes_max,
                "MQTT delivery above the client's maximum packet size dropped"
            );
            return None;
        }
        Some(p)
    }

    /// Deliveries to ack now (see [`Inflight::settle_now`]).
    pub fn take_settle_now(&self) -> Vec<u64> {
        std::mem::take(&mut self.inflight.lock().settle_now)
    }

    pub fn was_cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A free packet id for a QoS 1 or 2 delivery of `tag`. The ids in
    /// use are bounded (prefetch, `MQTT_DELIVERIES_UNCOMPLETED_MAX` and
    /// the retained messages of one SUBSCRIBE) far below 65,535.
    fn packet_id_for(&self, tag: u64) -> u16 {
        let mut f = self.inflight.lock();
        loop {
            f.last_packet_id = f.last_packet_id.checked_add(1).unwrap_or(1);
            let id = f.last_packet_id;
            if f.awaiting_comp.contains(&id) {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(free) = f.by_packet_id.entry(id) {
                free.insert(tag);
                return id;
            }
        }
    }

    /// Whether a message published with the retain flag keeps it when
    /// delivered on topic `name` (v5 retain-as-published).
    fn retains_as_published(&self, name: &str) -> bool {
        let f = self.inflight.lock();
        f.retain_as_published
            .iter()
            .any(|filter| topic::matches(filter, name))
    }

    fn settle_later(&self, tag: u64) {
        self.inflight.lock().settle_now.push(tag);
        self.wake_connection.notify_one();
    }
}

/// The QoS a message was published with, at most `max`, and whether it
/// had the MQTT retain flag: the MQTT publisher's (headers), or for an
/// AMQP publisher QoS 1 if persistent, else 0 (RabbitMQ's rule).
fn published(props: Option<&AMQPProperties>, persistent: bool, max: u8) -> (u8, bool) {
    let headers = props.and_then(|p| p.headers().clone()).unwrap_or_default();
    let h = headers.inner();
    let qos = match h.get(HEADER_PUBLISH_QOS) {
        Some(AMQPValue::ShortShortUInt(q)) => *q,
        Some(AMQPValue::ShortShortInt(q)) => u8::try_from((*q).clamp(0, 2)).unwrap_or(0),
        Some(AMQPValue::LongInt(q)) => u8::try_from((*q).clamp(0, 2)).unwrap_or(0),
        _ => u8::from(persistent),
    };
    let retained = matches!(h.get(HEADER_RETAIN), Some(AMQPValue::Boolean(true)));
    (qos.min(max), retained)
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
        let subscribed_qos = TAGS.iter().position(|t| *t == consumer_tag).unwrap_or(0);
        let acked_by_client = subscribed_qos > 0;
        let props = berth_protocol::codec::decode_properties(&msg.properties).ok();
        let (qos, retained) = published(
            props.as_ref(),
            msg.persistent,
            u8::try_from(subscribed_qos).unwrap_or(0),
        );
        let name = topic::topic_name(&msg.routing_key);
        let Some(mut p) = self.publish_packet(&name, &msg.body, qos, props.as_ref()) else {
            if acked_by_client {
                self.settle_later(delivery_tag);
            }
            return;
        };
        if self.version == 5 && retained && self.retains_as_published(&name) {
            p = p.with_retain(true);
        }
        if qos > 0 {
            p = p
                .with_packet_id(self.packet_id_for(delivery_tag))
                .with_dup(redelivered);
        } else if acked_by_client {
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
            || self.inflight.lock().awaiting_comp.len() >= limits::MQTT_DELIVERIES_UNCOMPLETED_MAX
    }
}
