//! `/api/vhosts` and `/api/vhosts/{name}`: list and read (users who see
//! them), create and delete (administrator only). Deleting one closes its
//! connections with 320 and removes its queues, exchanges and permissions
//! durably.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::auth::{authenticate, sees_vhost};
use super::error::{access_error, not_found, unauthorized};
use super::{AdminAuthed, Authed, HttpState};

/// The vhosts the user may see (all for `administrator` and `monitoring`).
pub(super) async fn list(State(st): State<HttpState>, user: Authed) -> Response {
    let vhosts = user.vhosts(&st);
    let mut names: Vec<&str> = vhosts.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    Json(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()).into_response()
}

pub(super) async fn get_one(
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

pub(super) async fn put(
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

pub(super) async fn delete(
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
