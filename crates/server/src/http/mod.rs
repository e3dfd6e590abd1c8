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

mod exchanges;
mod metrics;
mod overview;
mod queues;
mod vhosts;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use berth_broker::vhost::VHost;
use berth_protocol::{AMQPValue, FieldTable};
use serde_json::{json, Value};

use crate::connection::Shared;

/// What the handlers need.
#[derive(Clone)]
pub struct HttpState {
    pub shared: Arc<Shared>,
    pub connections: Arc<AtomicUsize>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/api/overview", get(overview::overview))
        .route("/api/vhosts", get(vhosts::list))
        .route("/api/queues", get(queues::list_all))
        .route("/api/queues/{vhost}", get(queues::list_in))
        .route("/api/queues/{vhost}/{name}", get(queues::one))
        .route("/api/exchanges", get(exchanges::list_all))
        .route("/api/exchanges/{vhost}", get(exchanges::list_in))
        .route("/metrics", get(metrics::metrics))
        .with_state(state)
}

fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"berth\"")],
        Json(json!({"error": "not_authorised", "reason": why})),
    )
        .into_response()
}

fn check_auth(state: &HttpState, headers: &HeaderMap, peer: SocketAddr) -> Result<(), Response> {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized("HTTP basic authentication required"));
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return Err(unauthorized("only HTTP basic authentication is supported"));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let Some((user, password)) = decoded.as_deref().and_then(|s| s.split_once(':')) else {
        return Err(unauthorized("malformed basic authentication header"));
    };
    let auth = &state.shared.config.auth;
    if !auth
        .users
        .iter()
        .any(|u| u.name == user && u.password == password)
    {
        return Err(unauthorized("Login failed"));
    }
    if auth.loopback_users.iter().any(|u| u == user) && !peer.ip().is_loopback() {
        return Err(unauthorized("user can only log in via localhost"));
    }
    Ok(())
}

/// A request that passed [`check_auth`]: handlers that take it as an
/// argument answer 401 before they run.
pub(crate) struct Authed;

impl FromRequestParts<HttpState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &HttpState) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        check_auth(st, &parts.headers, peer)?;
        Ok(Authed)
    }
}

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
    let mut vs: Vec<_> = state.shared.broker.vhosts().cloned().collect();
    vs.sort_by(|a, b| a.name.cmp(&b.name));
    vs
}
