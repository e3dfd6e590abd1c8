//! `/api/vhosts/{name}`: read (users who see it), create and delete
//! (administrator only). Deleting one closes its connections with 320 and
//! removes its queues, exchanges and permissions durably.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::http::{access_error, authenticate, not_found, sees_vhost, unauthorized};
use crate::http::{AdminAuthed, HttpState};

pub async fn get_one(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let u = match authenticate(&st.shared, &headers, peer) {
        Ok(u) => u,
        Err(r) => return r,
    };
    match st.shared.broker.vhost(&name) {
        Some(v) if sees_vhost(&st.shared, &u, &name) => Json(json!({
            "name": v.name,
            "description": "",
            "tags": [],
            "tracing": false,
            "messages": v.queues().iter().map(|q| { let s = q.stats(); s.ready + s.unacked }).sum::<usize>(),
        }))
        .into_response(),
        // RabbitMQ answers a vhost the user may not see as it answers
        // missing tags.
        Some(_) => unauthorized("Not administrator user"),
        None => not_found(),
    }
}

pub async fn put(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    let existed = st.shared.broker.vhost(&name).is_some();
    match st.shared.broker.add_vhost(&name) {
        Ok(_) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub async fn delete(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    // The store waits run under block_in_place (see journal.rs).
    match st.shared.broker.delete_vhost(&name) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => access_error(&e),
    }
}
