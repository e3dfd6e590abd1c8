//! `/api/policies` and `/api/operator-policies`: list (all, per vhost),
//! GET, PUT and DELETE one, in RabbitMQ's JSON shape. Changing a policy
//! takes the `policymaker` or `administrator` tag, an operator policy the
//! `administrator` tag (RabbitMQ's rules). Validation is the broker's
//! ([`berth_broker::policy::Policy::new`]); a refusal is a 400 with
//! RabbitMQ's `{"error":"bad_request","reason":...}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::{TAG_ADMINISTRATOR, TAG_POLICYMAKER};
use berth_broker::policy::{ApplyTo, Policy, PolicyKind};
use berth_broker::vhost::VHost;
use berth_broker::Broker;
use serde_json::{json, Value};

use super::auth::authenticate;
use super::error::{access_error, unauthorized};
use super::{bad_request, json_table, not_found, table_json, HttpState};

/// A policy in RabbitMQ's JSON shape.
pub(crate) fn policy_json(p: &Policy) -> Value {
    json!({
        "vhost": p.vhost,
        "name": p.name,
        "pattern": p.pattern,
        "apply-to": p.apply_to.as_str(),
        "definition": table_json(&p.definition),
        "priority": p.priority,
    })
}

fn kind_of(operator: bool) -> PolicyKind {
    if operator {
        PolicyKind::Operator
    } else {
        PolicyKind::Policy
    }
}

fn of_vhost(v: &VHost, kind: PolicyKind) -> Vec<Value> {
    v.policies()
        .map(kind)
        .values()
        .map(|p| policy_json(p))
        .collect()
}

/// Every policy of `kind` in every vhost (definitions export).
pub(crate) fn all_json(broker: &Broker, kind: PolicyKind) -> Vec<Value> {
    broker
        .vhosts()
        .iter()
        .flat_map(|v| of_vhost(v, kind))
        .collect()
}

/// Builds a policy from a PUT body or a definitions entry.
pub(crate) fn from_json(
    kind: PolicyKind,
    vhost: &str,
    name: &str,
    body: &Value,
) -> Result<Policy, String> {
    let pattern = body["pattern"]
        .as_str()
        .ok_or("Validation failed\n\npattern is required and must be a string\n")?;
    let apply_to = match &body["apply-to"] {
        Value::Null => ApplyTo::All,
        Value::String(s) => ApplyTo::parse(s).map_err(|e| e.0)?,
        other => {
            return Err(format!(
                "Validation failed\n\n{other} is not a valid apply-to value\n"
            ))
        }
    };
    let priority = match &body["priority"] {
        Value::Null => 0,
        Value::Number(n) => n.as_i64().ok_or_else(|| {
            format!("Validation failed\n\n{n} is not a valid priority: expected an integer\n")
        })?,
        Value::String(s) => s.parse().map_err(|_| {
            format!("Validation failed\n\n\"{s}\" is not a valid priority: expected an integer\n")
        })?,
        other => {
            return Err(format!(
                "Validation failed\n\n{other} is not a valid priority: expected an integer\n"
            ))
        }
    };
    let definition = match &body["definition"] {
        d @ Value::Object(_) => json_table(d).map_err(definition_error)?,
        // rabbitmqadmin and some tools send the definition as a JSON string.
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(d @ Value::Object(_)) => json_table(&d).map_err(definition_error)?,
            _ => return Err("Validation failed\n\ndefinition must be a JSON object\n".into()),
        },
        _ => {
            return Err(
                "Validation failed\n\ndefinition is required and must be a JSON object\n".into(),
            )
        }
    };
    Policy::new(kind, vhost, name, pattern, apply_to, priority, definition).map_err(|e| e.0)
}

pub(super) async fn list(
    State(st): State<HttpState>,
    user: super::Authed,
    uri: axum::http::Uri,
) -> Response {
    let kind = kind_of(uri.path().starts_with("/api/operator-policies"));
    let all: Vec<Value> = user
        .vhosts(&st)
        .iter()
        .flat_map(|v| of_vhost(v, kind))
        .collect();
    Json(Value::Array(all)).into_response()
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    user: super::Authed,
    uri: axum::http::Uri,
    Path(vhost): Path<String>,
) -> Response {
    let kind = kind_of(uri.path().starts_with("/api/operator-policies"));
    match user.vhost(&st, &vhost) {
        Ok(v) => Json(Value::Array(of_vhost(&v, kind))).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn one(
    State(st): State<HttpState>,
    user: super::Authed,
    uri: axum::http::Uri,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let kind = kind_of(uri.path().starts_with("/api/operator-policies"));
    let v = match user.vhost(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    match v.policies().map(kind).get(&name) {
        Some(p) => Json(policy_json(p)).into_response(),
        None => not_found(),
    }
}

/// The caller may change policies of `kind` in `vhost` (a policymaker
/// only in vhosts it has permissions in, as in RabbitMQ); the vhost.
fn authorise(
    st: &HttpState,
    headers: &HeaderMap,
    peer: SocketAddr,
    kind: PolicyKind,
    vhost: &str,
) -> Result<Arc<berth_broker::vhost::VHost>, Response> {
    let u = authenticate(&st.shared, headers, peer)?;
    let allowed = match kind {
        PolicyKind::Policy => u.has_tag(TAG_POLICYMAKER) || u.has_tag(TAG_ADMINISTRATOR),
        PolicyKind::Operator => u.has_tag(TAG_ADMINISTRATOR),
    };
    if !allowed {
        return Err(unauthorized("Not authorised to change policies"));
    }
    super::Authed(u).vhost(st, vhost)
}

pub(super) async fn put(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let kind = kind_of(uri.path().starts_with("/api/operator-policies"));
    let v = match authorise(&st, &headers, peer, kind, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("the request body is not valid JSON: {e}")),
    };
    let existed = v.policies().map(kind).contains_key(&name);
    let policy = match from_json(kind, &vhost, &name, &body) {
        Ok(p) => p,
        Err(why) => return bad_request(why),
    };
    match st.shared.broker.set_policy(policy) {
        Ok(()) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => access_error(&e),
    }
}

pub(super) async fn delete(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let kind = kind_of(uri.path().starts_with("/api/operator-policies"));
    if let Err(r) = authorise(&st, &headers, peer, kind, &vhost) {
        return r;
    }
    match st.shared.broker.delete_policy(kind, &vhost, &name) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => access_error(&e),
    }
}

/// `policy`, `operator_policy` and `effective_policy_definition` of a
/// queue, as RabbitMQ 3.10 shows them (`null` when none applies).
pub(crate) fn queue_policy_fields(q: &berth_broker::queue::Queue) -> [(&'static str, Value); 3] {
    let a = q.applied_policies();
    let name = |p: &Option<Arc<Policy>>| p.as_ref().map_or(Value::Null, |p| json!(p.name));
    [
        ("policy", name(&a.policy)),
        ("operator_policy", name(&a.operator)),
        (
            "effective_policy_definition",
            table_json(&a.effective_definition()),
        ),
    ]
}

/// A definition key that cannot be a field name, as a validation failure.
fn definition_error(why: String) -> String {
    format!("Validation failed\n\ndefinition: {why}\n")
}
