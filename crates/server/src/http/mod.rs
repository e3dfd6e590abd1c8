//! The HTTP side: a RabbitMQ-compatible subset of the management API under
//! `/api/` and Prometheus metrics at `/metrics`. The router, the shared
//! state, authentication, errors and JSON helpers live here; each resource
//! has a file of its own.
//!
//! Invariants:
//! - `/api/*` requires HTTP basic auth with a configured user (and the
//!   loopback rule for loopback-only users), as RabbitMQ's API does;
//!   `/metrics` is open, as RabbitMQ's Prometheus endpoint is.
//! - Handlers take per-queue locks briefly and never wait on the store.

// Handlers return axum's `Response` as their error: it is what they send,
// and errors are rare, so its size does not matter.
#![allow(clippy::result_large_err)]

mod access;
mod bindings;
mod connections;
mod console;
mod definitions;
mod exchanges;
mod health;
mod list;
mod message;
mod metrics;
mod openapi;
mod overview;
mod policies;
mod queues;
mod store;
mod vhosts;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use berth_broker::access::{Perm, Resource, User, TAG_ADMINISTRATOR, TAG_MONITORING};
use berth_broker::vhost::VHost;
use berth_broker::{AmqpError, Broker};
use berth_protocol::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{json, Value};

use crate::connection::Shared;

/// What the handlers need.
#[derive(Clone)]
pub struct HttpState {
    pub shared: Arc<Shared>,
    pub connections: Arc<AtomicUsize>,
    /// Every bound listener (AMQP and HTTP), for the port-listener check.
    pub listeners: Arc<Vec<SocketAddr>>,
    /// The store, for its per-group metrics.
    pub journal: Arc<crate::journal::StoreJournal>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .merge(crate::auth::http::routes())
        .route("/api/overview", get(overview::overview))
        .route("/api/nodes", get(overview::nodes))
        .route("/api/nodes/{name}", get(overview::node))
        .route("/api/vhosts", get(vhosts::list))
        .route("/api/aliveness-test/{vhost}", get(health::aliveness))
        .route("/api/health/checks/alarms", get(health::alarms))
        .route("/api/health/checks/local-alarms", get(health::alarms))
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
        .route("/metrics", get(metrics::aggregated))
        .route("/metrics/per-object", get(metrics::per_object))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::http::throttle_failed_logins,
        ))
        .layer(axum::middleware::from_fn(console::quiet_challenge))
        .merge(console::routes())
        .with_state(state)
}

/// A request that passed HTTP basic auth with a management user (and the
/// loopback rule): handlers that take it as an argument answer 401 before
/// they run. It carries the user, for the vhosts it may see.
pub(crate) struct Authed(pub Arc<User>);

impl Authed {
    /// Whether this user may see objects of `vhost` (RabbitMQ's rule:
    /// `administrator` and `monitoring` see every vhost, others only those
    /// they have permissions in).
    pub(crate) fn sees(&self, st: &HttpState, vhost: &str) -> bool {
        crate::auth::http::sees_vhost(&st.shared, &self.0, vhost)
    }

    /// The vhost named in a URL: 404 when it does not exist, 401 when this
    /// user may not see it (RabbitMQ's answer).
    pub(crate) fn vhost(&self, st: &HttpState, name: &str) -> Result<Arc<VHost>, Response> {
        let v = vhost_or_404(st, name)?;
        if !self.sees(st, name) {
            return Err(crate::auth::http::unauthorized(
                "User not authorised to access virtual host",
            ));
        }
        Ok(v)
    }

    /// The vhost named in a URL, for an action its permissions must allow:
    /// as [`Authed::vhost`], then each `(resource, perm)` of `needs`
    /// checked as over AMQP (`basic.publish` needs write on the exchange,
    /// a declare configure, ...). Refused with RabbitMQ's 401 "Access
    /// refused.". Administrators act in every vhost (RabbitMQ asks them
    /// for permissions too, and grants a vhost's creator full ones).
    pub(crate) fn may(
        &self,
        st: &HttpState,
        vhost: &str,
        needs: &[(Resource<'_>, Perm)],
    ) -> Result<Arc<VHost>, Response> {
        let v = self.vhost(st, vhost)?;
        if self.0.has_tag(TAG_ADMINISTRATOR) {
            return Ok(v);
        }
        let access = st.shared.broker.access();
        for &(resource, perm) in needs {
            if let Err(e) = access.check(&self.0.name, vhost, resource, perm) {
                tracing::debug!(user = %self.0.name, error = %e, "management API action refused");
                return Err(crate::auth::http::unauthorized("Access refused."));
            }
        }
        Ok(v)
    }

    /// Whether this user sees every vhost and connection (`administrator`
    /// and `monitoring`).
    pub(crate) fn sees_all(&self) -> bool {
        self.0.has_tag(TAG_ADMINISTRATOR) || self.0.has_tag(TAG_MONITORING)
    }

    /// Whether this user may see a connection and its channels (RabbitMQ's
    /// rule: `administrator` and `monitoring` see all, others their own).
    pub(crate) fn sees_connection(&self, c: &crate::registry::ConnInfo) -> bool {
        self.sees_all() || c.user == self.0.name
    }

    /// Whether this user may close a connection (`administrator`, or its
    /// owner).
    pub(crate) fn may_close(&self, c: &crate::registry::ConnInfo) -> bool {
        self.0.has_tag(TAG_ADMINISTRATOR) || c.user == self.0.name
    }

    /// The vhosts this user may see, sorted by name.
    pub(crate) fn vhosts(&self, st: &HttpState) -> Vec<Arc<VHost>> {
        let mut all = sorted_vhosts(st);
        all.retain(|v| self.sees(st, &v.name));
        all
    }
}

impl FromRequestParts<HttpState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &HttpState) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        crate::auth::http::authenticate(&st.shared, &parts.headers, peer).map(Authed)
    }
}

/// A request that passed HTTP basic auth with an `administrator` user.
pub(crate) struct AdminAuthed;

impl FromRequestParts<HttpState> for AdminAuthed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &HttpState) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        crate::auth::http::authenticate_admin(&st.shared, &parts.headers, peer)?;
        Ok(AdminAuthed)
    }
}

pub use definitions::{import as import_definitions, ImportReport};

/// RabbitMQ's 404 body.
pub(crate) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": "Object Not Found", "reason": "Not Found"})),
    )
        .into_response()
}

pub(crate) fn value_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::LongString(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::ShortString(s) => json!(s.as_str()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_json).collect()),
        AMQPValue::FieldTable(t) => table_json(t),
        AMQPValue::Float(f) => json!(f),
        AMQPValue::Double(f) => json!(f),
        AMQPValue::Void => Value::Null,
        other => berth_broker::args::as_i128(other)
            .and_then(|i| i64::try_from(i).ok())
            .map_or_else(|| json!(format!("{other:?}")), |i| json!(i)),
    }
}

pub(crate) fn table_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), value_json(v)))
            .collect(),
    )
}

pub(crate) fn vhost_or_404(state: &HttpState, name: &str) -> Result<Arc<VHost>, Response> {
    state.shared.broker.vhost(name).ok_or_else(not_found)
}

/// Every vhost, sorted by name.
pub(crate) fn sorted_vhosts(state: &HttpState) -> Vec<Arc<VHost>> {
    state.shared.broker.vhosts()
}

/// RabbitMQ's 400 body.
pub(crate) fn bad_request(reason: impl Into<String>) -> Response {
    error_400("bad_request", reason)
}

/// A 400 with RabbitMQ's `error` name for it.
pub(crate) fn error_400(error: &str, reason: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": error, "reason": reason.into()})),
    )
        .into_response()
}

/// The HTTP answer to a broker error: 404 for a missing object, 501 for
/// what berth does not implement, 400 with the AMQP reply text otherwise
/// (as RabbitMQ's API answers a failed declare or delete).
pub(crate) fn amqp_error(e: &AmqpError) -> Response {
    match e.reply_code {
        berth_protocol::reply::NOT_FOUND => not_found(),
        berth_protocol::reply::NOT_IMPLEMENTED => (
            StatusCode::NOT_IMPLEMENTED,
            Json(json!({"error": "not_implemented", "reason": e.reply_text()})),
        )
            .into_response(),
        _ => bad_request(e.reply_text()),
    }
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

/// A JSON value as an AMQP field value (integers as signed 64-bit, as
/// RabbitMQ's API stores them).
pub(crate) fn json_value(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => n.as_i64().map_or_else(
            || AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
            AMQPValue::LongLongInt,
        ),
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter().map(json_value).collect::<Vec<_>>(),
        )),
        Value::Object(_) => AMQPValue::FieldTable(json_table(v)),
    }
}

/// A JSON object as an AMQP field table; anything else is an empty table.
pub(crate) fn json_table(v: &Value) -> FieldTable {
    let mut t = FieldTable::default();
    if let Value::Object(m) = v {
        for (k, x) in m {
            t.insert(ShortString::from(k.as_str()), json_value(x));
        }
    }
    t
}

/// Takes a rate sample of every queue every
/// [`berth_broker::counters::RATE_SAMPLE_INTERVAL_MS`] until `stop` changes.
pub async fn sample_rates(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let every = std::time::Duration::from_millis(berth_broker::counters::RATE_SAMPLE_INTERVAL_MS);
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = std::time::Instant::now();
                for v in broker.vhosts() {
                    for q in v.queues() {
                        q.counters.sample(now);
                    }
                }
            }
            _ = stop.changed() => break,
        }
    }
}
