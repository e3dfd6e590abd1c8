//! Bindings: list (all, per vhost, per queue, per exchange as source or
//! destination), `e/{source}/q/{queue}` and `e/{source}/e/{destination}`
//! (GET, POST with a `Location` header) and one binding by its
//! `properties_key` (GET, DELETE).
//!
//! Invariants:
//! - A binding's `properties_key` is its routing key (URL-quoted, `~` for
//!   an empty key) when it has no arguments, else the key, `~` and a hash
//!   of the arguments, so the same binding always has the same key.

use crate::permissions::Action;
use berth_broker::access::Resource;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::exchange::Destination;
use berth_broker::vhost::VHost;
use serde_json::{json, Value};

use super::list::ListParams;
use super::queues::{sorted_queues, API_CONNECTION_ID};
use super::{
    amqp_error, bad_request, exchange_name, json_table, not_found, table_json, vhost_or_404,
    Authed, HttpState,
};

/// URL-quotes like Erlang's `quote_plus`, and `~` too (it separates the
/// key from the arguments hash).
fn quote(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => out.push(b as char),
            b' ' => out.push('+'),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

fn properties_key(routing_key: &str, arguments: &Value) -> String {
    let no_args = arguments.as_object().is_none_or(serde_json::Map::is_empty);
    match (routing_key.is_empty(), no_args) {
        (true, true) => "~".to_owned(),
        (false, true) => quote(routing_key),
        _ => {
            // FNV-1a over the canonical JSON (serde_json sorts keys).
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in arguments.to_string().bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            format!("{}~{h:016x}", quote(routing_key))
        }
    }
}

fn binding_json(
    vhost: &str,
    source: &str,
    dest: &str,
    dest_type: &str,
    key: &str,
    args: Value,
) -> Value {
    json!({
        "source": source,
        "vhost": vhost,
        "destination": dest,
        "destination_type": dest_type,
        "routing_key": key,
        "properties_key": properties_key(key, &args),
        "arguments": args,
    })
}

/// Every binding of a vhost, the default exchange's implicit ones first,
/// as RabbitMQ lists them.
pub(crate) fn vhost_bindings(v: &VHost) -> Vec<Value> {
    let mut out: Vec<Value> = sorted_queues(v)
        .iter()
        .map(|q| binding_json(&v.name, "", &q.name, "queue", &q.name, json!({})))
        .collect();
    let mut es = v.exchanges();
    es.sort_by(|a, b| a.name.cmp(&b.name));
    for e in es {
        for b in e.bindings() {
            let (dest, kind) = match &b.destination {
                Destination::Queue(q) => (q.name.clone(), "queue"),
                Destination::Exchange(x) => (x.clone(), "exchange"),
            };
            out.push(binding_json(
                &v.name,
                &e.name,
                &dest,
                kind,
                &b.routing_key,
                table_json(&b.arguments),
            ));
        }
    }
    out
}

fn respond(items: Vec<Value>, q: &HashMap<String, String>) -> Response {
    match ListParams::parse(q) {
        Ok(p) => {
            let total = items.len();
            p.respond(items, total)
        }
        Err(r) => r,
    }
}

pub(super) async fn list_all(
    State(st): State<HttpState>,
    user: Authed,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let all = user
        .vhosts(&st)
        .iter()
        .flat_map(|v| vhost_bindings(v))
        .collect();
    respond(all, &q)
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    match user.vhost(&st, &vhost) {
        Ok(v) => respond(vhost_bindings(&v), &q),
        Err(r) => r,
    }
}

fn filtered(st: &HttpState, vhost: &str, keep: impl Fn(&Value) -> bool) -> Response {
    match vhost_or_404(st, vhost) {
        Ok(v) => Json(
            vhost_bindings(&v)
                .into_iter()
                .filter(keep)
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

pub(super) async fn of_queue(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    if let Err(r) = super::queues::find(&st, &vhost, &name) {
        return r;
    }
    filtered(&st, &vhost, |b| {
        b["destination_type"] == "queue" && b["destination"] == name.as_str()
    })
}

fn exchange_exists(v: &VHost, name: &str) -> bool {
    name.is_empty() || v.exchange(name).is_ok()
}

pub(super) async fn of_source(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let name = exchange_name(&name).to_owned();
    match vhost_or_404(&st, &vhost) {
        Ok(v) if exchange_exists(&v, &name) => {}
        Ok(_) => return not_found(),
        Err(r) => return r,
    }
    filtered(&st, &vhost, |b| b["source"] == name.as_str())
}

pub(super) async fn of_destination(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let name = exchange_name(&name).to_owned();
    match vhost_or_404(&st, &vhost) {
        Ok(v) if exchange_exists(&v, &name) => {}
        Ok(_) => return not_found(),
        Err(r) => return r,
    }
    filtered(&st, &vhost, |b| {
        b["destination_type"] == "exchange" && b["destination"] == name.as_str()
    })
}

/// The endpoints of `e/{source}/{q|e}/{destination}` checked to exist.
fn endpoints(
    st: &HttpState,
    vhost: &str,
    source: &str,
    kind: &str,
    destination: &str,
) -> Result<(Arc<VHost>, &'static str), Response> {
    let v = vhost_or_404(st, vhost)?;
    let kind = match kind {
        "q" => "queue",
        "e" => "exchange",
        _ => return Err(not_found()),
    };
    let dest_ok = if kind == "queue" {
        v.find_queue(destination).is_some()
    } else {
        exchange_exists(&v, destination)
    };
    if !exchange_exists(&v, source) || !dest_ok {
        return Err(not_found());
    }
    Ok((v, kind))
}

fn matching(v: &VHost, source: &str, kind: &str, destination: &str) -> Vec<Value> {
    vhost_bindings(v)
        .into_iter()
        .filter(|b| {
            b["source"] == source
                && b["destination_type"] == kind
                && b["destination"] == destination
        })
        .collect()
}

pub(super) async fn between(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let source = exchange_name(&source);
    match endpoints(&st, &vhost, source, &kind, &destination) {
        Ok((v, kind)) => Json(matching(&v, source, kind, &destination)).into_response(),
        Err(r) => r,
    }
}

/// `POST .../e/{source}/{q|e}/{destination}` with `routing_key` and
/// `arguments`: 201 and the new binding's URL in `Location`.
pub(super) async fn create(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
    body: Option<Json<Value>>,
) -> Response {
    let body = body.map_or(Value::Null, |Json(b)| b);
    let key = match body.get("routing_key") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return bad_request("routing_key must be a string"),
    };
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[bind_action(
            exchange_name(&source),
            &kind,
            &destination,
            key,
        )],
    ) {
        return r;
    }
    let source = exchange_name(&source);
    let (v, kind) = match endpoints(&st, &vhost, source, &kind, &destination) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let args_json = body.get("arguments").cloned().unwrap_or_else(|| json!({}));
    let args = match json_table(&args_json) {
        Ok(a) => a,
        Err(why) => return bad_request(format!("arguments: {why}")),
    };
    let bound = if kind == "queue" {
        let owner = v
            .find_queue(&destination)
            .and_then(|q| q.exclusive_owner)
            .unwrap_or(API_CONNECTION_ID);
        v.bind_queue(owner, &destination, source, key, &args)
    } else {
        v.bind_exchange(&destination, source, key, &args)
    };
    if let Err(e) = bound {
        return amqp_error(&e);
    }
    // Relative, as RabbitMQ sends it: `{destination}/{properties_key}`.
    let location = format!(
        "{}/{}",
        quote(&destination),
        quote(&properties_key(key, &table_json(&args)))
    );
    (StatusCode::CREATED, [(header::LOCATION, location)]).into_response()
}

fn find_one(
    st: &HttpState,
    vhost: &str,
    source: &str,
    kind: &str,
    destination: &str,
    props: &str,
) -> Result<(Arc<VHost>, &'static str, Value), Response> {
    let (v, kind) = endpoints(st, vhost, source, kind, destination)?;
    let b = matching(&v, source, kind, destination)
        .into_iter()
        .find(|b| b["properties_key"] == props)
        .ok_or_else(not_found)?;
    Ok((v, kind, b))
}

pub(super) async fn one(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, source, kind, destination, props)): Path<(String, String, String, String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    match find_one(
        &st,
        &vhost,
        exchange_name(&source),
        &kind,
        &destination,
        &props,
    ) {
        Ok((_, _, b)) => Json(b).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn remove(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, source, kind, destination, props)): Path<(String, String, String, String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let url_kind = kind;
    let source = exchange_name(&source);
    let (v, kind, b) = match find_one(&st, &vhost, source, &url_kind, &destination, &props) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let key = b["routing_key"].as_str().unwrap_or("");
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[bind_action(source, &url_kind, &destination, key)],
    ) {
        return r;
    }
    // The arguments as stored (JSON loses AMQP integer widths).
    let Some(args) = v.exchange(source).ok().and_then(|e| {
        e.bindings()
            .into_iter()
            .find(|x| {
                let dest = match &x.destination {
                    Destination::Queue(q) => q.name.as_str(),
                    Destination::Exchange(n) => n.as_str(),
                };
                dest == destination
                    && x.routing_key == key
                    && properties_key(key, &table_json(&x.arguments)) == props
            })
            .map(|x| x.arguments)
    }) else {
        return not_found();
    };
    let unbound = if kind == "queue" {
        let owner = v
            .find_queue(&destination)
            .and_then(|q| q.exclusive_owner)
            .unwrap_or(API_CONNECTION_ID);
        v.unbind_queue(owner, &destination, source, key, &args)
    } else {
        v.unbind_exchange(&destination, source, key, &args)
    };
    match unbound {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// What a binding change asks of the user's permissions, as `queue.bind`
/// and `exchange.bind` ask over AMQP (`source` as the broker names it:
/// the default exchange is empty).
fn bind_action<'a>(
    source: &'a str,
    kind: &str,
    destination: &'a str,
    routing_key: &'a str,
) -> Action<'a> {
    let destination = if kind == "q" {
        Resource::Queue(destination)
    } else {
        Resource::Exchange(destination)
    };
    Action::Bind {
        destination,
        source,
        routing_key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_keys_follow_rabbitmq_for_argumentless_bindings() {
        assert_eq!(properties_key("", &json!({})), "~");
        assert_eq!(properties_key("order.created", &json!({})), "order.created");
        assert_eq!(properties_key("a b~c", &json!({})), "a+b%7Ec");
        let k = properties_key("k", &json!({"x-match": "all"}));
        assert!(k.starts_with("k~"), "{k}");
        assert_ne!(k, properties_key("k", &json!({"x-match": "any"})));
    }
}
