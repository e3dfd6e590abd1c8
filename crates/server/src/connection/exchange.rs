//! The `exchange` class: declare, delete, bind and unbind. The rules live in
//! the broker's vhost; this file turns methods into calls and answers.

use std::sync::Arc;

use berth_broker::access::{Perm, Resource};
use berth_broker::args::as_string;
use berth_broker::vhost::ExchangeDeclare;
use berth_broker::AmqpResult;
use berth_protocol::methods::exchange;
use berth_protocol::AMQPClass;

use super::exception::not_from_client;
use super::Conn;

impl Conn {
    /// An `exchange` method on an open channel.
    pub(super) fn exchange_method(
        &mut self,
        channel: u16,
        m: exchange::AMQPMethod,
    ) -> AmqpResult<()> {
        let vhost = Arc::clone(self.vhost());
        let (nowait, ok) = match m {
            exchange::AMQPMethod::Declare(d) => {
                let name = d.exchange.as_str();
                // The default exchange is refused by the vhost, as RabbitMQ
                // refuses it before any permission check.
                if !d.passive && !name.is_empty() {
                    let ae = d
                        .arguments
                        .inner()
                        .get("alternate-exchange")
                        .and_then(as_string);
                    self.authorise(crate::permissions::Action::DeclareExchange {
                        name,
                        alternate_exchange: ae.as_deref(),
                    })?;
                }
                vhost.declare_exchange(
                    d.exchange.as_str(),
                    &ExchangeDeclare {
                        kind: d.kind.to_string(),
                        passive: d.passive,
                        durable: d.durable,
                        auto_delete: d.auto_delete,
                        internal: d.internal,
                        arguments: d.arguments,
                    },
                )?;
                (
                    d.nowait,
                    exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {}),
                )
            }
            exchange::AMQPMethod::Delete(d) => {
                let name = d.exchange.as_str();
                if !name.is_empty() && !name.starts_with("amq.") {
                    self.check(Resource::Exchange(name), Perm::Configure)?;
                }
                vhost.delete_exchange(d.exchange.as_str(), d.if_unused)?;
                (
                    d.nowait,
                    exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {}),
                )
            }
            exchange::AMQPMethod::Bind(b) => {
                self.check_bind(
                    Resource::Exchange(b.destination.as_str()),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                )?;
                vhost.bind_exchange(
                    b.destination.as_str(),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                (b.nowait, exchange::AMQPMethod::BindOk(exchange::BindOk {}))
            }
            exchange::AMQPMethod::Unbind(b) => {
                self.check_bind(
                    Resource::Exchange(b.destination.as_str()),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                )?;
                vhost.unbind_exchange(
                    b.destination.as_str(),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                (
                    b.nowait,
                    exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {}),
                )
            }
            other => return Err(not_from_client(&AMQPClass::Exchange(other))),
        };
        if !nowait {
            self.send_method(channel, &AMQPClass::Exchange(ok));
        }
        Ok(())
    }
}
