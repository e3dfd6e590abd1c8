//! Retained messages: the last retained PUBLISH of each topic, kept per
//! vhost and sent (with the retain flag) to every new subscription whose
//! filter matches its topic (MQTT 3.1.1 §3.3.1.3, 5.0 §3.3.1.3).
//!
//! They are kept durably in the store through the broker's own means, so
//! they survive a restart and `kill -9` and are replicated in a cluster as
//! any queue is: each vhost has one durable queue, [`QUEUE`], holding a
//! copy of every retained PUBLISH (its topic in the header
//! [`HEADER_TOPIC`]). The store consumes that queue itself, without ever
//! acking what it holds: every message stays delivered and unacked, and
//! its copy here is the map of topic to message. A newer message of a
//! topic acks the older one (a Remove record in the journal), and a
//! retained PUBLISH with an empty payload acks both itself and the older
//! one: it clears the topic. After a restart the queue delivers what it
//! holds again, in queue order, and the map is rebuilt; a topic found
//! twice (a crash between the new one's write and the old one's ack) keeps
//! the later.
//!
//! Invariants:
//! - A topic maps to at most one message; every message of the queue not
//!   in the map is acked (settled by [`Store::settle`], outside the
//!   channel lock, as an `Outlet` must).
//! - The set is bounded: `MQTT_RETAINED_MESSAGES_MAX` topics and
//!   `MQTT_RETAINED_BYTES_MAX` bytes of payload per vhost; a retained
//!   PUBLISH beyond them is not retained (v5 QoS 1 and 2: refused with
//!   0x97 quota exceeded before it is routed).
//! - The queue is the store's alone: a message an AMQP client put there
//!   without the topic header is acked away; if an operator deletes the
//!   queue, the vhost's retained messages are gone and the next retained
//!   PUBLISH declares it again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use berth_broker::channel::{Channel, Outlet, Session as BrokerSession};
use berth_broker::durable::Done;
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::AmqpResult;
use berth_protocol::{AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

use super::topic;
use crate::limits;

/// The durable queue of a vhost's retained messages.
pub const QUEUE: &str = "mqtt-retained";

/// The header carrying a retained message's MQTT topic name.
pub const HEADER_TOPIC: &str = "x-mqtt-retained-topic";

/// The connection id of every retained store's channel: the shared
/// counter starts at 1 and never reaches it, and the queue is durable
/// and not exclusive, so no connection's exclusive queue is touched.
const CONNECTION_ID: u64 = u64::MAX;

/// One retained message.
pub struct Retained {
    pub topic: String,
    /// The AMQP properties it was stored with (QoS, content type, ...).
    pub properties: Bytes,
    pub body: Bytes,
    /// Its delivery tag on the store's channel (acked when replaced).
    tag: u64,
}

#[derive(Default)]
struct Kept {
    by_topic: HashMap<String, Arc<Retained>>,
    body_bytes: usize,
    /// Delivery tags to ack: replaced, cleared, or not ours.
    to_ack: Vec<u64>,
}

/// The store's side of its channel: what the retained queue delivers.
#[derive(Default)]
struct Keeper {
    kept: Mutex<Kept>,
    /// The queue was deleted under the store.
    cancelled: AtomicBool,
}

/// The topic a stored copy names, if it is one of ours.
fn topic_of(msg: &Message) -> Option<String> {
    let props = berth_protocol::codec::decode_properties(&msg.properties).ok()?;
    let headers: FieldTable = props.headers().clone()?;
    match headers.inner().get(HEADER_TOPIC)? {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        _ => None,
    }
}

impl Outlet for Keeper {
    fn deliver(&self, _: u16, _: &str, tag: u64, _: bool, msg: &Message) {
        let mut k = self.kept.lock();
        let Some(topic) = topic_of(msg).filter(|t| topic::routing_key(t).is_ok()) else {
            tracing::warn!(
                routing_key = %msg.routing_key,
                "a message without an MQTT topic in the retained queue is dropped"
            );
            k.to_ack.push(tag);
            return;
        };
        if let Some(old) = k.by_topic.remove(&topic) {
            k.body_bytes -= old.body.len();
            k.to_ack.push(old.tag);
        }
        if msg.body.is_empty() {
            // An empty retained message clears its topic (MQTT §3.3.1.3).
            k.to_ack.push(tag);
            return;
        }
        k.body_bytes += msg.body.len();
        let r = Retained {
            topic: topic.clone(),
            properties: msg.properties.clone(),
            body: msg.body.clone(),
            tag,
        };
        k.by_topic.insert(topic, Arc::new(r));
    }

    fn get_ok(&self, _: u16, _: u64, _: bool, _: &Message, _: u32) {}

    fn consumer_cancelled(&self, _: u16, _: &str) {
        self.cancelled.store(true, Ordering::Release);
    }

    fn is_congested(&self) -> bool {
        false
    }
}

/// One vhost's retained messages.
pub struct Store {
    ch: Arc<Channel>,
    keeper: Arc<Keeper>,
}

impl Store {
    /// Declares the vhost's retained queue (if missing) and consumes it:
    /// what it holds is delivered at once and becomes the map.
    fn open(vhost: &Arc<VHost>, user: &str, now: Instant) -> AmqpResult<Self> {
        let none = |_: &str| Ok(());
        vhost.declare_queue_authorised(
            CONNECTION_ID,
            QUEUE,
            &QueueDeclare {
                passive: false,
                durable: true,
                exclusive: false,
                auto_delete: false,
                arguments: FieldTable::default(),
            },
            now,
            &none,
        )?;
        let keeper = Arc::new(Keeper::default());
        let session = Arc::new(BrokerSession {
            connection_id: CONNECTION_ID,
            vhost: Arc::clone(vhost),
            outlet: Arc::clone(&keeper) as _,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: Arc::from(user),
            events: None,
        });
        let ch = Channel::new(1, session);
        let q = vhost.queue(CONNECTION_ID, QUEUE)?;
        ch.consume(q, "mqtt-retained-store", false, false, now, |_| {})?;
        let store = Self { ch, keeper };
        store.settle(now);
        Ok(store)
    }

    /// Acks what the map no longer holds.
    pub fn settle(&self, now: Instant) {
        let tags = std::mem::take(&mut self.keeper.kept.lock().to_ack);
        for tag in tags {
            if let Err(e) = self.ch.ack(tag, false, now) {
                tracing::warn!(tag, error = %e.reply_text(), "a replaced retained message was not acked");
            }
        }
    }

    /// Whether a retained message of `body_bytes` for `topic` fits the
    /// bounds (an empty one, which clears, always does).
    pub fn has_room(&self, topic: &str, body_bytes: usize) -> bool {
        if body_bytes == 0 {
            return true;
        }
        let k = self.keeper.kept.lock();
        let old = k.by_topic.get(topic).map(|r| r.body.len());
        let topics = k.by_topic.len() + usize::from(old.is_none());
        let bytes = k.body_bytes - old.unwrap_or(0) + body_bytes;
        topics <= limits::MQTT_RETAINED_MESSAGES_MAX && bytes <= limits::MQTT_RETAINED_BYTES_MAX
    }

    /// Keeps `copy` (a [`super::publish::retained_copy`]) as its topic's
    /// retained message; `durable` makes the completions of its journal
    /// write, as for any publish.
    pub fn retain(
        &self,
        copy: Arc<Message>,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
    ) -> AmqpResult<()> {
        self.ch.publish("", copy, false, now, durable)?;
        self.settle(now);
        Ok(())
    }

    /// The retained messages whose topic `filter` matches.
    pub fn matching(&self, filter: &str) -> Vec<Arc<Retained>> {
        let k = self.keeper.kept.lock();
        k.by_topic
            .values()
            .filter(|r| topic::matches(filter, &r.topic))
            .cloned()
            .collect()
    }

    /// How many topics have a retained message.
    pub fn len(&self) -> usize {
        self.keeper.kept.lock().by_topic.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The retained stores of all vhosts, opened on first use.
#[derive(Default)]
pub struct Stores {
    by_vhost: Mutex<HashMap<String, Arc<Store>>>,
}

impl Stores {
    /// The store of `vhost`, opened (and its queue read) if it is not
    /// yet, or again if its queue was deleted. `user` is the user that
    /// first needs it (named on the store's channel, for events).
    pub fn get(&self, vhost: &Arc<VHost>, user: &str, now: Instant) -> AmqpResult<Arc<Store>> {
        let mut by = self.by_vhost.lock();
        if let Some(s) = by.get(&vhost.name) {
            if !s.keeper.cancelled.load(Ordering::Acquire)
                && Arc::ptr_eq(&s.ch.session.vhost, vhost)
            {
                return Ok(Arc::clone(s));
            }
        }
        let s = Arc::new(Store::open(vhost, user, now)?);
        tracing::info!(vhost = %vhost.name, topics = s.len(), "MQTT retained messages loaded");
        by.insert(vhost.name.clone(), Arc::clone(&s));
        Ok(s)
    }
}
