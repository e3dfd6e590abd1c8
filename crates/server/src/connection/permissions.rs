//! The permission checks each AMQP class makes before it acts, in one
//! place so every class asks the same way (the rules and reply texts are
//! the broker's, in `berth_broker::access`).

use berth_broker::access::{Perm, Resource};
use berth_broker::exchange::ExchangeKind;
use berth_broker::AmqpResult;

use super::Conn;

impl Conn {
    /// May this connection's user do `perm` on `resource` in its vhost?
    pub(super) fn check(&self, resource: Resource<'_>, perm: Perm) -> AmqpResult<()> {
        self.shared
            .broker
            .access()
            .check(&self.user, &self.vhost().name, resource, perm)
    }

    /// The user's topic permission on a routing key, if `exchange` is a
    /// topic exchange that has one.
    pub(super) fn check_topic(
        &self,
        exchange: &str,
        routing_key: &str,
        perm: Perm,
    ) -> AmqpResult<()> {
        let vhost = self.vhost();
        self.shared.broker.access().check_topic(
            &self.user,
            &vhost.name,
            exchange,
            routing_key,
            perm,
            || {
                vhost
                    .exchange(exchange)
                    .is_ok_and(|e| e.kind == ExchangeKind::Topic)
            },
        )
    }

    /// A binding (queue or exchange destination): write on the
    /// destination, read on the source, and topic read on the binding key,
    /// in RabbitMQ's order.
    pub(super) fn check_bind(
        &self,
        destination: Resource<'_>,
        source: &str,
        routing_key: &str,
    ) -> AmqpResult<()> {
        self.check(destination, Perm::Write)?;
        self.check(Resource::Exchange(source), Perm::Read)?;
        self.check_topic(source, routing_key, Perm::Read)
    }
}
