//! `/api/vhosts` and `/api/vhosts/{name}`: list and read (users who see
//! them), create and delete (administrator only). Deleting one closes its
//! connections with 320 and removes its queues, exchanges and permissions
//! durably.
//!
//! Invariants:
//! - Creating a vhost grants its creator full permissions there (`.*`
//!   three times), as RabbitMQ's management plugin does: an
//!   administrator acts in a vhost only with permissions in it (see
//!   `Authed::may`). A PUT of an existing vhost grants nothing.
//! - A vhost is shown with RabbitMQ 3.10's fields; berth keeps no
//!   description or tags, so `metadata` is always the empty one.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::Permission;
use berth_broker::vhost::VHost;
use serde_json::{json, Value};

use super::auth::{authenticate, sees_vhost};
use super::error::{access_error, not_found, unauthorized};
use super::{AdminAuthed, Authed, HttpState};

/// A vhost in RabbitMQ 3.10's JSON shape. Every queue berth makes by
/// default is classic; berth stores no description or tags for a vhost.
fn vhost_json(v: &VHost) -> Value {
    let totals = v.totals();
    json!({
        "name": v.name,
        "description": "",
        "tags": [],
        "metadata": {"description": "", "tags": []},
        "default_queue_type": "classic",
        "tracing": false,
        "messages": totals.ready + totals.unacked,
    })
}

/// The vhosts the user may see (all for `administrator` and `monitoring`),
/// sorted by name.
pub(super) async fn list(State(st): State<HttpState>, user: Authed) -> Response {
    let mut vhosts = user.vhosts(&st);
    vhosts.sort_by(|a, b| a.name.cmp(&b.name));
    Json(vhosts.iter().map(|v| vhost_json(v)).collect::<Vec<_>>()).into_response()
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
        Some(v) if sees_vhost(&st.shared, &u, &name) => Json(vhost_json(&v)).into_response(),
        // RabbitMQ answers a vhost the user may not see as it answers
        // missing tags.
        Some(_) => unauthorized("Not administrator user"),
        None => not_found(),
    }
}

/// `PUT /api/vhosts/{name}`: 201 and full permissions for the creator if
/// created, 204 if it existed.
pub(super) async fn put(
    State(st): State<HttpState>,
    AdminAuthed(creator): AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    let existed = st.shared.broker.vhost(&name).is_some();
    if let Err(e) = st.shared.broker.add_vhost(&name) {
        return access_error(&e);
    }
    if existed {
        return StatusCode::NO_CONTENT.into_response();
    }
    let granted = st
        .shared
        .broker
        .access()
        .set_permission(&name, &creator.name, Permission::all());
    match granted {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub(super) async fn delete(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    // The store waits run under block_in_place (see store_journal.rs).
    match st.shared.broker.delete_vhost(&name) {
        Ok(()) => {
            // Its runtime parameters go with it, as in RabbitMQ.
            super::shovels::forget_vhost(&st, &name);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => access_error(&e),
    }
}
