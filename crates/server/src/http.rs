//! The HTTP side: a RabbitMQ-compatible subset of the management API under
//! `/api/` and Prometheus metrics at `/metrics`. The router and the
//! handlers' state live here; each resource has a file of its own,
//! authentication is in [`auth`], every error answer in [`error`].
//!
//! Invariants:
//! - `/api/*` requires HTTP basic auth with a configured user (and the
//!   loopback rule for loopback-only users), as RabbitMQ's API does;
//!   `/metrics` is open, as RabbitMQ's Prometheus endpoint is.
//! - Handlers take per-queue locks briefly and never wait on the store.

// Handlers return axum's `Response` as their error: it is what they send,
// and errors are rare, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod access;
mod auth;
mod backup;
mod bindings;
mod cluster;
mod connections;
mod console;
mod definitions;
mod error;
mod exchanges;
pub mod follower;
mod health;
mod list;
mod message;
mod metrics;
mod openapi;
mod overview;
mod permissions;
mod policies;
mod queues;
mod shovels;
mod store;
mod store_alarms;
mod stream_fields;
mod users;
mod vhosts;
mod whoami;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::response::Response;
use axum::routing::{delete, get, post};
use axum::Router;
use berth_broker::vhost::VHost;
use berth_broker::Broker;
use serde_json::Value;

use crate::state::Shared;
// What nearly every resource file needs, so each says `use super::{...}`;
// each item is defined once, in the module named here.
pub(crate) use crate::field_json::{json_table, table_json};
pub(crate) use auth::{AdminAuthed, Authed};
pub(crate) use error::{amqp_error, bad_request, error_400, not_found};
pub(crate) use overview::node_name;

/// What the handlers need.
#[derive(Clone)]
pub struct HttpState {
    pub shared: Arc<Shared>,
    pub connections: Arc<AtomicUsize>,
    /// Every bound listener (AMQP and HTTP), for the port-listener check.
    pub listeners: Arc<Vec<SocketAddr>>,
    /// The store, for its per-group metrics.
    pub journal: Arc<crate::store_journal::StoreJournal>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .merge(access_routes())
        .route("/api/overview", get(overview::overview))
        .route("/api/nodes", get(overview::nodes))
        .route("/api/nodes/{name}", get(overview::node))
        .route("/api/vhosts", get(vhosts::list))
        .route("/api/aliveness-test/{vhost}", get(health::aliveness))
        .route("/api/health/checks/alarms", get(health::alarms))
        .route("/api/health/checks/is-leader", get(cluster::is_leader))
        .route("/api/berth/cluster", get(cluster::status))
        .route("/api/berth/cluster/members", post(cluster::add))
        .route("/api/berth/cluster/members/{name}", delete(cluster::remove))
        .route("/api/health/checks/local-alarms", get(health::local_alarms))
        .route(
            "/api/health/checks/port-listener/{port}",
            get(health::port_listener),
        )
        .route("/api/health/checks/virtual-hosts", get(health::vhosts))
        .route("/api/queues", get(queues::list_all))
        .route("/api/queues/{vhost}", get(queues::list_in))
        .route(
            "/api/queues/{vhost}/{name}",
            get(queues::one).put(queues::put).delete(queues::delete),
        )
        .route("/api/queues/{vhost}/{name}/contents", delete(queues::purge))
        .route("/api/queues/{vhost}/{name}/get", post(message::get))
        .route(
            "/api/queues/{vhost}/{name}/bindings",
            get(bindings::of_queue),
        )
        .route("/api/exchanges", get(exchanges::list_all))
        .route("/api/exchanges/{vhost}", get(exchanges::list_in))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(exchanges::one)
                .put(exchanges::put)
                .delete(exchanges::delete),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/publish",
            post(message::publish),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/source",
            get(bindings::of_source),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/destination",
            get(bindings::of_destination),
        )
        .route("/api/bindings", get(bindings::list_all))
        .route("/api/bindings/{vhost}", get(bindings::list_in))
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
            get(bindings::between).post(bindings::create),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
            get(bindings::one).delete(bindings::remove),
        )
        .route(
            "/api/definitions",
            get(definitions::export_all).post(definitions::import_all),
        )
        .route(
            "/api/definitions/{vhost}",
            get(definitions::export_vhost).post(definitions::import_vhost),
        )
        .route("/api/policies", get(policies::list))
        .route("/api/policies/{vhost}", get(policies::list_in))
        .route(
            "/api/policies/{vhost}/{name}",
            get(policies::one)
                .put(policies::put)
                .delete(policies::delete),
        )
        .route("/api/operator-policies", get(policies::list))
        .route("/api/operator-policies/{vhost}", get(policies::list_in))
        .route(
            "/api/operator-policies/{vhost}/{name}",
            get(policies::one)
                .put(policies::put)
                .delete(policies::delete),
        )
        .route("/api/parameters", get(shovels::parameters))
        .route("/api/parameters/shovel", get(shovels::parameters))
        .route(
            "/api/parameters/shovel/{vhost}",
            get(shovels::parameters_in),
        )
        .route(
            "/api/parameters/shovel/{vhost}/{name}",
            get(shovels::parameter)
                .put(shovels::put)
                .delete(shovels::delete),
        )
        .route("/api/shovels", get(shovels::status))
        .route("/api/shovels/{vhost}", get(shovels::status_in))
        .route(
            "/api/shovels/vhost/{vhost}/{name}",
            get(shovels::status_one),
        )
        .route(
            "/api/shovels/vhost/{vhost}/{name}/restart",
            delete(shovels::restart),
        )
        .route("/api/connections", get(connections::list))
        .route(
            "/api/connections/{name}",
            get(connections::one).delete(connections::close),
        )
        .route(
            "/api/connections/{name}/channels",
            get(connections::channels_of),
        )
        .route("/api/vhosts/{vhost}/connections", get(connections::list_in))
        .route("/api/channels", get(connections::channels))
        .route(
            "/api/vhosts/{vhost}/channels",
            get(connections::channels_in),
        )
        .route("/api/consumers", get(connections::consumers))
        .route("/api/consumers/{vhost}", get(connections::consumers_in))
        .route("/api/openapi.json", get(openapi::openapi))
        .route("/api/berth/store/compact", post(store::compact))
        .route("/api/berth/store/backup", post(backup::backup))
        .route("/metrics", get(metrics::aggregated))
        .route("/metrics/per-object", get(metrics::per_object))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::throttle_logins,
        ))
        .layer(axum::middleware::from_fn(console::quiet_challenge))
        .merge(console::routes())
        .with_state(state)
}

/// The routes of users, vhosts, permissions, topic permissions and
/// whoami (administrator only, but for reading a vhost and whoami).
/// `openapi.json` describes only the routes of [`router`] itself.
fn access_routes() -> Router<HttpState> {
    Router::new()
        .route("/api/whoami", get(whoami::get))
        .route("/api/users", get(users::list))
        .route(
            "/api/users/{name}",
            get(users::get_one).put(users::put).delete(users::delete),
        )
        .route("/api/users/{name}/permissions", get(permissions::of_user))
        .route(
            "/api/vhosts/{name}",
            get(vhosts::get_one).put(vhosts::put).delete(vhosts::delete),
        )
        .route("/api/vhosts/{name}/permissions", get(permissions::of_vhost))
        .route("/api/permissions", get(permissions::list))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(permissions::get_one)
                .put(permissions::put)
                .delete(permissions::delete),
        )
        .route("/api/topic-permissions", get(permissions::topic_list))
        .route(
            "/api/topic-permissions/{vhost}/{user}",
            get(permissions::topic_get)
                .put(permissions::topic_put)
                .delete(permissions::topic_delete),
        )
}

pub use definitions::{import as import_definitions, ImportReport};

pub(crate) fn vhost_or_404(state: &HttpState, name: &str) -> Result<Arc<VHost>, Response> {
    state.shared.broker.vhost(name).ok_or_else(not_found)
}

/// Every vhost, sorted by name.
pub(crate) fn sorted_vhosts(state: &HttpState) -> Vec<Arc<VHost>> {
    state.shared.broker.vhosts()
}

/// A boolean field of a request body: RabbitMQ accepts `true` and `"true"`
/// (rabbitmqadmin sends strings).
pub(crate) fn flag(body: &Value, key: &str, default: bool) -> Result<bool, Response> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" => Ok(true),
        Some(Value::String(s)) if s == "false" => Ok(false),
        Some(other) => Err(bad_request(format!(
            "{key} must be true or false, got {other}"
        ))),
    }
}

/// A query-string boolean (`?if-empty=true`).
pub(crate) fn query_flag(q: &std::collections::HashMap<String, String>, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true")
}

/// An exchange name from a URL: `amq.default` is the default exchange.
pub(crate) fn exchange_name(url_name: &str) -> &str {
    if url_name == "amq.default" {
        ""
    } else {
        url_name
    }
}

/// Takes a rate sample of every vhost's totals and every queue every
/// [`berth_broker::counters::RATE_SAMPLE_INTERVAL_MS`] until `stop` changes.
pub async fn sample_rates(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let every = std::time::Duration::from_millis(berth_broker::counters::RATE_SAMPLE_INTERVAL_MS);
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = std::time::Instant::now();
                for v in broker.vhosts() {
                    v.sample_rates(now);
                    for q in v.queues() {
                        q.counters.sample(now);
                    }
                }
            }
            _ = stop.changed() => break,
        }
    }
}
