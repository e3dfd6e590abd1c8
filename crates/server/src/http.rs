//! The HTTP side: a read-only, RabbitMQ-compatible subset of the management
//! API (`/api/overview`, `/api/queues`, `/api/exchanges`, `/api/vhosts`) and
//! Prometheus metrics at `/metrics`.
//!
//! Invariants:
//! - `/api/*` requires HTTP basic auth with a configured user (and the
//!   loopback rule for loopback-only users), as RabbitMQ's API does;
//!   `/metrics` is open, as RabbitMQ's Prometheus endpoint is.
//! - Handlers only read broker state; each takes per-queue locks briefly.

// Handlers return axum's `Response` as their error: it is what they send,
// and errors are rare, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use berth_broker::queue::Queue;
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
        .merge(crate::auth::http::routes())
        .route("/api/overview", get(overview))
        .route("/api/vhosts", get(vhosts))
        .route("/api/queues", get(queues_all))
        .route("/api/queues/{vhost}", get(queues_in))
        .route("/api/queues/{vhost}/{name}", get(queue_one))
        .route("/api/exchanges", get(exchanges_all))
        .route("/api/exchanges/{vhost}", get(exchanges_in))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn check_auth(state: &HttpState, headers: &HeaderMap, peer: SocketAddr) -> Result<(), Response> {
    crate::auth::http::authenticate(&state.shared, headers, peer).map(|_| ())
}

fn value_json(v: &AMQPValue) -> Value {
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

fn table_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), value_json(v)))
            .collect(),
    )
}

fn queue_json(q: &Queue) -> Value {
    let s = q.stats();
    json!({
        "name": q.name,
        "vhost": q.vhost_name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner.is_some(),
        "arguments": table_json(&q.arguments),
        "type": match q.args.queue_type { berth_broker::args::QueueType::Classic => "classic", berth_broker::args::QueueType::Quorum => "quorum" },
        "messages": s.ready + s.unacked,
        "messages_ready": s.ready,
        "messages_unacknowledged": s.unacked,
        "message_bytes_ready": s.ready_bytes,
        "messages_paged_out": s.paged_out,
        "messages_ram": s.ready - s.paged_out + s.unacked,
        "consumers": s.consumers,
        "state": "running",
    })
}

fn sorted_queues(v: &VHost) -> Vec<Arc<Queue>> {
    let mut qs = v.queues();
    qs.sort_by(|a, b| a.name.cmp(&b.name));
    qs
}

fn vhost_or_404(state: &HttpState, name: &str) -> Result<Arc<VHost>, Response> {
    state.shared.broker.vhost(name).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "Object Not Found", "reason": "Not Found"})),
        )
            .into_response()
    })
}

async fn overview(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    let (mut queues, mut exchanges, mut ready, mut unacked, mut consumers) = (0, 0, 0, 0, 0);
    for v in st.shared.broker.vhosts() {
        for q in v.queues() {
            let s = q.stats();
            queues += 1;
            ready += s.ready;
            unacked += s.unacked;
            consumers += s.consumers;
        }
        exchanges += v.exchanges().len();
    }
    Json(json!({
        "product_name": "berth",
        "product_version": env!("CARGO_PKG_VERSION"),
        "management_version": env!("CARGO_PKG_VERSION"),
        "object_totals": {
            "queues": queues,
            "exchanges": exchanges,
            "connections": st.connections.load(Ordering::Relaxed),
            "consumers": consumers,
        },
        "queue_totals": {
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        },
    }))
    .into_response()
}

async fn vhosts(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    let vhosts = st.shared.broker.vhosts();
    let names: Vec<&str> = vhosts.iter().map(|v| v.name.as_str()).collect();
    Json(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()).into_response()
}

async fn queues_all(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    let vs = st.shared.broker.vhosts();
    let all: Vec<Value> = vs
        .iter()
        .flat_map(|v| sorted_queues(v))
        .map(|q| queue_json(&q))
        .collect();
    Json(all).into_response()
}

async fn queues_in(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    match vhost_or_404(&st, &vhost) {
        Ok(v) => Json(
            sorted_queues(&v)
                .iter()
                .map(|q| queue_json(q))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

async fn queue_one(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    match v.queues().into_iter().find(|q| q.name == name) {
        Some(q) => Json(queue_json(&q)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "Object Not Found", "reason": "Not Found"})),
        )
            .into_response(),
    }
}

fn exchanges_json(v: &VHost) -> Vec<Value> {
    let mut es = v.exchanges();
    es.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = vec![
        json!({"name": "", "vhost": v.name, "type": "direct", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}),
    ];
    out.extend(es.iter().map(|e| {
        json!({
            "name": e.name,
            "vhost": v.name,
            "type": e.kind.as_str(),
            "durable": e.durable,
            "auto_delete": e.auto_delete,
            "internal": e.internal,
            "arguments": table_json(&e.arguments),
        })
    }));
    out
}

async fn exchanges_all(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    let all: Vec<Value> = st
        .shared
        .broker
        .vhosts()
        .iter()
        .flat_map(|v| exchanges_json(v))
        .collect();
    Json(all).into_response()
}

async fn exchanges_in(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = check_auth(&st, &headers, peer) {
        return r;
    }
    match vhost_or_404(&st, &vhost) {
        Ok(v) => Json(exchanges_json(&v)).into_response(),
        Err(r) => r,
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn metrics(State(st): State<HttpState>) -> Response {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP berth_connections Open AMQP connections.\n# TYPE berth_connections gauge"
    );
    let _ = writeln!(
        out,
        "berth_connections {}",
        st.connections.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "# HELP berth_message_bytes Bytes of message data held in memory.\n# TYPE berth_message_bytes gauge");
    let _ = writeln!(
        out,
        "berth_message_bytes {}",
        berth_broker::message::message_bytes()
    );
    for (metric, help) in [
        ("berth_queue_messages_ready", "Messages ready for delivery."),
        (
            "berth_queue_messages_unacked",
            "Messages delivered and not yet acknowledged.",
        ),
        ("berth_queue_consumers", "Consumers attached to the queue."),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for v in &st.shared.broker.vhosts() {
            for q in sorted_queues(v) {
                let s = q.stats();
                let value = match metric {
                    "berth_queue_messages_ready" => s.ready,
                    "berth_queue_messages_unacked" => s.unacked,
                    _ => s.consumers,
                };
                let _ = writeln!(
                    out,
                    "{metric}{{vhost=\"{}\",queue=\"{}\"}} {value}",
                    escape_label(&v.name),
                    escape_label(&q.name)
                );
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
