//! The permission check of every action a client asks for, shared by both
//! front doors: AMQP connections (`connection::permissions`) and the
//! management API (`http::auth::Authed::may`) ask through [`authorise`],
//! so an action allowed through one is allowed through the other.
//!
//! Invariants:
//! - Each action checks what RabbitMQ checks for it, in RabbitMQ's order
//!   (so the first refusal names the same resource through both doors);
//!   the rules and reply texts themselves are `berth_broker::access`'s.

use berth_broker::access::{Access, Perm, Resource};
use berth_broker::exchange::ExchangeKind;
use berth_broker::vhost::VHost;
use berth_broker::AmqpResult;

/// What a user asks to do in a vhost.
#[derive(Clone, Copy, Debug)]
pub enum Action<'a> {
    /// One permission on one resource (delete, purge, get, consume, ...).
    On(Resource<'a>, Perm),
    /// `basic.publish`: write on the exchange, then the topic permission
    /// on the routing key.
    Publish {
        exchange: &'a str,
        routing_key: &'a str,
    },
    /// A binding (or unbinding): write on the destination, read on the
    /// source, then the topic read permission on the binding key.
    Bind {
        destination: Resource<'a>,
        source: &'a str,
        routing_key: &'a str,
    },
    /// Declaring a new exchange: configure, and with an
    /// `alternate-exchange` read on the exchange and write on the
    /// alternate (RabbitMQ checks these only when the exchange is new).
    DeclareExchange {
        name: &'a str,
        alternate_exchange: Option<&'a str>,
    },
    /// Declaring a queue: configure, and with an `x-dead-letter-exchange`
    /// read on the queue and write on that exchange.
    DeclareQueue {
        name: &'a str,
        dead_letter_exchange: Option<&'a str>,
    },
}

/// May `user` do `action` in `vhost`? The error is the AMQP one
/// (`403 ACCESS_REFUSED` with RabbitMQ's text).
pub fn authorise(access: &Access, user: &str, vhost: &VHost, action: Action<'_>) -> AmqpResult<()> {
    let check = |resource, perm| access.check(user, &vhost.name, resource, perm);
    let topic = |exchange: &str, routing_key: &str, perm| {
        access.check_topic(user, &vhost.name, exchange, routing_key, perm, || {
            vhost
                .exchange(exchange)
                .is_ok_and(|e| e.kind == ExchangeKind::Topic)
        })
    };
    match action {
        Action::On(resource, perm) => check(resource, perm),
        Action::Publish {
            exchange,
            routing_key,
        } => {
            check(Resource::Exchange(exchange), Perm::Write)?;
            topic(exchange, routing_key, Perm::Write)
        }
        Action::Bind {
            destination,
            source,
            routing_key,
        } => {
            check(destination, Perm::Write)?;
            check(Resource::Exchange(source), Perm::Read)?;
            topic(source, routing_key, Perm::Read)
        }
        Action::DeclareExchange {
            name,
            alternate_exchange,
        } => {
            check(Resource::Exchange(name), Perm::Configure)?;
            if let (Some(ae), Err(_)) = (alternate_exchange, vhost.exchange(name)) {
                check(Resource::Exchange(name), Perm::Read)?;
                check(Resource::Exchange(ae), Perm::Write)?;
            }
            Ok(())
        }
        Action::DeclareQueue {
            name,
            dead_letter_exchange,
        } => {
            check(Resource::Queue(name), Perm::Configure)?;
            if let Some(x) = dead_letter_exchange {
                check(Resource::Queue(name), Perm::Read)?;
                check(Resource::Exchange(x), Perm::Write)?;
            }
            Ok(())
        }
    }
}
