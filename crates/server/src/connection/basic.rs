//! The `basic` class: publishing (the method, its content frames, the
//! routed message), consuming, `get`, acks and recovery.
//!
//! Invariants:
//! - A publish reaches the broker only once its content is complete (see
//!   `berth_protocol::content`); a refused message leaves nothing behind.
//! - An unroutable `mandatory` message goes back to the publisher as
//!   `basic.return` before any confirm of it.

use std::sync::Arc;

use berth_broker::access::{Perm, Resource};
use berth_broker::channel::Published;
use berth_broker::message::Message;
use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::codec::{self, CLASS_BASIC, METHOD_BASIC_PUBLISH, METHOD_BASIC_QOS};
use berth_protocol::content::AssembledMessage;
use berth_protocol::frame::Frame;
use berth_protocol::methods::basic;
use berth_protocol::reply::NO_ROUTE;
use berth_protocol::AMQPClass;

use super::exception::{content_error, not_from_client, End};
use super::{ChanState, Conn};

/// Refuses a non-zero `basic.qos` `prefetch-size` with 540, as RabbitMQ
/// does. The generated decoder drops the field, so it is read from the raw
/// payload.
pub(super) fn check_qos_prefetch_size(payload: &[u8]) -> Result<(), End> {
    let size = codec::qos_prefetch_size(payload).unwrap_or(0);
    if size != 0 {
        return Err(
            AmqpError::not_implemented(format!("prefetch_size!=0 ({size})"))
                .during(CLASS_BASIC, METHOD_BASIC_QOS)
                .into(),
        );
    }
    Ok(())
}

impl Conn {
    /// `basic.publish`: its content frames are expected next.
    pub(super) fn basic_publish(&mut self, channel: u16, p: codec::Publish) -> AmqpResult<()> {
        if p.immediate {
            return Err(AmqpError::not_implemented("immediate=true"));
        }
        self.authorise(crate::permissions::Action::Publish {
            exchange: &p.exchange,
            routing_key: &p.routing_key,
        })?;
        self.slot(channel).content.start(p).map_err(content_error)
    }

    /// A content header or body frame on a channel other than 0.
    pub(super) fn content_frame(&mut self, f: Frame) -> Result<(), End> {
        let channel = f.channel;
        let body_size_max = self.shared.config.limits.message_size_bytes_max;
        let Some(slot) = self.channels.get_mut(&channel) else {
            return Err(AmqpError::channel_error(format!(
                "expected 'channel.open' on channel {channel}"
            ))
            .into());
        };
        if matches!(slot.state, ChanState::Closing) {
            return Ok(());
        }
        let pushed = slot.content.push(f, body_size_max);
        slot.assembling.set(slot.content.buffered_bytes() as u64);
        match pushed {
            Ok(Some(message)) => {
                self.publish(channel, message);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => self.raise(channel, content_error(e)),
        }
    }

    /// Routes a complete message.
    fn publish(&mut self, channel: u16, m: AssembledMessage) {
        let now = Self::now();
        self.flow.has_published = true;
        let slot = self.slot(channel);
        let ch = Arc::clone(&slot.ch);
        let confirms = slot
            .confirms
            .as_ref()
            .map(|c| (Arc::clone(c), c.next_seq()));
        let seq = confirms.as_ref().map(|(_, seq)| *seq);
        let mut make_done = self.publish_completion(channel, confirms);
        let p = m.publish;
        let result = Message::published(
            p.exchange.clone(),
            p.routing_key,
            m.properties,
            m.body,
            &self.user,
        )
        .and_then(|msg| ch.publish(&p.exchange, msg, p.mandatory, now, &mut make_done));
        match result {
            Ok(Some(published)) => {
                self.after_publish(channel, &published, seq);
            }
            Ok(None) => {}
            Err(e) => {
                self.channel_exception(channel, e.during(CLASS_BASIC, METHOD_BASIC_PUBLISH));
            }
        }
    }

    /// Flow pause for a backlogged queue; `basic.return` for unroutable
    /// mandatory messages; confirm bookkeeping (acks are batched in
    /// `flush_confirms`).
    pub(super) fn after_publish(&mut self, channel: u16, p: &Published, seq: Option<u64>) {
        crate::stats::count_publish(p.result.queues, p.mandatory);
        self.flow.pause_for(p.result.backlogged.as_ref());
        if p.mandatory && p.result.unroutable() {
            let msg = &p.msg;
            self.out.push_content(
                |b| {
                    codec::encode_return(
                        b,
                        channel,
                        NO_ROUTE,
                        "NO_ROUTE",
                        &msg.exchange,
                        &msg.routing_key,
                    );
                },
                channel,
                &msg.properties,
                &msg.body,
            );
        }
        if let Some(seq) = seq {
            self.track_confirm(channel, p, seq);
        }
    }

    /// A `basic` method other than `publish` on an open channel.
    pub(super) fn basic_method(&mut self, channel: u16, m: basic::AMQPMethod) -> AmqpResult<()> {
        let now = Self::now();
        let ch = Arc::clone(&self.slot(channel).ch);
        match m {
            basic::AMQPMethod::Qos(q) => {
                // prefetch-size was checked from the raw payload
                // (`check_qos_prefetch_size`).
                ch.qos(q.prefetch_count, q.global, now);
                self.send_method(
                    channel,
                    &AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
            }
            basic::AMQPMethod::Consume(c) => self.basic_consume(channel, &c)?,
            basic::AMQPMethod::Cancel(c) => {
                ch.cancel(c.consumer_tag.as_str(), now);
                if !c.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                            consumer_tag: c.consumer_tag,
                        })),
                    );
                }
            }
            // The answer to a server-sent cancel; nothing to do.
            basic::AMQPMethod::CancelOk(_) => {}
            basic::AMQPMethod::Get(g) => {
                let qname = self.queue_name(channel, g.queue.as_str())?;
                self.check(Resource::Queue(&qname), Perm::Read)?;
                let q = self.vhost().queue(self.id, &qname)?;
                if q.is_stream() {
                    return Err(AmqpError::not_implemented(format!(
                        "basic.get not supported by stream queues queue '{qname}' in vhost '{}'",
                        q.vhost_name
                    )));
                }
                if !ch.get(&q, g.no_ack, now) {
                    self.send_method(
                        channel,
                        &AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
                    );
                }
            }
            basic::AMQPMethod::Ack(a) => ch.ack(a.delivery_tag, a.multiple, now)?,
            basic::AMQPMethod::Nack(n) => ch.nack(n.delivery_tag, n.multiple, n.requeue, now)?,
            basic::AMQPMethod::Reject(r) => ch.nack(r.delivery_tag, false, r.requeue, now)?,
            basic::AMQPMethod::Recover(r) => {
                if !r.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                ch.recover(now);
                self.send_method(
                    channel,
                    &AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
                );
            }
            basic::AMQPMethod::RecoverAsync(r) => {
                if !r.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                ch.recover(now);
            }
            other => return Err(not_from_client(&AMQPClass::Basic(other))),
        }
        Ok(())
    }

    /// `basic.consume`: `consume-ok` goes out before the first delivery.
    fn basic_consume(&mut self, channel: u16, c: &basic::Consume) -> AmqpResult<()> {
        let now = Self::now();
        let ch = Arc::clone(&self.slot(channel).ch);
        let qname = self.queue_name(channel, c.queue.as_str())?;
        self.check(Resource::Queue(&qname), Perm::Read)?;
        let q = self.vhost().queue(self.id, &qname)?;
        let out = Arc::clone(&self.out);
        let nowait = c.nowait;
        ch.consume_with(
            q,
            c.consumer_tag.as_str(),
            c.no_ack,
            c.exclusive,
            &c.arguments,
            now,
            |tag| {
                if !nowait {
                    out.push(|b| {
                        codec::encode_method(
                            b,
                            channel,
                            &AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                                consumer_tag: tag.into(),
                            })),
                        );
                    });
                }
            },
        )?;
        Ok(())
    }
}
