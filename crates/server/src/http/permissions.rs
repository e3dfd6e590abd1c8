//! `/api/permissions*`, `/api/users/{user}/permissions`,
//! `/api/vhosts/{vhost}/permissions` and `/api/topic-permissions*`:
//! RabbitMQ's permission endpoints (administrator only).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::{Permission, TopicPermission};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{access_error, bad_request, not_found};
use super::{AdminAuthed, HttpState};

pub(super) fn permission_json(vhost: &str, user: &str, p: &Permission) -> Value {
    json!({
        "user": user,
        "vhost": vhost,
        "configure": p.configure.source,
        "write": p.write.source,
        "read": p.read.source,
    })
}

pub(super) fn topic_json(vhost: &str, user: &str, t: &TopicPermission) -> Value {
    json!({
        "user": user,
        "vhost": vhost,
        "exchange": t.exchange,
        "write": t.write,
        "read": t.read,
    })
}

/// Every permission matching `keep(vhost, user)`.
fn permissions_where(st: &HttpState, keep: impl Fn(&str, &str) -> bool) -> Response {
    let all: Vec<Value> = st
        .shared
        .broker
        .access()
        .permissions()
        .iter()
        .filter(|(v, u, _)| keep(v, u))
        .map(|(v, u, p)| permission_json(v, u, p))
        .collect();
    Json(all).into_response()
}

pub async fn list(State(st): State<HttpState>, _: AdminAuthed) -> Response {
    permissions_where(&st, |_, _| true)
}

pub async fn of_user(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(user): Path<String>,
) -> Response {
    if st.shared.broker.access().user(&user).is_none() {
        return not_found();
    }
    permissions_where(&st, |_, u| u == user)
}

pub async fn of_vhost(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(vhost): Path<String>,
) -> Response {
    if st.shared.broker.vhost(&vhost).is_none() {
        return not_found();
    }
    permissions_where(&st, |v, _| v == vhost)
}

pub async fn get_one(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    match st.shared.broker.access().permission(&vhost, &user) {
        Some(p) => Json(permission_json(&vhost, &user, &p)).into_response(),
        None => not_found(),
    }
}

/// The body of `PUT /api/permissions/{vhost}/{user}`.
#[derive(Debug, Deserialize)]
pub struct PutPermission {
    configure: String,
    write: String,
    read: String,
}

pub async fn put(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
    body: Json<PutPermission>,
) -> Response {
    if st.shared.broker.vhost(&vhost).is_none() {
        return bad_request(format!("vhost '{vhost}' does not exist"));
    }
    let p = match Permission::new(&body.configure, &body.write, &body.read) {
        Ok(p) => p,
        Err(e) => return access_error(&e),
    };
    let existed = st
        .shared
        .broker
        .access()
        .permission(&vhost, &user)
        .is_some();
    match st.shared.broker.access().set_permission(&vhost, &user, p) {
        Ok(()) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub async fn delete(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    match st.shared.broker.access().clear_permission(&vhost, &user) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => access_error(&e),
    }
}

pub async fn topic_list(State(st): State<HttpState>, _: AdminAuthed) -> Response {
    let all: Vec<Value> = st
        .shared
        .broker
        .access()
        .topic_permissions()
        .iter()
        .map(|(v, u, t)| topic_json(v, u, t))
        .collect();
    Json(all).into_response()
}

pub async fn topic_get(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    let mine: Vec<Value> = st
        .shared
        .broker
        .access()
        .topic_permissions()
        .iter()
        .filter(|(v, u, _)| *v == vhost && *u == user)
        .map(|(v, u, t)| topic_json(v, u, t))
        .collect();
    if mine.is_empty() {
        return not_found();
    }
    Json(mine).into_response()
}

/// The body of `PUT /api/topic-permissions/{vhost}/{user}`.
#[derive(Debug, Deserialize)]
pub struct PutTopicPermission {
    exchange: String,
    write: String,
    read: String,
}

pub async fn topic_put(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
    body: Json<PutTopicPermission>,
) -> Response {
    if st.shared.broker.vhost(&vhost).is_none() {
        return bad_request(format!("vhost '{vhost}' does not exist"));
    }
    let t = TopicPermission {
        exchange: body.exchange.clone(),
        write: body.write.clone(),
        read: body.read.clone(),
    };
    match st
        .shared
        .broker
        .access()
        .set_topic_permission(&vhost, &user, t)
    {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub async fn topic_delete(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    match st
        .shared
        .broker
        .access()
        .clear_topic_permission(&vhost, &user, None)
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => access_error(&e),
    }
}
