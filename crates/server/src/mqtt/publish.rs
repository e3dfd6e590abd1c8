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

use std::collections::VecDeque;
use std::sync::Arc;

use berth_broker::durable::Done;
use berth_broker::message::Message;
use berth_broker::AmqpResult;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use mqtt5_protocol::packet::publish::PublishPacket;
use tokio::sync::mpsc::UnboundedSender;

use super::properties::{HEADER_PUBLISH_QOS, HEADER_RETAIN};

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

/// A journal write finished for the publish numbered `seq`.
pub struct Stored {
    pub seq: u64,
    pub result: Result<(), String>,
}

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

struct Owed {
    seq: u64,
    packet_id: u16,
    kind: AckKind,
    /// Journal writes still running.
    waits: usize,
    outcome: Outcome,
}

/// PUBACKs owed, in PUBLISH order.
pub struct Acks {
    next_seq: u64,
    owed: VecDeque<Owed>,
    tx: UnboundedSender<Stored>,
}

impl Acks {
    pub fn new(tx: UnboundedSender<Stored>) -> Self {
        Self {
            next_seq: 0,
            owed: VecDeque::new(),
            tx,
        }
    }

    /// How many PUBACKs are owed.
    pub fn len(&self) -> usize {
        self.owed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// The number the next publish will have.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The completion of one journal write of publish `seq`; `waits`
    /// counts them.
    pub fn completion<'a>(&self, seq: u64, waits: &'a mut usize) -> impl FnMut() -> Done + 'a {
        let tx = self.tx.clone();
        move || -> Done {
            *waits += 1;
            let tx = tx.clone();
            Box::new(move |r| {
                let _connection_may_be_gone = tx.send(Stored {
                    seq,
                    result: r.map_err(|e| e.to_string()),
                });
            })
        }
    }

    /// A QoS 1 or 2 publish was routed, with `waits` journal writes
    /// running.
    pub fn owe(&mut self, packet_id: u16, kind: AckKind, waits: usize, outcome: Outcome) {
        self.owed.push_back(Owed {
            seq: self.next_seq,
            packet_id,
            kind,
            waits,
            outcome,
        });
        self.next_seq += 1;
    }

    /// Whether a QoS 2 publish with `packet_id` still waits for its PUBREC.
    pub fn owes_pubrec(&self, packet_id: u16) -> bool {
        self.owed
            .iter()
            .any(|o| o.packet_id == packet_id && o.kind == AckKind::PubRec)
    }

    /// A journal write finished.
    pub fn stored(&mut self, s: Stored) {
        let Some(front) = self.owed.front().map(|o| o.seq) else {
            return;
        };
        let Some(o) = s
            .seq
            .checked_sub(front)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.owed.get_mut(i))
        else {
            return;
        };
        if o.seq != s.seq {
            tracing::error!(seq = s.seq, "a journal completion for a publish not owed");
            return;
        }
        o.waits = o.waits.saturating_sub(1);
        if let Err(e) = s.result {
            o.outcome = Outcome::Failed(e);
        }
    }

    /// The PUBACKs due now: from the front, while nothing is waited for.
    pub fn due(&mut self) -> Vec<(u16, AckKind, Outcome)> {
        let mut out = Vec::new();
        while self.owed.front().is_some_and(|o| o.waits == 0) {
            let o = self.owed.pop_front().expect("front exists");
            out.push((o.packet_id, o.kind, o.outcome));
        }
        out
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
            acks.owe(packet_id, AckKind::PubAck, waits, Outcome::Accepted);
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
        assert_eq!(due[0].0, 10);
        assert!(
            matches!(due[0].2, Outcome::Failed(_)),
            "a failed write is no success"
        );
        assert_eq!(due[1], (11, AckKind::PubAck, Outcome::Accepted));
    }
}
