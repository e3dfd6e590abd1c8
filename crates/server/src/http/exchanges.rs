//! Exchanges: list (all, per vhost) with RabbitMQ's list parameters, GET,
//! PUT (declare) and DELETE (`if-unused`). The default exchange is named
//! `amq.default` in URLs.
//!
//! Invariants:
//! - An exchange is shown with RabbitMQ 3.10's fields. berth does not
//!   record who declared an exchange, so `user_who_performed_action` is
//!   RabbitMQ's internal user for the default and `amq.*` exchanges and
//!   empty for the others; it keeps no per-link publish statistics, so a
//!   single exchange's `incoming` and `outgoing` are empty lists.

use berth_broker::access::{Perm, Resource};
use berth_broker::args::as_string;
use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::vhost::{ExchangeDeclare, VHost};
use serde_json::{json, Value};

use super::list::ListParams;
use super::{
    amqp_error, bad_request, exchange_name, flag, json_table, not_found, query_flag, table_json,
    vhost_or_404, Authed, HttpState,
};
use crate::permissions::Action;

/// RabbitMQ's name for the broker itself as the actor that made an
/// object (`?INTERNAL_USER`): the built-in exchanges are its.
const INTERNAL_USER: &str = "rmq-internal";

/// Who declared exchange `name`, as far as berth knows (see the module
/// invariants).
fn declared_by(name: &str) -> &'static str {
    if name.is_empty() || name.starts_with("amq.") {
        INTERNAL_USER
    } else {
        ""
    }
}

pub(crate) fn exchanges_json(v: &VHost) -> Vec<Value> {
    let mut es = v.exchanges();
    es.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = vec![
        json!({"name": "", "vhost": v.name, "type": "direct", "durable": true, "auto_delete": false, "internal": false, "arguments": {}, "user_who_performed_action": INTERNAL_USER}),
    ];
    out.extend(es.iter().map(|e| {
        let mut x = json!({
            "name": e.name,
            "vhost": v.name,
            "type": e.type_name(),
            "durable": e.durable,
            "auto_delete": e.auto_delete,
            "internal": e.internal,
            "arguments": table_json(&e.arguments),
            "user_who_performed_action": declared_by(&e.name),
        });
        // A delayed exchange's pending messages (the plugin's
        // `messages_delayed`) and when the first is due.
        if let Some(d) = e.delayed.as_ref() {
            let s = d.stats();
            x["messages_delayed"] = json!(s.messages);
            x["delayed_next_due_unix_ms"] = json!(s.next_due_unix_ms);
            x["delayed_routed"] = json!(s.routed);
            x["delayed_lateness_ms_max"] = json!(s.lateness_ms_max);
        }
        // RabbitMQ 3.10 shows `policy` only when one applies.
        if let Some(p) = e.applied_policies().policy {
            x["policy"] = json!(p.name);
        }
        x
    }));
    out
}

fn respond(vhosts: &[std::sync::Arc<VHost>], q: &HashMap<String, String>) -> Response {
    let p = match ListParams::parse(q) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let all: Vec<Value> = vhosts.iter().flat_map(|v| exchanges_json(v)).collect();
    let total = all.len();
    let kept = all
        .into_iter()
        .filter(|e| p.keeps(e["name"].as_str().unwrap_or("")))
        .collect();
    p.respond(kept, total)
}

pub(super) async fn list_all(
    State(st): State<HttpState>,
    user: Authed,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    respond(&user.vhosts(&st), &q)
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    match user.vhost(&st, &vhost) {
        Ok(v) => respond(&[v], &q),
        Err(r) => r,
    }
}

pub(super) async fn one(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let name = exchange_name(&name);
    exchanges_json(&v)
        .into_iter()
        .find(|e| e["name"] == name)
        .map_or_else(not_found, |mut e| {
            e["incoming"] = json!([]);
            e["outgoing"] = json!([]);
            Json(e).into_response()
        })
}

/// `PUT /api/exchanges/{vhost}/{name}`: 201 if created, 204 if it existed
/// with the same properties, 400 if they differ.
pub(super) async fn put(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
    body: Option<Json<Value>>,
) -> Response {
    let body = body.map_or(Value::Null, |Json(b)| b);
    let arguments = match json_table(body.get("arguments").unwrap_or(&Value::Null)) {
        Ok(a) => a,
        Err(why) => return bad_request(format!("arguments: {why}")),
    };
    let ae = arguments
        .inner()
        .get("alternate-exchange")
        .and_then(as_string);
    let declare = Action::DeclareExchange {
        name: &name,
        alternate_exchange: ae.as_deref(),
    };
    if let Err(r) = user.may(&st, &vhost, &[declare]) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(kind) = body.get("type").and_then(Value::as_str) else {
        return bad_request("exchange type is required (\"type\": \"direct\", \"fanout\", \"topic\" or \"headers\")");
    };
    let flags = (
        flag(&body, "durable", true),
        flag(&body, "auto_delete", false),
        flag(&body, "internal", false),
    );
    let (durable, auto_delete, internal) = match flags {
        (Ok(d), Ok(a), Ok(i)) => (d, a, i),
        (Err(r), _, _) | (_, Err(r), _) | (_, _, Err(r)) => return r,
    };
    let existed = v.exchange(&name).is_ok();
    let d = ExchangeDeclare {
        kind: kind.to_owned(),
        passive: false,
        durable,
        auto_delete,
        internal,
        arguments,
    };
    match v.declare_exchange(&name, &d) {
        Ok(()) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/exchanges/{vhost}/{name}[?if-unused=true]`.
pub(super) async fn delete(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[Action::On(Resource::Exchange(&name), Perm::Configure)],
    ) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let name = exchange_name(&name);
    if !name.is_empty() && v.exchange(name).is_err() {
        return not_found();
    }
    match v.delete_exchange(name, query_flag(&q, "if-unused")) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}
