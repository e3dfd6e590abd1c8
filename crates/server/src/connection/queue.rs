//! The `queue` class: declare, bind, unbind, purge and delete. An empty
//! queue name means the queue last declared on the channel, as the spec says.

use std::sync::Arc;

use berth_broker::access::{Perm, Resource};
use berth_broker::args::as_string;
use berth_broker::vhost::QueueDeclare;
use berth_broker::AmqpResult;
use berth_protocol::methods::queue;
use berth_protocol::AMQPClass;

use super::exception::not_from_client;
use super::Conn;

/// A count for a `*-ok` method's `u32` field, saturating.
fn count_u32<N: TryInto<u32>>(n: N) -> u32 {
    n.try_into().unwrap_or(u32::MAX)
}

impl Conn {
    /// A `queue` method on an open channel.
    pub(super) fn queue_method(&mut self, channel: u16, m: queue::AMQPMethod) -> AmqpResult<()> {
        let now = Self::now();
        let vhost = Arc::clone(self.vhost());
        let conn_id = self.id;
        let (nowait, ok) = match m {
            queue::AMQPMethod::Declare(d) => {
                let name = if d.passive {
                    self.queue_name(channel, d.queue.as_str())?
                } else {
                    d.queue.to_string()
                };
                let dlx = d
                    .arguments
                    .inner()
                    .get("x-dead-letter-exchange")
                    .and_then(as_string);
                // Configure on the final name (server-named too); a
                // dead-letter exchange needs read on the queue and write on
                // the exchange, as RabbitMQ checks.
                let authorise = |q: &str| -> AmqpResult<()> {
                    self.authorise(crate::permissions::Action::DeclareQueue {
                        name: q,
                        dead_letter_exchange: dlx.as_deref(),
                    })
                };
                let (name, messages, consumers) = vhost.declare_queue_authorised(
                    conn_id,
                    &name,
                    &QueueDeclare {
                        passive: d.passive,
                        durable: d.durable,
                        exclusive: d.exclusive,
                        auto_delete: d.auto_delete,
                        arguments: d.arguments,
                    },
                    now,
                    &authorise,
                )?;
                self.slot(channel).last_queue = Some(name.clone());
                let ok = queue::DeclareOk {
                    queue: name.into(),
                    message_count: count_u32(messages),
                    consumer_count: count_u32(consumers),
                };
                (d.nowait, queue::AMQPMethod::DeclareOk(ok))
            }
            queue::AMQPMethod::Bind(b) => {
                let q = self.queue_name(channel, b.queue.as_str())?;
                let (x, key) = (b.exchange.as_str(), b.routing_key.as_str());
                self.check_bind(Resource::Queue(&q), x, key)?;
                vhost.bind_queue(conn_id, &q, x, key, &b.arguments)?;
                (b.nowait, queue::AMQPMethod::BindOk(queue::BindOk {}))
            }
            queue::AMQPMethod::Unbind(b) => {
                let q = self.queue_name(channel, b.queue.as_str())?;
                let (x, key) = (b.exchange.as_str(), b.routing_key.as_str());
                self.check_bind(Resource::Queue(&q), x, key)?;
                vhost.unbind_queue(conn_id, &q, x, key, &b.arguments)?;
                // queue.unbind has no nowait flag.
                (false, queue::AMQPMethod::UnbindOk(queue::UnbindOk {}))
            }
            queue::AMQPMethod::Purge(p) => {
                let q = self.queue_name(channel, p.queue.as_str())?;
                self.check(Resource::Queue(&q), Perm::Read)?;
                let n = vhost.purge_queue(conn_id, &q, now)?;
                let ok = queue::PurgeOk {
                    message_count: count_u32(n),
                };
                (p.nowait, queue::AMQPMethod::PurgeOk(ok))
            }
            queue::AMQPMethod::Delete(d) => {
                let q = self.queue_name(channel, d.queue.as_str())?;
                self.check(Resource::Queue(&q), Perm::Configure)?;
                // RabbitMQ answers with delete-ok before it sends
                // basic.cancel to the queue's consumers on this channel;
                // amqplib relies on it.
                self.out.hold_cancels();
                let deleted = vhost.delete_queue(conn_id, &q, d.if_unused, d.if_empty);
                if let (Ok(n), false) = (&deleted, d.nowait) {
                    let ok = queue::DeleteOk {
                        message_count: count_u32(*n),
                    };
                    self.send_method(channel, &AMQPClass::Queue(queue::AMQPMethod::DeleteOk(ok)));
                }
                self.out.release_cancels();
                deleted?;
                return Ok(());
            }
            other => return Err(not_from_client(&AMQPClass::Queue(other))),
        };
        if !nowait {
            self.send_method(channel, &AMQPClass::Queue(ok));
        }
        Ok(())
    }
}
