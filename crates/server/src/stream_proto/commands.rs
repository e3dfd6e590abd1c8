//! What an open connection's commands do: create and delete a stream,
//! metadata, publishers and publishing, subscriptions and credit, stored
//! offsets; and what is refused (RabbitMQ's response codes).
//!
//! Invariants:
//! - Every command is authorised as RabbitMQ's stream plugin authorises
//!   it, with berth's permissions (`crate::permissions`): configure on
//!   the stream to create or delete it, write to publish, read to
//!   subscribe or store and query offsets.
//! - Only streams (`x-queue-type: stream`) are streams here: another
//!   queue of that name is "stream does not exist".
//! - A request berth does not serve is answered with its response key
//!   and `UNKNOWN_FRAME` (0x0d), never silence.

use std::sync::Arc;

use berth_broker::access::{Perm, Resource};
use berth_broker::channel::Channel;
use berth_broker::message::Message;
use berth_broker::queue::Queue;
use berth_broker::vhost::QueueDeclare;
use berth_broker::AmqpError;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPValue, FieldTable};

use super::connection::{name, Conn, End};
use super::frame::{self, code, key, Frame, OffsetSpec, Published, Request};
use super::publish::{Due, Publisher};
use crate::limits;
use crate::permissions::{authorise, Action};

/// A broker error as a stream response code.
fn code_of(e: &AmqpError) -> u16 {
    match e.reply_code {
        berth_protocol::reply::ACCESS_REFUSED => code::ACCESS_REFUSED,
        berth_protocol::reply::NOT_FOUND => code::STREAM_DOES_NOT_EXIST,
        berth_protocol::reply::PRECONDITION_FAILED => code::PRECONDITION_FAILED,
        _ => code::INTERNAL_ERROR,
    }
}

/// RabbitMQ's stream arguments (Create) as queue arguments.
fn queue_arguments(args: &[(String, String)]) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    for (k, v) in args {
        let int = || {
            v.parse::<i64>()
                .map(AMQPValue::LongLongInt)
                .map_err(|_| format!("argument {k} is not an integer: {v}"))
        };
        match k.as_str() {
            "max-length-bytes" => {
                t.insert("x-max-length-bytes".into(), int()?);
            }
            "stream-max-segment-size-bytes" => {
                t.insert("x-stream-max-segment-size-bytes".into(), int()?);
            }
            "max-age" => {
                t.insert("x-max-age".into(), AMQPValue::LongString(v.as_str().into()));
            }
            // Placement on a cluster's members: one node serves a stream
            // in berth, so these change nothing (as on a single
            // RabbitMQ node).
            "queue-leader-locator" | "initial-cluster-size" => {}
            other => return Err(format!("unknown stream argument {other}")),
        }
    }
    Ok(t)
}

impl Conn {
    fn vhost(&self) -> &Arc<berth_broker::vhost::VHost> {
        self.vhost.as_ref().expect("open connections have a vhost")
    }

    fn may(&self, stream: &str, perm: Perm) -> Result<(), u16> {
        authorise(
            self.shared.broker.access(),
            &self.user,
            self.vhost(),
            Action::On(Resource::Queue(stream), perm),
        )
        .map_err(|e| {
            tracing::info!(peer = %self.peer, user = %self.user, "stream command refused: {}", e.reply_text());
            code::ACCESS_REFUSED
        })
    }

    /// The stream named `name`, if there is one.
    fn stream(&self, name: &str) -> Option<Arc<Queue>> {
        self.vhost().find_queue(name).filter(|q| q.is_stream())
    }

    fn reply(&self, k: u16, corr: u32, c: u16) {
        self.out.push(|b| frame::put_response(b, k, corr, c));
    }

    /// Acts on a command of an open connection.
    pub(super) fn command(&mut self, r: Request) -> Result<(), End> {
        match r {
            Request::Create {
                corr,
                stream,
                arguments,
            } => {
                let c = self.create(&stream, &arguments);
                self.reply(key::CREATE, corr, c);
            }
            Request::Delete { corr, stream } => {
                let c = self.delete(&stream);
                self.reply(key::DELETE, corr, c);
            }
            Request::Metadata { corr, streams } => self.metadata(corr, &streams),
            Request::DeclarePublisher {
                corr,
                publisher_id,
                reference,
                stream,
            } => {
                let c = self.declare_publisher(publisher_id, reference, &stream);
                self.reply(key::DECLARE_PUBLISHER, corr, c);
            }
            Request::DeletePublisher { corr, publisher_id } => {
                let c = if self.publishers.remove(&publisher_id).is_some() {
                    code::OK
                } else {
                    code::PUBLISHER_DOES_NOT_EXIST
                };
                self.reply(key::DELETE_PUBLISHER, corr, c);
            }
            Request::Publish {
                publisher_id,
                messages,
            } => self.publish(publisher_id, messages),
            Request::QueryPublisherSequence {
                corr,
                reference,
                stream,
            } => {
                let (c, seq) = match self.stream(&stream) {
                    None => (code::STREAM_DOES_NOT_EXIST, 0),
                    Some(_) => {
                        let v = &self.vhost().name;
                        let seq = self.tracking.publisher_sequence(v, &stream, &reference);
                        (code::OK, seq.unwrap_or(0))
                    }
                };
                self.out.push(|b| {
                    let mut f = Frame::response(b, key::QUERY_PUBLISHER_SEQUENCE, corr, c);
                    f.u64(seq);
                    f.finish();
                });
            }
            Request::Subscribe {
                corr,
                subscription_id,
                stream,
                offset,
                credit,
                properties,
            } => self.subscribe(corr, subscription_id, &stream, offset, credit, &properties),
            Request::Credit {
                subscription_id,
                credit,
            } => {
                if !self.out.add_credit(subscription_id, credit) {
                    self.out.push(|b| {
                        let mut f = Frame::begin(b, key::CREDIT | key::RESPONSE, 1);
                        f.u16(code::SUBSCRIPTION_ID_DOES_NOT_EXIST)
                            .u8(subscription_id);
                        f.finish();
                    });
                }
            }
            Request::Unsubscribe {
                corr,
                subscription_id,
            } => {
                let c = match self.subscriptions.remove(&subscription_id) {
                    Some(ch) => {
                        self.out.unsubscribe(subscription_id);
                        ch.close(self.shared.broker.now());
                        code::OK
                    }
                    None => code::SUBSCRIPTION_ID_DOES_NOT_EXIST,
                };
                self.reply(key::UNSUBSCRIBE, corr, c);
            }
            Request::StoreOffset {
                reference,
                stream,
                offset,
            } => {
                // No response (PROTOCOL.adoc); a refusal is only logged,
                // as RabbitMQ does.
                if self.stream(&stream).is_none() {
                    tracing::debug!(peer = %self.peer, %stream, "StoreOffset for a stream that does not exist");
                } else if self.may(&stream, Perm::Read).is_ok() {
                    let v = self.vhost().name.clone();
                    self.tracking.store_offset(&v, &stream, &reference, offset);
                }
            }
            Request::QueryOffset {
                corr,
                reference,
                stream,
            } => {
                let (c, offset) = if self.stream(&stream).is_none() {
                    (code::STREAM_DOES_NOT_EXIST, 0)
                } else if let Err(c) = self.may(&stream, Perm::Read) {
                    (c, 0)
                } else {
                    match self
                        .tracking
                        .offset(&self.vhost().name, &stream, &reference)
                    {
                        Some(o) => (code::OK, o),
                        None => (code::NO_OFFSET, 0),
                    }
                };
                self.out.push(|b| {
                    let mut f = Frame::response(b, key::QUERY_OFFSET, corr, c);
                    f.u64(offset);
                    f.finish();
                });
            }
            Request::ExchangeCommandVersions { corr } => {
                // Version 1 of every command berth serves (no publish v2
                // filter values, no deliver v2 committed offset).
                let served = [
                    key::DECLARE_PUBLISHER,
                    key::PUBLISH,
                    key::QUERY_PUBLISHER_SEQUENCE,
                    key::DELETE_PUBLISHER,
                    key::SUBSCRIBE,
                    key::DELIVER,
                    key::CREDIT,
                    key::STORE_OFFSET,
                    key::QUERY_OFFSET,
                    key::UNSUBSCRIBE,
                    key::CREATE,
                    key::DELETE,
                    key::METADATA,
                    key::PEER_PROPERTIES,
                    key::SASL_HANDSHAKE,
                    key::SASL_AUTHENTICATE,
                    key::TUNE,
                    key::OPEN,
                    key::CLOSE,
                    key::HEARTBEAT,
                    key::EXCHANGE_COMMAND_VERSIONS,
                ];
                self.out.push(|b| {
                    let mut f = Frame::response(b, key::EXCHANGE_COMMAND_VERSIONS, corr, code::OK);
                    f.u32(served.len() as u32);
                    for k in served {
                        f.u16(k).u16(1).u16(1);
                    }
                    f.finish();
                });
            }
            Request::Unsupported { key: k, corr, .. } => {
                tracing::debug!(peer = %self.peer, key = k, "an unsupported stream command was answered UNKNOWN_FRAME");
                self.out.push(|b| {
                    let mut f = Frame::response(b, k, corr, code::UNKNOWN_FRAME);
                    // The fields a client reads after the code, empty.
                    match k {
                        key::ROUTE | key::PARTITIONS | key::STREAM_STATS => {
                            f.u32(0);
                        }
                        key::RESOLVE_OFFSET_SPEC => {
                            f.u16(0).u64(0);
                        }
                        _ => {}
                    }
                    f.finish();
                });
            }
            other => {
                return Err(End::Refuse(
                    code::UNKNOWN_FRAME,
                    format!("{} after Open", name(&other)),
                ))
            }
        }
        Ok(())
    }

    fn create(&self, stream: &str, args: &[(String, String)]) -> u16 {
        if self.vhost().find_queue(stream).is_some() {
            return code::STREAM_ALREADY_EXISTS;
        }
        let arguments = match queue_arguments(args) {
            Ok(a) => a,
            Err(why) => {
                tracing::info!(peer = %self.peer, %stream, "stream not created: {why}");
                return code::PRECONDITION_FAILED;
            }
        };
        let authorise = |q: &str| {
            authorise(
                self.shared.broker.access(),
                &self.user,
                self.vhost(),
                Action::DeclareQueue {
                    name: q,
                    dead_letter_exchange: None,
                },
            )
        };
        let d = QueueDeclare {
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments,
        };
        let now = self.shared.broker.now();
        match (self.vhost()).declare_queue_authorised(self.id, stream, &d, now, &authorise) {
            Ok(_) => code::OK,
            Err(e) => {
                tracing::info!(peer = %self.peer, %stream, "stream not created: {}", e.reply_text());
                code_of(&e)
            }
        }
    }

    fn delete(&self, stream: &str) -> u16 {
        if self.stream(stream).is_none() {
            return code::STREAM_DOES_NOT_EXIST;
        }
        if let Err(c) = self.may(stream, Perm::Configure) {
            return c;
        }
        match self.vhost().delete_queue(self.id, stream, false, false) {
            Ok(_) => {
                self.tracking.forget_stream(&self.vhost().name, stream);
                code::OK
            }
            Err(e) => code_of(&e),
        }
    }

    /// Metadata: this node leads every stream it has (no replicas a
    /// client could read from), at the address the client reached.
    fn metadata(&self, corr: u32, streams: &[String]) {
        let host = self.local.ip().to_string();
        let port = u32::from(self.local.port());
        let found: Vec<(String, bool)> = streams
            .iter()
            .map(|s| (s.clone(), self.stream(s).is_some()))
            .collect();
        self.out.push(|b| {
            let mut f = Frame::begin(b, key::METADATA | key::RESPONSE, 1);
            f.u32(corr);
            f.u32(1).u16(0).string(&host).u32(port);
            f.u32(found.len() as u32);
            for (name, exists) in &found {
                f.string(name);
                if *exists {
                    f.u16(code::OK).u16(0).u32(0);
                } else {
                    f.u16(code::STREAM_DOES_NOT_EXIST).u16(u16::MAX).u32(0);
                }
            }
            f.finish();
        });
    }

    fn declare_publisher(&mut self, id: u8, reference: Option<String>, stream: &str) -> u16 {
        if self.publishers.contains_key(&id) {
            return code::PRECONDITION_FAILED;
        }
        if self.stream(stream).is_none() {
            return code::STREAM_DOES_NOT_EXIST;
        }
        if let Err(c) = self.may(stream, Perm::Write) {
            return c;
        }
        if let Some(r) = &reference {
            let taken = self
                .publishers
                .values()
                .any(|p| p.stream == stream && p.reference.as_ref() == Some(r));
            if taken || r.len() > 256 {
                return code::PRECONDITION_FAILED;
            }
        }
        let last_id = reference
            .as_ref()
            .and_then(|r| (self.tracking).publisher_sequence(&self.vhost().name, stream, r));
        self.publishers.insert(
            id,
            Publisher {
                stream: stream.to_owned(),
                reference,
                last_id,
            },
        );
        code::OK
    }

    /// A Publish frame: each message stored (or recognised as a
    /// duplicate) and owed its confirm.
    fn publish(&mut self, publisher_id: u8, messages: Vec<Published>) {
        let Some(p) = self.publishers.get(&publisher_id) else {
            for m in &messages {
                self.confirms.owe(
                    Due {
                        publisher_id,
                        publishing_id: m.publishing_id,
                        error: Some(code::PUBLISHER_DOES_NOT_EXIST),
                    },
                    0,
                );
            }
            self.send_due_confirms();
            return;
        };
        let (stream, named) = (p.stream.clone(), p.reference.is_some());
        let mut last_id = p.last_id;
        self.has_published = true;
        let ch = Arc::clone(self.publish_ch.as_ref().expect("open connections publish"));
        let now = self.shared.broker.now();
        for m in messages {
            if named && last_id.is_some_and(|l| m.publishing_id <= l) {
                // Deduplicated: stored before, confirmed again.
                self.confirms.owe(
                    Due {
                        publisher_id,
                        publishing_id: m.publishing_id,
                        error: None,
                    },
                    0,
                );
                continue;
            }
            last_id = Some(last_id.map_or(m.publishing_id, |l| l.max(m.publishing_id)));
            let error = self.publish_one(&ch, &stream, publisher_id, m, now);
            if let Some((id, c)) = error {
                self.confirms.owe(
                    Due {
                        publisher_id,
                        publishing_id: id,
                        error: Some(c),
                    },
                    0,
                );
            }
        }
        if let Some(p) = self.publishers.get_mut(&publisher_id) {
            p.last_id = last_id;
        }
        self.send_due_confirms();
    }

    /// Routes one message to its stream; `Some` is its error.
    fn publish_one(
        &mut self,
        ch: &Arc<Channel>,
        stream: &str,
        publisher_id: u8,
        m: Published,
        now: std::time::Instant,
    ) -> Option<(u64, u16)> {
        let (props, body) = super::message::to_broker(&m.message);
        let msg = match Message::published(
            String::new(),
            stream.to_owned(),
            encode_properties(&props),
            body,
            &self.user,
        ) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::debug!(error = %e.reply_text(), "a stream message was refused");
                return Some((m.publishing_id, code::PRECONDITION_FAILED));
            }
        };
        let seq = self.confirms.next_seq();
        let mut waits = 0;
        let routed = {
            let mut done = self.confirms.completion(seq, &mut waits);
            ch.publish("", msg, false, now, &mut done)
        };
        let error = match routed {
            Ok(Some(r)) if r.result.unroutable() => Some(code::STREAM_DOES_NOT_EXIST),
            Ok(_) => None,
            Err(e) => Some(code_of(&e)),
        };
        self.confirms.owe(
            Due {
                publisher_id,
                publishing_id: m.publishing_id,
                error,
            },
            waits,
        );
        None
    }

    fn subscribe(
        &mut self,
        corr: u32,
        id: u8,
        stream: &str,
        offset: OffsetSpec,
        credit: u16,
        properties: &[(String, String)],
    ) {
        let c = self.try_subscribe(id, stream, offset, properties);
        self.reply(key::SUBSCRIBE, corr, c);
        if c == code::OK {
            // After the response: chunks follow it.
            self.out.add_credit(id, credit);
        }
    }

    fn try_subscribe(
        &mut self,
        id: u8,
        stream: &str,
        offset: OffsetSpec,
        properties: &[(String, String)],
    ) -> u16 {
        if self.subscriptions.contains_key(&id) {
            return code::SUBSCRIPTION_ID_ALREADY_EXISTS;
        }
        let Some(q) = self.stream(stream) else {
            return code::STREAM_DOES_NOT_EXIST;
        };
        if let Err(c) = self.may(stream, Perm::Read) {
            return c;
        }
        if properties
            .iter()
            .any(|(k, v)| k == "single-active-consumer" && v == "true")
        {
            tracing::info!(peer = %self.peer, %stream, "subscription refused: single active consumer is not supported yet");
            return code::PRECONDITION_FAILED;
        }
        let start = match offset {
            OffsetSpec::First => AMQPValue::LongString("first".into()),
            OffsetSpec::Last => AMQPValue::LongString("last".into()),
            OffsetSpec::Next => AMQPValue::LongString("next".into()),
            OffsetSpec::Offset(o) => AMQPValue::LongLongInt(i64::try_from(o).unwrap_or(i64::MAX)),
            // The broker seeks by seconds: a timestamp starts at its
            // second (a few earlier messages may come, never a later one
            // missed).
            OffsetSpec::TimestampMs(ms) => {
                AMQPValue::Timestamp(u64::try_from(ms.max(0) / 1000).unwrap_or(0))
            }
        };
        let mut args = FieldTable::default();
        args.insert("x-stream-offset".into(), start);
        let session = Arc::clone(
            self.session
                .as_ref()
                .expect("open connections have a session"),
        );
        let ch = Channel::new(u16::from(id) + 1, session);
        let now = self.shared.broker.now();
        ch.qos(limits::STREAM_PROTO_DELIVERIES_PENDING_MAX, false, now);
        self.out.subscribe(id, stream);
        let tag = super::outlet::consumer_tag(id);
        match ch.consume_with(q, &tag, false, false, &args, now, |_| {}) {
            Ok(_) => {
                self.subscriptions.insert(id, ch);
                code::OK
            }
            Err(e) => {
                self.out.unsubscribe(id);
                ch.close(now);
                tracing::info!(peer = %self.peer, %stream, "subscription refused: {}", e.reply_text());
                code_of(&e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_stream_arguments_become_queue_arguments() {
        let args = [
            ("max-length-bytes".to_owned(), "1000".to_owned()),
            ("max-age".to_owned(), "1h".to_owned()),
            ("initial-cluster-size".to_owned(), "3".to_owned()),
        ];
        let t = queue_arguments(&args).unwrap();
        assert_eq!(
            t.inner().get("x-max-length-bytes"),
            Some(&AMQPValue::LongLongInt(1000))
        );
        assert!(queue_arguments(&[("max-length-bytes".into(), "lots".into())]).is_err());
        assert!(queue_arguments(&[("x-whatever".into(), "1".into())]).is_err());
    }
}
