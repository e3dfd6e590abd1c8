//! Connections, channels and consumers: lists, one connection, and
//! `DELETE /api/connections/{name}`, which closes it with
//! `320 CONNECTION_FORCED` and the `X-Reason` header's text.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::list::ListParams;
use super::{not_found, Authed, HttpState};
use crate::registry::ConnInfo;

/// RabbitMQ's reason when `X-Reason` is absent.
const DEFAULT_CLOSE_REASON: &str = "Closed via management plugin";

fn connection_json(c: &ConnInfo) -> Value {
    json!({
        "name": c.name,
        "node": super::overview::node_name(),
        "type": "network",
        "protocol": c.protocol,
        "state": "running",
        "user": c.user,
        "vhost": c.vhost,
        "host": c.local.ip().to_string(),
        "port": c.local.port(),
        "peer_host": c.peer.ip().to_string(),
        "peer_port": c.peer.port(),
        "channels": c.channels.lock().len(),
        "channel_max": c.channel_max,
        "frame_max": c.frame_max,
        "timeout": c.heartbeat_s,
        "connected_at": c.connected_at_ms,
        "client_properties": c.client_properties,
        "auth_mechanism": "PLAIN",
        "ssl": c.ssl,
    })
}

fn channels_json(c: &ConnInfo) -> Vec<Value> {
    c.channels
        .lock()
        .iter()
        .map(|(number, ch)| {
            json!({
                "name": format!("{} ({number})", c.name),
                "number": number,
                "node": super::overview::node_name(),
                "user": c.user,
                "vhost": c.vhost,
                "connection_details": {
                    "name": c.name,
                    "peer_host": c.peer.ip().to_string(),
                    "peer_port": c.peer.port(),
                },
                "consumer_count": ch.consumer_count(),
                "messages_unacknowledged": ch.unacked_count(),
                "transactional": ch.is_transactional(),
                "state": "running",
            })
        })
        .collect()
}

fn respond(items: Vec<Value>, q: &HashMap<String, String>) -> Response {
    match ListParams::parse(q) {
        Ok(p) => {
            let total = items.len();
            let kept = items
                .into_iter()
                .filter(|i| p.keeps(i["name"].as_str().unwrap_or("")))
                .collect();
            p.respond(kept, total)
        }
        Err(r) => r,
    }
}

/// The connections `user` may see, of one vhost or all.
fn connections(st: &HttpState, user: &Authed, vhost: Option<&str>) -> Vec<Arc<ConnInfo>> {
    st.shared
        .registry
        .list()
        .into_iter()
        .filter(|c| vhost.is_none_or(|v| c.vhost == v) && user.sees_connection(c))
        .collect()
}

/// The connection named in a URL, when `user` may see it.
fn visible(st: &HttpState, user: &Authed, name: &str) -> Option<Arc<ConnInfo>> {
    st.shared
        .registry
        .by_name(name)
        .filter(|c| user.sees_connection(c))
}

pub(super) async fn list(
    State(st): State<HttpState>,
    user: Authed,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    respond(
        connections(&st, &user, None)
            .iter()
            .map(|c| connection_json(c))
            .collect(),
        &q,
    )
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = user.vhost(&st, &vhost) {
        return r;
    }
    respond(
        connections(&st, &user, Some(&vhost))
            .iter()
            .map(|c| connection_json(c))
            .collect(),
        &q,
    )
}

pub(super) async fn one(
    State(st): State<HttpState>,
    user: Authed,
    Path(name): Path<String>,
) -> Response {
    visible(&st, &user, &name).map_or_else(not_found, |c| Json(connection_json(&c)).into_response())
}

/// `DELETE /api/connections/{name}`: 204 once the close is requested.
pub(super) async fn close(
    State(st): State<HttpState>,
    user: Authed,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(c) = visible(&st, &user, &name) else {
        return not_found();
    };
    if !user.may_close(&c) {
        return super::error::unauthorized("Not administrator user");
    }
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_CLOSE_REASON);
    tracing::info!(connection = %c.name, reason, "closing connection via the management API");
    c.close(reason.to_owned());
    StatusCode::NO_CONTENT.into_response()
}

pub(super) async fn channels_of(
    State(st): State<HttpState>,
    user: Authed,
    Path(name): Path<String>,
) -> Response {
    visible(&st, &user, &name).map_or_else(not_found, |c| Json(channels_json(&c)).into_response())
}

pub(super) async fn channels(
    State(st): State<HttpState>,
    user: Authed,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    respond(
        connections(&st, &user, None)
            .iter()
            .flat_map(|c| channels_json(c))
            .collect(),
        &q,
    )
}

pub(super) async fn channels_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = user.vhost(&st, &vhost) {
        return r;
    }
    respond(
        connections(&st, &user, Some(&vhost))
            .iter()
            .flat_map(|c| channels_json(c))
            .collect(),
        &q,
    )
}

fn consumers_json(vhosts: &[Arc<berth_broker::vhost::VHost>]) -> Vec<Value> {
    let mut out = Vec::new();
    for v in vhosts {
        for q in super::queues::sorted_queues(v) {
            for c in q.consumers() {
                out.push(json!({
                    "consumer_tag": c.tag,
                    "queue": {"name": q.name, "vhost": v.name},
                    "ack_required": !c.no_ack,
                    "exclusive": c.exclusive,
                    "prefetch_count": c.prefetch,
                    "active": true,
                    "activity_status": "up",
                    "arguments": {},
                }));
            }
        }
    }
    out
}

pub(super) async fn consumers(State(st): State<HttpState>, user: Authed) -> Response {
    Json(consumers_json(&user.vhosts(&st))).into_response()
}

pub(super) async fn consumers_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
) -> Response {
    match user.vhost(&st, &vhost) {
        Ok(v) => Json(consumers_json(&[v])).into_response(),
        Err(r) => r,
    }
}
