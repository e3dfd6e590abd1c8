//! A client's PUBLISH as a broker message, and the PUBACKs (QoS 1) and
//! PUBRECs (QoS 2) owed: each is sent once every journal write its
//! message needed has completed (the AMQP publisher confirm's rule: after
//! fdatasync under `store.sync = always`), in the order the PUBLISHes
//! came (MQTT 3.1.1 §4.6, 5.0 §4.6).
//!
//! The message is what an AMQP publisher to `amq.topic` would have sent,
//! as RabbitMQ's plugin builds it: routing key from the topic
//! (`super::topic`), `delivery_mode = 2` for QoS 1 (so it is stored in a
//! durable queue), headers `x-mqtt-publish-qos` and `x-mqtt-dup`; from a
//! 5.0 PUBLISH also its properties (`super::properties`).
//!
//! Invariants:
//! - A PUBACK is never sent before an earlier PUBLISH's PUBACK, nor
//!   before its own message's journal writes completed; a failed write
//!   is never acknowledged as a success.
//! - The acks owed are bounded: the connection stops reading at
//!   `MQTT_UNACKED_PUBLISHES_MAX` (`crate::limits`).

use std::sync::Arc;

use berth_broker::message::Message;
use berth_broker::AmqpResult;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use mqtt5_protocol::packet::publish::PublishPacket;

use super::properties::{HEADER_PUBLISH_QOS, HEADER_RETAIN};
use crate::in_order::{InOrder, Owed};

/// The AMQP message of a PUBLISH whose topic maps to `routing_key`.
pub fn message(p: &PublishPacket, routing_key: String, user: &str) -> AmqpResult<Arc<Message>> {
    Message::published(
        super::EXCHANGE.to_owned(),
        routing_key,
        encode_properties(&properties(p, &[])),
        p.payload.clone(),
        user,
    )
}

/// The copy of a retained PUBLISH kept in the vhost's retained queue
/// (`super::retained`): the same properties, with its topic in a header.
pub fn retained_copy(p: &PublishPacket, user: &str) -> AmqpResult<Arc<Message>> {
    let topic = AMQPValue::LongString(p.topic_name.as_str().into());
    Message::published(
        String::new(),
        super::retained::QUEUE.to_owned(),
        encode_properties(&properties(p, &[(super::retained::HEADER_TOPIC, topic)])),
        p.payload.clone(),
        user,
    )
}

/// The AMQP properties of a PUBLISH, with `extra` headers.
fn properties(p: &PublishPacket, extra: &[(&str, AMQPValue)]) -> AMQPProperties {
    let qos = p.qos as u8;
    let mut headers = FieldTable::default();
    headers.insert(
        HEADER_PUBLISH_QOS.into(),
        AMQPValue::ShortShortInt(i8::try_from(qos).unwrap_or(1)),
    );
    headers.insert("x-mqtt-dup".into(), AMQPValue::Boolean(p.dup));
    if p.retain {
        headers.insert(HEADER_RETAIN.into(), AMQPValue::Boolean(true));
    }
    for (k, v) in extra {
        headers.insert((*k).into(), v.clone());
    }
    let mut props = AMQPProperties::default().with_delivery_mode(if qos >= 1 { 2 } else { 1 });
    if p.protocol_version == 5 {
        props = super::properties::to_amqp(&p.properties, props, &mut headers);
    }
    props.with_headers(headers)
}

pub use crate::in_order::Stored;

/// Which acknowledgement a publish is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// QoS 1.
    PubAck,
    /// QoS 2, first step (the PUBCOMP answers the client's PUBREL).
    PubRec,
}

/// What a QoS 1 publish's PUBACK (or QoS 2's PUBREC) will say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored (or needed no store) and routed to a queue.
    Accepted,
    /// No subscription matched (v5 reason 0x10; a success).
    NoMatchingSubscribers,
    /// A queue refused it (`x-overflow = reject-publish`; v5 0x97).
    QuotaExceeded,
    /// A journal write failed (v5 0x80; 3.1.1 closes the connection).
    Failed(String),
    /// A topic starting with `$`, which clients may not use to reach
    /// each other (MQTT 5.0 §4.7.2): not routed (v5 0x90; 3.1.1 acks it,
    /// as Mosquitto drops such a PUBLISH).
    ServerTopic,
}

/// What one QoS 1 or 2 PUBLISH is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOwed {
    pub packet_id: u16,
    pub kind: AckKind,
    pub outcome: Outcome,
}

impl Owed for AckOwed {
    fn failed(&mut self, why: String) {
        self.outcome = Outcome::Failed(why);
    }
}

/// PUBACKs (and PUBRECs) owed, in PUBLISH order.
pub type Acks = InOrder<AckOwed>;

impl InOrder<AckOwed> {
    /// Whether a QoS 2 publish with `packet_id` still waits for its PUBREC.
    pub fn owes_pubrec(&self, packet_id: u16) -> bool {
        self.iter()
            .any(|o| o.packet_id == packet_id && o.kind == AckKind::PubRec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pubacks_go_in_publish_order_and_only_after_their_writes() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut acks = Acks::new(tx);
        let mut dones = Vec::new();
        for packet_id in [10u16, 11] {
            let seq = acks.next_seq();
            let mut waits = 0;
            {
                let mut make = acks.completion(seq, &mut waits);
                dones.push(make());
            }
            acks.owe(
                AckOwed {
                    packet_id,
                    kind: AckKind::PubAck,
                    outcome: Outcome::Accepted,
                },
                waits,
            );
        }
        assert!(acks.due().is_empty(), "nothing stored yet");
        // The second write completes first: its PUBACK still waits.
        dones.pop().unwrap()(Ok(()));
        acks.stored(rx.try_recv().unwrap());
        assert!(acks.due().is_empty());
        dones.pop().unwrap()(Err(berth_broker::durable::JournalError::new("disk gone")));
        acks.stored(rx.try_recv().unwrap());
        let due = acks.due();
        assert_eq!(due.len(), 2);
        assert_eq!(due[0].packet_id, 10);
        assert!(
            matches!(due[0].outcome, Outcome::Failed(_)),
            "a failed write is no success"
        );
        assert_eq!(
            due[1],
            AckOwed {
                packet_id: 11,
                kind: AckKind::PubAck,
                outcome: Outcome::Accepted
            }
        );
    }
}
