//! Dynamic shovels over the management API, in RabbitMQ's shapes: the
//! `shovel` runtime parameters (`/api/parameters/shovel[/{vhost}[/{name}]]`,
//! GET, PUT with `{"value": {...}}`, DELETE) and their status
//! (`/api/shovels[/{vhost}]`, as `rabbitmq_shovel_management` shows it).
//! Checking a definition is [`crate::shovel::definition`]'s; running it is
//! [`crate::shovel`]'s. Changing a shovel takes the `policymaker` or
//! `administrator` tag, as changing any runtime parameter does in
//! RabbitMQ.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::{TAG_ADMINISTRATOR, TAG_POLICYMAKER};
use serde_json::{json, Value};

use super::auth::authenticate;
use super::error::unauthorized;
use super::{bad_request, not_found, HttpState};
use crate::shovel::definition::{self, Definition, Kind};
use crate::shovel::saved::SavedError;
use crate::shovel::status::status_json;
use crate::shovel::Shovels;

/// A shovel as a runtime parameter.
pub(crate) fn parameter_json(def: &Definition) -> Value {
    json!({
        "vhost": def.vhost,
        "component": "shovel",
        "name": def.name,
        "value": def.value,
    })
}

/// The shovels, or the answer of a broker that runs none (a cluster
/// member).
fn shovels(st: &HttpState) -> Result<&Arc<Shovels>, Response> {
    st.shared.shovels.as_ref().ok_or_else(|| {
        (
            StatusCode::NOT_IMPLEMENTED,
            Json(json!({"error": "not_implemented",
                "reason": "shovels are not supported on a cluster member yet (docs/SHOVELS.md)"})),
        )
            .into_response()
    })
}

fn saved_error(e: &SavedError) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": "internal_error", "reason": e.to_string()})),
    )
        .into_response()
}

/// Names of the vhosts `user` may see.
fn visible(st: &HttpState, user: &super::Authed) -> Vec<String> {
    user.vhosts(st).iter().map(|v| v.name.clone()).collect()
}

/// What a listing shows of each shovel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    /// The runtime parameter (`/api/parameters/shovel`): dynamic shovels
    /// only, as a static shovel is none.
    Parameter,
    /// The status (`/api/shovels`): static shovels too, to administrators
    /// only (they belong to no vhost), as RabbitMQ's shovel management
    /// shows them.
    Status,
}

/// The shovels of `vhost` (or of every vhost `user` may see) as `row`s.
fn listing(st: &HttpState, user: &super::Authed, vhost: Option<&str>, row: Row) -> Response {
    let s = match shovels(st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let seen = match vhost {
        Some(v) => match user.vhost(st, v) {
            Ok(_) => vec![v.to_owned()],
            Err(r) => return r,
        },
        None => visible(st, user),
    };
    let admin = user.0.has_tag(TAG_ADMINISTRATOR);
    let rows: Vec<Value> = (s.list(vhost).iter())
        .filter(|l| match l.def.kind {
            Kind::Dynamic => seen.contains(&l.def.vhost),
            Kind::Static => row == Row::Status && admin,
        })
        .map(|l| match row {
            Row::Parameter => parameter_json(&l.def),
            Row::Status => status_json(&l.def, &l.status, s.node()),
        })
        .collect();
    Json(Value::Array(rows)).into_response()
}

pub(super) async fn parameters(State(st): State<HttpState>, user: super::Authed) -> Response {
    listing(&st, &user, None, Row::Parameter)
}

pub(super) async fn parameters_in(
    State(st): State<HttpState>,
    user: super::Authed,
    Path(vhost): Path<String>,
) -> Response {
    listing(&st, &user, Some(&vhost), Row::Parameter)
}

pub(super) async fn parameter(
    State(st): State<HttpState>,
    user: super::Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let s = match shovels(&st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = user.vhost(&st, &vhost) {
        return r;
    }
    match s.get(&vhost, &name) {
        Some(def) => Json(parameter_json(&def)).into_response(),
        None => not_found(),
    }
}

/// The caller may change shovels in `vhost` (a policymaker only in vhosts
/// it has permissions in).
fn authorise(
    st: &HttpState,
    headers: &HeaderMap,
    peer: SocketAddr,
    vhost: &str,
) -> Result<(), Response> {
    let u = authenticate(&st.shared, headers, peer)?;
    if !(u.has_tag(TAG_POLICYMAKER) || u.has_tag(TAG_ADMINISTRATOR)) {
        return Err(unauthorized("Not authorised to change runtime parameters"));
    }
    super::Authed(u).vhost(st, vhost).map(|_| ())
}

/// The definition a PUT body (`{"value": {...}}`, RabbitMQ's shape; the
/// `vhost`, `component` and `name` it may repeat must match the URL)
/// holds.
pub(crate) fn from_body(vhost: &str, name: &str, body: &Value) -> Result<Definition, String> {
    let Value::Object(m) = body else {
        return Err("the body must be a JSON object {\"value\": {...}}".into());
    };
    for (key, expected) in [("vhost", vhost), ("name", name), ("component", "shovel")] {
        match m.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == expected => {}
            Some(other) => {
                return Err(format!(
                    "{key} in the body is {other}, the URL says \"{expected}\""
                ))
            }
        }
    }
    if let Some(k) = m
        .keys()
        .find(|k| !["value", "vhost", "name", "component"].contains(&k.as_str()))
    {
        return Err(format!(
            "{k} is not a field of a parameter (value, vhost, name, component); \
             shovel fields go inside \"value\""
        ));
    }
    let value = m
        .get("value")
        .ok_or("the body must have a \"value\" object with the shovel's fields")?;
    let def = definition::parse(vhost, name, value)?;
    crate::shovel::check_files(&def)?;
    Ok(def)
}

pub(super) async fn put(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = authorise(&st, &headers, peer, &vhost) {
        return r;
    }
    let s = match shovels(&st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("the request body is not valid JSON: {e}")),
    };
    let def = match from_body(&vhost, &name, &body) {
        Ok(d) => d,
        Err(why) => return bad_request(why),
    };
    match s.put(def) {
        Ok(true) => StatusCode::CREATED.into_response(),
        Ok(false) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => saved_error(&e),
    }
}

pub(super) async fn delete(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = authorise(&st, &headers, peer, &vhost) {
        return r;
    }
    let s = match shovels(&st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match s.delete(&vhost, &name) {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => not_found(),
        Err(e) => saved_error(&e),
    }
}

pub(super) async fn status(State(st): State<HttpState>, user: super::Authed) -> Response {
    listing(&st, &user, None, Row::Status)
}

pub(super) async fn status_in(
    State(st): State<HttpState>,
    user: super::Authed,
    Path(vhost): Path<String>,
) -> Response {
    listing(&st, &user, Some(&vhost), Row::Status)
}

/// `GET /api/shovels/vhost/{vhost}/{name}` (RabbitMQ 3.10): one shovel's
/// status.
pub(super) async fn status_one(
    State(st): State<HttpState>,
    user: super::Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let s = match shovels(&st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = user.vhost(&st, &vhost) {
        return r;
    }
    match s.list(Some(&vhost)).iter().find(|l| l.def.name == name) {
        Some(l) => Json(status_json(&l.def, &l.status, s.node())).into_response(),
        None => not_found(),
    }
}

/// The shovels of a deleted vhost are deleted with it (a failure to
/// write the file is logged: the vhost is gone either way).
pub(super) fn forget_vhost(st: &HttpState, vhost: &str) {
    let Some(s) = &st.shared.shovels else { return };
    for l in s.list(Some(vhost)) {
        if let Err(e) = s.delete(vhost, &l.def.name) {
            tracing::error!(vhost, shovel = %l.def.name, error = %e,
                "the shovel of a deleted vhost could not be deleted");
        }
    }
}

/// `DELETE /api/shovels/vhost/{vhost}/{name}/restart` (RabbitMQ 3.10):
/// stops the shovel (what it held goes back to its source) and starts it
/// again at once.
pub(super) async fn restart(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = authorise(&st, &headers, peer, &vhost) {
        return r;
    }
    let s = match shovels(&st) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if s.restart(&vhost, &name) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found()
    }
}
