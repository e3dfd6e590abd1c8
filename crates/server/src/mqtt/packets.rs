//! What a connected client's packets do: PUBLISH (routed to `amq.topic`,
//! and kept as its topic's retained message if it has the retain flag;
//! PUBACK or PUBREC after the store; a QoS 2 id routed once until its
//! PUBREL), PUBACK and PUBREC (ack a delivery; PUBREC is answered with
//! PUBREL), PUBCOMP (ends a QoS 2 delivery), SUBSCRIBE (the session's
//! bindings, then the matching retained messages) and UNSUBSCRIBE,
//! PINGREQ, DISCONNECT; and what is refused, with the reason code of the
//! client's version (3.1.1 has none after CONNACK: the connection is
//! closed).
//!
//! Invariants:
//! - Every publish and subscription is authorised as the AMQP equivalent
//!   would be (`crate::permissions`), before the broker changes.
//! - A packet the server never accepts from a client (CONNACK, SUBACK,
//!   a second CONNECT, ...) ends the connection with 0x82 (protocol
//!   error).

use std::sync::Arc;

use berth_broker::AmqpError;
use mqtt5_protocol::packet::puback::PubAckPacket;
use mqtt5_protocol::packet::pubcomp::PubCompPacket;
use mqtt5_protocol::packet::publish::PublishPacket;
use mqtt5_protocol::packet::pubrec::PubRecPacket;
use mqtt5_protocol::packet::pubrel::PubRelPacket;
use mqtt5_protocol::packet::suback::{SubAckPacket, SubAckReasonCode};
use mqtt5_protocol::packet::subscribe::SubscribePacket;
use mqtt5_protocol::packet::unsuback::{UnsubAckPacket, UnsubAckReasonCode};
use mqtt5_protocol::packet::unsubscribe::UnsubscribePacket;
use mqtt5_protocol::{Packet, QoS, ReasonCode};

use super::codec;
use super::connection::{Conn, End};
use super::publish::{self, AckKind, AckOwed, Outcome};
use super::retained::Store;
use super::{topic, EXCHANGE};
use crate::permissions::{authorise, Action};

/// The prefix of a v5 shared subscription's filter.
const SHARED_PREFIX: &str = "$share/";

impl Conn {
    /// Acts on one packet; `Err` ends the connection.
    pub(super) fn handle(&mut self, p: Packet) -> Result<(), End> {
        match p {
            Packet::Publish(p) => self.publish(&p),
            Packet::PubAck(a) => {
                if let Some(tag) = self.out.acked(a.packet_id) {
                    let now = self.shared.broker.now();
                    if let Err(e) = self.session.ch.ack(tag, false, now) {
                        tracing::debug!(error = %e.reply_text(), "MQTT PUBACK of a settled delivery");
                    }
                }
                Ok(())
            }
            Packet::PubRec(r) => {
                self.delivery_received(r.packet_id, u8::from(r.reason_code) < 0x80);
                Ok(())
            }
            Packet::PubComp(c) => {
                let (known, was_full) = self.out.completed(c.packet_id);
                if !known {
                    tracing::debug!(packet_id = c.packet_id, "MQTT PUBCOMP of no delivery");
                }
                if was_full {
                    self.session.ch.resume(self.shared.broker.now());
                }
                Ok(())
            }
            Packet::PubRel(r) => {
                // The second step of a QoS 2 publish: the message was
                // routed at its PUBLISH, its id is free again.
                let known = self.awaiting_release.remove(&r.packet_id);
                let comp = if known || self.version == 4 {
                    PubCompPacket::new(r.packet_id)
                } else {
                    PubCompPacket::new_with_reason(
                        r.packet_id,
                        ReasonCode::PacketIdentifierNotFound,
                    )
                };
                self.send(&comp);
                Ok(())
            }
            Packet::Subscribe(s) => {
                self.subscribe(&s);
                Ok(())
            }
            Packet::Unsubscribe(u) => {
                self.unsubscribe(&u);
                Ok(())
            }
            Packet::PingReq => {
                self.out.push(codec::encode_pingresp);
                Ok(())
            }
            Packet::Disconnect(d) => Err(End::Disconnect {
                with_will: d.reason_code == ReasonCode::DisconnectWithWillMessage,
            }),
            other => Err(End::Refuse(
                ReasonCode::ProtocolError,
                format!("a client does not send {}", other.packet_type_name()),
            )),
        }
    }

    /// Encodes `packet` to the client.
    fn send(&self, packet: &impl mqtt5_protocol::packet::MqttPacket) {
        self.out.push(|b| {
            if let Err(e) = codec::encode(packet, b) {
                tracing::error!(error = %e, "could not encode an MQTT packet");
            }
        });
    }

    /// A client's PUBLISH.
    fn publish(&mut self, p: &PublishPacket) -> Result<(), End> {
        let refuse = |code, why: String| Err(End::Refuse(code, why));
        let packet_id = p.packet_id.unwrap_or(0);
        if p.qos == QoS::ExactlyOnce && self.awaiting_release.contains(&packet_id) {
            // Sent again before our PUBREC reached the client: routed
            // once already; its PUBREC goes (again) once it is stored.
            if !self.acks.owes_pubrec(packet_id) {
                self.send(&PubRecPacket::new(packet_id));
            }
            return Ok(());
        }
        if p.qos == QoS::ExactlyOnce
            && self.awaiting_release.len() >= usize::from(crate::limits::MQTT_PUBLISHES_UNACKED_MAX)
        {
            return refuse(
                ReasonCode::ReceiveMaximumExceeded,
                "more QoS 2 publishes awaiting PUBREL than the receive maximum".into(),
            );
        }
        let aliased;
        let p = match p.properties.get_topic_alias() {
            None => p,
            Some(alias) => match self.resolve_alias(p, alias) {
                Ok(resolved) => {
                    aliased = resolved;
                    &aliased
                }
                Err(end) => return Err(end),
            },
        };
        if p.topic_name.starts_with('$') {
            tracing::debug!(peer = %self.peer, topic = %p.topic_name, "MQTT PUBLISH to a $ topic not routed");
            let kind = match p.qos {
                QoS::AtMostOnce => return Ok(()),
                QoS::AtLeastOnce => AckKind::PubAck,
                QoS::ExactlyOnce => AckKind::PubRec,
            };
            self.acks.owe(
                AckOwed {
                    packet_id,
                    kind,
                    outcome: Outcome::ServerTopic,
                },
                0,
            );
            return self.send_due_acks();
        }
        let key = match topic::routing_key(&p.topic_name) {
            Ok(k) => k,
            Err(e) => return refuse(ReasonCode::TopicNameInvalid, format!("topic name: {e}")),
        };
        let allowed = authorise(
            self.shared.broker.access(),
            &self.user,
            &self.session.vhost,
            Action::Publish {
                exchange: EXCHANGE,
                routing_key: &key,
            },
        );
        if let Err(e) = allowed {
            // v5 can refuse one QoS 1 message and go on; otherwise the
            // connection ends, as RabbitMQ's plugin ends it.
            if self.version == 5 && p.qos != QoS::AtMostOnce {
                tracing::info!(peer = %self.peer, "MQTT publish refused: {}", e.reply_text());
                let code = ReasonCode::NotAuthorized;
                if p.qos == QoS::AtLeastOnce {
                    self.send(&PubAckPacket::new_with_reason(packet_id, code));
                } else {
                    self.send(&PubRecPacket::new_with_reason(packet_id, code));
                }
                return Ok(());
            }
            return refuse(ReasonCode::NotAuthorized, e.reply_text());
        }
        let msg = match publish::message(p, key, &self.user) {
            Ok(m) => m,
            Err(e) => return refuse(ReasonCode::PayloadFormatInvalid, e.reply_text()),
        };
        let now = self.shared.broker.now();
        let retain = match p.retain {
            false => None,
            true => match self.retained_store(p, now) {
                Ok(r) => r,
                Err(refused) => {
                    // Over the retained bounds: a v5 QoS 1 or 2 publish is
                    // refused whole, before it is routed.
                    let code = ReasonCode::QuotaExceeded;
                    tracing::info!(peer = %self.peer, topic = %p.topic_name, "MQTT retained publish refused: {refused}");
                    if p.qos == QoS::AtLeastOnce {
                        self.send(&PubAckPacket::new_with_reason(packet_id, code));
                    } else {
                        self.send(&PubRecPacket::new_with_reason(packet_id, code));
                    }
                    return Ok(());
                }
            },
        };
        self.has_published = true;
        let ch = Arc::clone(&self.session.ch);
        if p.qos == QoS::AtMostOnce {
            let mut done = || -> berth_broker::durable::Done {
                Box::new(|r| {
                    if let Err(e) = r {
                        tracing::error!(error = %e, "an MQTT QoS 0 message could not be stored");
                    }
                })
            };
            if let Err(e) = ch.publish(EXCHANGE, msg, false, now, &mut done) {
                return refuse(ReasonCode::UnspecifiedError, e.reply_text());
            }
            if let Some((store, copy)) = retain {
                if let Err(e) = store.retain(copy, now, &mut done) {
                    return refuse(ReasonCode::UnspecifiedError, e.reply_text());
                }
            }
            return Ok(());
        }
        let seq = self.acks.next_seq();
        let mut waits = 0;
        let routed = {
            let mut done = self.acks.completion(seq, &mut waits);
            ch.publish(EXCHANGE, msg, false, now, &mut done)
                .and_then(|routed| match retain {
                    Some((store, copy)) => store.retain(copy, now, &mut done).map(|()| routed),
                    None => Ok(routed),
                })
        };
        let outcome = match routed {
            Ok(Some(r)) if r.result.rejected => Outcome::QuotaExceeded,
            Ok(Some(r)) if r.result.unroutable() => Outcome::NoMatchingSubscribers,
            Ok(_) => Outcome::Accepted,
            Err(e) => return refuse(ReasonCode::UnspecifiedError, e.reply_text()),
        };
        let kind = if p.qos == QoS::ExactlyOnce {
            self.awaiting_release.insert(packet_id);
            AckKind::PubRec
        } else {
            AckKind::PubAck
        };
        self.acks.owe(
            AckOwed {
                packet_id,
                kind,
                outcome,
            },
            waits,
        );
        self.send_due_acks()
    }

    /// A 5.0 PUBLISH with topic alias `alias` (MQTT 5.0 §3.3.2.3.4): a
    /// topic name sets the alias, an empty one uses it; the alias is
    /// taken off the PUBLISH. An alias of 0 or above the maximum told in
    /// CONNACK ends the connection with 0x94, an unknown one with 0x82.
    fn resolve_alias(&mut self, p: &PublishPacket, alias: u16) -> Result<PublishPacket, End> {
        if alias == 0 || alias > crate::limits::MQTT_TOPIC_ALIASES_MAX {
            return Err(End::Refuse(
                ReasonCode::TopicAliasInvalid,
                format!(
                    "topic alias {alias} is not within 1..={}",
                    crate::limits::MQTT_TOPIC_ALIASES_MAX
                ),
            ));
        }
        let mut resolved = p.clone();
        resolved.properties.remove_topic_alias();
        if p.topic_name.is_empty() {
            let Some(name) = self.topic_aliases.get(&alias) else {
                return Err(End::Refuse(
                    ReasonCode::ProtocolError,
                    format!("topic alias {alias} was never set"),
                ));
            };
            resolved.topic_name = name.clone();
        } else {
            self.topic_aliases.insert(alias, p.topic_name.clone());
        }
        Ok(resolved)
    }

    /// The retained store and the copy to keep of a retained PUBLISH;
    /// `None` if it is not kept (over the bounds, logged); `Err` if it
    /// is to be refused instead (over the bounds, v5 QoS 1 or 2).
    #[allow(clippy::type_complexity)]
    fn retained_store(
        &self,
        p: &PublishPacket,
        now: std::time::Instant,
    ) -> Result<Option<(Arc<Store>, Arc<berth_broker::message::Message>)>, String> {
        let kept = self
            .retained
            .get(&self.session.vhost, &self.user, now)
            .map_err(|e| format!("retained store: {}", e.reply_text()))
            .and_then(|store| {
                if store.has_room(&p.topic_name, p.payload.len()) {
                    let copy = publish::retained_copy(p, &self.user);
                    copy.map(|c| (store, c)).map_err(|e| e.reply_text())
                } else {
                    Err("the vhost's retained messages are at their limit (MQTT_RETAINED_MESSAGES_MAX, MQTT_RETAINED_BYTES_MAX)".into())
                }
            });
        match kept {
            Ok(k) => Ok(Some(k)),
            Err(why) if self.version == 5 && p.qos != QoS::AtMostOnce => Err(why),
            Err(why) => {
                tracing::warn!(peer = %self.peer, topic = %p.topic_name, "MQTT message routed but not retained: {why}");
                Ok(None)
            }
        }
    }

    /// The client's PUBREC of a QoS 2 delivery: the message is the
    /// client's now (acked in its queue), and PUBREL goes back; a v5
    /// refusal (reason >= 0x80) ends the exchange there.
    fn delivery_received(&mut self, packet_id: u16, accepted: bool) {
        let Some(tag) = self.out.received(packet_id, accepted) else {
            tracing::debug!(packet_id, "MQTT PUBREC of no delivery");
            if accepted {
                let code = ReasonCode::PacketIdentifierNotFound;
                match self.version {
                    5 => self.send(&PubRelPacket::new_with_reason(packet_id, code)),
                    _ => self.send(&PubRelPacket::new(packet_id)),
                }
            }
            return;
        };
        if let Some(tag) = tag {
            let now = self.shared.broker.now();
            if let Err(e) = self.session.ch.ack(tag, false, now) {
                tracing::debug!(error = %e.reply_text(), "MQTT PUBREC of a settled delivery");
            }
        }
        if accepted {
            self.send(&PubRelPacket::new(packet_id));
        }
    }

    /// Sends the PUBACKs that are due, in order.
    pub(super) fn send_due_acks(&mut self) -> Result<(), End> {
        for AckOwed {
            packet_id,
            kind,
            outcome,
        } in self.acks.due()
        {
            let code = match outcome {
                Outcome::Accepted => ReasonCode::Success,
                Outcome::NoMatchingSubscribers => ReasonCode::NoMatchingSubscribers,
                Outcome::ServerTopic if self.version == 4 => ReasonCode::Success,
                Outcome::ServerTopic => ReasonCode::TopicNameInvalid,
                Outcome::QuotaExceeded | Outcome::Failed(_) if self.version == 4 => {
                    // 3.1.1 has no negative PUBACK: never ack what was not
                    // stored; the client publishes again on its next
                    // connection.
                    return Err(End::Refuse(
                        ReasonCode::UnspecifiedError,
                        format!("publish {packet_id} not stored: {outcome:?}"),
                    ));
                }
                Outcome::QuotaExceeded => ReasonCode::QuotaExceeded,
                Outcome::Failed(why) => {
                    tracing::error!(peer = %self.peer, "MQTT publish not stored: {why}");
                    ReasonCode::UnspecifiedError
                }
            };
            let plain = code == ReasonCode::Success || self.version == 4;
            match kind {
                AckKind::PubAck if plain => self.send(&PubAckPacket::new(packet_id)),
                AckKind::PubAck => self.send(&PubAckPacket::new_with_reason(packet_id, code)),
                AckKind::PubRec => {
                    if u8::from(code) >= 0x80 {
                        // A refused QoS 2 publish ends its exchange here.
                        self.awaiting_release.remove(&packet_id);
                    }
                    if plain {
                        self.send(&PubRecPacket::new(packet_id));
                    } else {
                        self.send(&PubRecPacket::new_with_reason(packet_id, code));
                    }
                }
            }
        }
        Ok(())
    }

    /// A client's SUBSCRIBE: each filter granted the QoS asked for or
    /// refused with its own code; then the retained messages its filters
    /// match, as its retain handling (v5) says.
    fn subscribe(&mut self, s: &SubscribePacket) {
        let now = self.shared.broker.now();
        let v5 = self.version == 5;
        let with_id = s.properties.get_subscription_identifier().is_some();
        let mut codes = Vec::with_capacity(s.filters.len());
        // Filters granted whose retained messages follow the SUBACK.
        let mut send_retained = Vec::new();
        for f in &s.filters {
            let fail = |code| {
                if v5 {
                    code
                } else {
                    SubAckReasonCode::UnspecifiedError
                }
            };
            let code = if with_id {
                fail(SubAckReasonCode::SubscriptionIdentifiersNotSupported)
            } else if f.filter.starts_with(SHARED_PREFIX) {
                fail(SubAckReasonCode::SharedSubscriptionsNotSupported)
            } else if f.options.no_local {
                // No local needs to know who published: not carried yet.
                fail(SubAckReasonCode::ImplementationSpecificError)
            } else {
                match topic::binding_key(&f.filter) {
                    Err(_) => fail(SubAckReasonCode::TopicFilterInvalid),
                    Ok(key) => {
                        let qos = f.options.qos as u8;
                        let is_new = !self.session.is_subscribed(&key);
                        match self.session.subscribe(&key, qos, now) {
                            Ok(()) => {
                                let handling = f.options.retain_handling as u8;
                                if handling == 0 || (handling == 1 && is_new) {
                                    send_retained.push((f.filter.clone(), qos));
                                }
                                self.out.set_retain_as_published(
                                    &f.filter,
                                    v5 && f.options.retain_as_published,
                                );
                                match qos {
                                    0 => SubAckReasonCode::GrantedQoS0,
                                    1 => SubAckReasonCode::GrantedQoS1,
                                    _ => SubAckReasonCode::GrantedQoS2,
                                }
                            }
                            Err(e) => {
                                tracing::info!(peer = %self.peer, filter = %f.filter, "MQTT subscription refused: {}", e.reply_text());
                                fail(refusal(&e))
                            }
                        }
                    }
                }
            };
            codes.push(code);
        }
        let mut ack = if v5 {
            SubAckPacket::new(s.packet_id)
        } else {
            SubAckPacket::new_v311(s.packet_id)
        };
        ack.reason_codes = codes;
        self.send(&ack);
        if send_retained.is_empty() {
            return;
        }
        match self.retained.get(&self.session.vhost, &self.user, now) {
            Ok(store) => {
                for (filter, qos) in send_retained {
                    for r in store.matching(&filter) {
                        self.out.send_retained(&r, qos);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(peer = %self.peer, "MQTT retained messages not sent: {}", e.reply_text());
            }
        }
    }

    /// A client's UNSUBSCRIBE.
    fn unsubscribe(&mut self, u: &UnsubscribePacket) {
        let mut codes = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            self.out.set_retain_as_published(f, false);
            let code = match topic::binding_key(f) {
                Err(_) => UnsubAckReasonCode::TopicFilterInvalid,
                Ok(key) => match self.session.unsubscribe(&key) {
                    Ok(true) => UnsubAckReasonCode::Success,
                    Ok(false) => UnsubAckReasonCode::NoSubscriptionExisted,
                    Err(e) if e.reply_code == berth_protocol::reply::ACCESS_REFUSED => {
                        UnsubAckReasonCode::NotAuthorized
                    }
                    Err(_) => UnsubAckReasonCode::UnspecifiedError,
                },
            };
            codes.push(code);
        }
        let mut ack = if self.version == 5 {
            UnsubAckPacket::new(u.packet_id)
        } else {
            UnsubAckPacket::new_v311(u.packet_id)
        };
        ack.reason_codes = codes;
        self.send(&ack);
    }
}

/// The SUBACK code of a broker refusal.
fn refusal(e: &AmqpError) -> SubAckReasonCode {
    if e.reply_code == berth_protocol::reply::ACCESS_REFUSED {
        SubAckReasonCode::NotAuthorized
    } else if e.reply_code == berth_protocol::reply::RESOURCE_LOCKED {
        // A clean session's exclusive queue of another connection.
        SubAckReasonCode::ImplementationSpecificError
    } else {
        SubAckReasonCode::UnspecifiedError
    }
}
