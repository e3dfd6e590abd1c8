//! What every connection and every HTTP request shares: the broker, the
//! configuration, the registry of live connections, the disk alarm and
//! the login budgets of source addresses. One value of [`Shared`] is built at startup
//! and handed (in an `Arc`) to the accept loop and the HTTP router.
//!
//! Invariants:
//! - This module imports only the modules whose types it holds; the
//!   AMQP side (`connection`) and the HTTP side (`http`) both depend on it
//!   and never on each other.

use std::sync::Arc;

use berth_broker::Broker;

use crate::config::Config;

/// What every connection and HTTP handler needs from the server.
pub struct Shared {
    pub broker: Arc<Broker>,
    pub config: Arc<Config>,
    /// Live connections, for the management API.
    pub registry: Arc<crate::registry::Registry>,
    /// Set while a data directory is low on space (see [`crate::disk`]).
    pub disk: Arc<crate::disk::DiskAlarm>,
    /// Login budget per source address (AMQP and HTTP alike).
    pub logins: crate::throttle::LoginThrottle,
    /// This member's cluster, when it is one (it then serves as leader).
    pub cluster: Option<Arc<crate::cluster::view::ClusterView>>,
    /// The dynamic shovels; none on a cluster member (not supported
    /// there yet, docs/SHOVELS.md).
    pub shovels: Option<Arc<crate::shovel::Shovels>>,
}
