//! The queues of a client's session, named and bound as RabbitMQ's MQTT
//! plugin does: `mqtt-subscription-<client id>qos0` for QoS 0
//! subscriptions and `...qos1` for QoS 1, and (berth's own, RabbitMQ
//! grants QoS 2 as 1) `...qos2` for QoS 2, each bound to `amq.topic` once
//! per topic filter. A persistent session
//! (3.1.1 `clean session = 0`, 5.0 session expiry > 0) has durable
//! queues (with `x-expires` for a finite v5 expiry), so its subscriptions
//! and QoS 1 messages outlive the connection and a restart; a clean
//! session's are exclusive to the connection and go with it.
//!
//! Invariants:
//! - Every declare, bind, unbind, consume and delete is authorised first
//!   with `crate::permissions::authorise`, as for an AMQP client.
//! - A topic filter is bound to at most one of the three queues:
//!   subscribing again with another QoS moves it.
//! - A non-persistent session leaves no queue behind when it ends.

use std::sync::Arc;
use std::time::Instant;

use berth_broker::access::{Perm, Resource};
use berth_broker::channel::Channel;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::{AMQPValue, FieldTable};

use super::outlet::TAGS;
use super::EXCHANGE;
use crate::permissions::{authorise, Action};
use crate::state::Shared;

/// The queue holding a session's subscriptions of `qos` (0, 1 or 2).
pub fn queue_name(client_id: &str, qos: u8) -> String {
    format!("mqtt-subscription-{client_id}qos{qos}")
}

/// The QoS levels, one queue each.
const QOS: [u8; 3] = [0, 1, 2];

/// How long a session lives without a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// Ends with the connection (clean session, v5 expiry 0).
    Connection,
    /// Kept until the client ends it (3.1.1 `clean session = 0`, v5
    /// expiry `0xFFFFFFFF`).
    Forever,
    /// Kept this long after the connection ends (v5 session expiry).
    ExpiresMs(u64),
}

impl Lifetime {
    fn durable(self) -> bool {
        self != Lifetime::Connection
    }
}

/// One client's session on the broker: its channel and its queues.
pub struct Session {
    pub(super) shared: Arc<Shared>,
    pub vhost: Arc<VHost>,
    pub ch: Arc<Channel>,
    connection_id: u64,
    user: String,
    client_id: String,
    pub(super) lifetime: Lifetime,
    /// Whether we consume from the QoS 0 / 1 / 2 queue.
    consuming: [bool; 3],
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        ch: Arc<Channel>,
        connection_id: u64,
        user: &str,
        client_id: &str,
        lifetime: Lifetime,
    ) -> Self {
        Self {
            shared,
            vhost: Arc::clone(&ch.session.vhost),
            ch,
            connection_id,
            user: user.to_owned(),
            client_id: client_id.to_owned(),
            lifetime,
            consuming: [false; 3],
        }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    fn authorise(&self, action: Action<'_>) -> AmqpResult<()> {
        authorise(self.shared.broker.access(), &self.user, &self.vhost, action)
    }

    /// Whether a session of this client id was kept (either queue exists).
    pub fn was_kept(&self) -> bool {
        QOS.into_iter().any(|q| {
            self.vhost
                .find_queue(&queue_name(&self.client_id, q))
                .is_some()
        })
    }

    /// Ends a kept session: its queues are deleted (clean start).
    pub fn discard_kept(&self) -> AmqpResult<()> {
        for qos in QOS {
            let name = queue_name(&self.client_id, qos);
            if self.vhost.find_queue(&name).is_none() {
                continue;
            }
            self.authorise(Action::On(Resource::Queue(&name), Perm::Configure))?;
            self.vhost
                .delete_queue(self.connection_id, &name, false, false)?;
        }
        Ok(())
    }

    /// Consumes from the kept session's queues: its subscriptions are
    /// still bound, and its QoS 1 messages wait there.
    pub fn resume(&mut self, now: Instant) -> AmqpResult<()> {
        for qos in QOS {
            if self
                .vhost
                .find_queue(&queue_name(&self.client_id, qos))
                .is_some()
            {
                self.consume(qos, now)?;
            }
        }
        Ok(())
    }

    fn consume(&mut self, qos: u8, now: Instant) -> AmqpResult<()> {
        let i = usize::from(qos);
        if self.consuming[i] {
            return Ok(());
        }
        let name = queue_name(&self.client_id, qos);
        self.authorise(Action::On(Resource::Queue(&name), Perm::Read))?;
        let q = self.vhost.queue(self.connection_id, &name)?;
        let no_ack = qos == 0;
        self.ch.consume(q, TAGS[i], no_ack, false, now, |_| {})?;
        self.consuming[i] = true;
        Ok(())
    }

    /// Declares the queue of `qos` if it is not there yet.
    fn declare(&self, qos: u8, now: Instant) -> AmqpResult<String> {
        let name = queue_name(&self.client_id, qos);
        if self.vhost.find_queue(&name).is_some() {
            return Ok(name);
        }
        let mut arguments = FieldTable::default();
        if let Lifetime::ExpiresMs(ms) = self.lifetime {
            arguments.insert(
                "x-expires".into(),
                AMQPValue::LongLongInt(i64::try_from(ms.max(1)).unwrap_or(i64::MAX)),
            );
        }
        let durable = self.lifetime.durable();
        let authorise = |q: &str| {
            self.authorise(Action::DeclareQueue {
                name: q,
                dead_letter_exchange: None,
            })
        };
        self.vhost.declare_queue_authorised(
            self.connection_id,
            &name,
            &QueueDeclare {
                passive: false,
                durable,
                exclusive: !durable,
                auto_delete: !durable,
                arguments,
            },
            now,
            &authorise,
        )?;
        Ok(name)
    }

    /// Whether `binding_key` is subscribed at any QoS.
    pub fn is_subscribed(&self, binding_key: &str) -> bool {
        QOS.into_iter().any(|qos| {
            self.vhost
                .find_queue(&queue_name(&self.client_id, qos))
                .is_some_and(|q| q.is_bound_from(EXCHANGE, binding_key))
        })
    }

    /// Subscribes `binding_key` at `qos` (0, 1 or 2): its queue bound to
    /// `amq.topic` and consumed, and the key unbound from the others.
    pub fn subscribe(&mut self, binding_key: &str, qos: u8, now: Instant) -> AmqpResult<()> {
        debug_assert!(qos <= 2, "a QoS is 0, 1 or 2");
        let name = self.declare(qos, now)?;
        self.authorise(Action::Bind {
            destination: Resource::Queue(&name),
            source: EXCHANGE,
            routing_key: binding_key,
        })?;
        let none = FieldTable::default();
        self.vhost
            .bind_queue(self.connection_id, &name, EXCHANGE, binding_key, &none)?;
        self.consume(qos, now)?;
        for other in QOS.into_iter().filter(|q| *q != qos) {
            self.unbind(other, binding_key)?;
        }
        Ok(())
    }

    /// Unbinds `binding_key` from both queues; whether it was bound.
    pub fn unsubscribe(&mut self, binding_key: &str) -> AmqpResult<bool> {
        let mut was = false;
        for qos in QOS {
            was |= self.unbind(qos, binding_key)?;
        }
        Ok(was)
    }

    fn unbind(&self, qos: u8, binding_key: &str) -> AmqpResult<bool> {
        let name = queue_name(&self.client_id, qos);
        let Some(q) = self.vhost.find_queue(&name) else {
            return Ok(false);
        };
        if !q.is_bound_from(EXCHANGE, binding_key) {
            return Ok(false);
        }
        self.authorise(Action::Bind {
            destination: Resource::Queue(&name),
            source: EXCHANGE,
            routing_key: binding_key,
        })?;
        let none = FieldTable::default();
        self.vhost
            .unbind_queue(self.connection_id, &name, EXCHANGE, binding_key, &none)?;
        Ok(true)
    }

    /// The connection ended: deliveries not PUBACKed go back to their
    /// queues (redelivered with DUP to a resumed session); a session that
    /// ends with its connection loses its queues.
    pub fn end(&self, now: Instant) {
        self.ch.close(now);
        if self.lifetime == Lifetime::Connection {
            // Exclusive queues go with the connection; a kept session
            // resumed with expiry 0 had durable ones, deleted here.
            if let Err(e) = self.discard_kept() {
                tracing::warn!(client_id = %self.client_id, error = %e, "MQTT session queues not deleted");
            }
        }
        self.vhost.connection_closed(self.connection_id);
    }
}

/// An AMQP error as a log line's cause.
pub fn why(e: &AmqpError) -> String {
    e.reply_text()
}
