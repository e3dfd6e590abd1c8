//! The broker: vhosts, exchanges, bindings, queues, consumers, acks, TTL,
//! dead-lettering and limits. It owns the rules of AMQP 0-9-1 as RabbitMQ
//! implements them, and does no networking: the server feeds it decoded
//! methods and gives it an [`channel::Outlet`] to write deliveries to.
//!
//! Messages are kept in memory in this version; queues hold shared message
//! references so the durable store can take their place underneath.

pub mod args;
pub mod channel;
pub mod error;
pub mod exchange;
pub mod message;
pub mod queue;
pub mod vhost;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub use error::{AmqpError, AmqpResult};
use vhost::{Timers, VHost};

/// The whole broker: the vhosts and the timer service they share.
pub struct Broker {
    vhosts: HashMap<String, Arc<VHost>>,
    timers: Arc<Timers>,
}

impl Broker {
    /// A broker with the given vhosts (at least `/` in the default setup).
    pub fn new<'a>(vhosts: impl IntoIterator<Item = &'a str>) -> Arc<Self> {
        let timers = Arc::new(Timers::default());
        let vhosts = vhosts
            .into_iter()
            .map(|n| (n.to_owned(), VHost::new(n, Arc::clone(&timers))))
            .collect();
        Arc::new(Self { vhosts, timers })
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.get(name).cloned()
    }

    pub fn vhosts(&self) -> impl Iterator<Item = &Arc<VHost>> {
        self.vhosts.values()
    }

    /// Runs due timers (TTL expiry, `x-expires`); the server calls this
    /// periodically.
    pub fn run_timers(&self, now: Instant) {
        self.timers.run_due(now);
    }

    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }
}
