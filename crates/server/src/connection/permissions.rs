//! The permission checks each AMQP class makes before it acts: every one
//! goes through [`crate::permissions::authorise`], the function the
//! management API asks too, so both front doors give the same verdict.

use berth_broker::access::{Perm, Resource};
use berth_broker::AmqpResult;

use super::Conn;
use crate::permissions::{authorise, Action};

impl Conn {
    /// May this connection's user do `action` in its vhost?
    pub(super) fn authorise(&self, action: Action<'_>) -> AmqpResult<()> {
        authorise(
            self.shared.broker.access(),
            &self.user,
            self.vhost(),
            action,
        )
    }

    /// May this connection's user do `perm` on `resource` in its vhost?
    pub(super) fn check(&self, resource: Resource<'_>, perm: Perm) -> AmqpResult<()> {
        self.authorise(Action::On(resource, perm))
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
        self.authorise(Action::Bind {
            destination,
            source,
            routing_key,
        })
    }
}
