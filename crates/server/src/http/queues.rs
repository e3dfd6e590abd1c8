//! Queues: list (all, per vhost) with RabbitMQ's list parameters, GET,
//! PUT (declare), DELETE (`if-empty`, `if-unused`) and
//! `DELETE .../contents` (purge).

use berth_broker::access::{Perm, Resource};
use berth_broker::args::as_string;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::args::QueueType;
use berth_broker::queue::Queue;
use berth_broker::vhost::{QueueDeclare, VHost};
use serde_json::{json, Value};

use super::cluster::Members;
use super::list::ListParams;
use super::{
    amqp_error, bad_request, flag, json_table, not_found, query_flag, table_json, vhost_or_404,
    Authed, HttpState,
};
use crate::permissions::Action;

/// The management API never owns an exclusive queue: connection ids start
/// at 1.
pub(crate) const API_CONNECTION_ID: u64 = 0;

fn rate(r: f64) -> Value {
    json!({ "rate": r })
}

/// A queue in RabbitMQ's JSON shape. `stats` adds `message_stats`; in a
/// cluster, `members` adds the quorum-queue fields.
pub(crate) fn queue_json(q: &Queue, stats: bool, members: Option<&Members>) -> Value {
    let s = q.stats();
    let mut v = json!({
        "name": q.name,
        "vhost": q.vhost_name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner.is_some(),
        "arguments": table_json(&q.arguments),
        "type": match q.declared_args.queue_type { QueueType::Classic => "classic", QueueType::Quorum => "quorum", QueueType::Stream => "stream" },
        "node": super::overview::node_name(),
        "messages": s.ready + s.unacked,
        "messages_ready": s.ready,
        "messages_unacknowledged": s.unacked,
        "message_bytes_ready": s.ready_bytes,
        "messages_paged_out": s.paged_out,
        "messages_ram": s.ready - s.paged_out + s.unacked,
        "consumers": s.consumers,
        "state": "running",
        // berth's: returned messages waiting for their delayed retry
        // (docs/DELAYED.md), counted apart from ready and unacked.
        "messages_delayed": s.retrying,
    });
    if let Some(st) = q.stream_stats() {
        super::stream_fields::add(&mut v, &st);
    }
    for (k, x) in super::policies::queue_policy_fields(q) {
        v[k] = x;
    }
    if let Some(m) = members {
        m.add_to(&mut v);
    }
    if stats {
        let c = q.counters.snapshot();
        v["message_stats"] = json!({
            "publish": c.published,
            "publish_details": rate(c.published_rate),
            "deliver_get": c.delivered,
            "deliver_get_details": rate(c.delivered_rate),
            "ack": c.acked,
            "ack_details": rate(c.acked_rate),
        });
    }
    v
}

/// A queue with `disable_stats` / `enable_queue_totals` applied.
fn listed(q: &Queue, p: &ListParams, members: Option<&Members>) -> Value {
    if !p.disable_stats {
        return queue_json(q, true, members);
    }
    let full = queue_json(q, false, members);
    let mut keep = vec![
        "name",
        "vhost",
        "durable",
        "auto_delete",
        "exclusive",
        "arguments",
        "type",
        "policy",
        "operator_policy",
        "effective_policy_definition",
        "node",
        "state",
    ];
    if p.enable_queue_totals {
        keep.extend(["messages", "messages_ready", "messages_unacknowledged"]);
    }
    Value::Object(
        keep.iter()
            .filter_map(|k| full.get(*k).map(|v| ((*k).to_owned(), v.clone())))
            .collect(),
    )
}

/// A vhost's queues in name order (the vhost keeps them so).
pub(crate) fn sorted_queues(v: &VHost) -> Vec<Arc<Queue>> {
    v.queues()
}

/// The queues of one page in natural order (vhost, then name), visiting
/// only the page's queues: whole vhosts before it are skipped by count.
fn page_of(vhosts: &[Arc<VHost>], mut skip: usize, mut take: usize) -> (Vec<Arc<Queue>>, usize) {
    let mut page = Vec::new();
    let mut total = 0;
    for v in vhosts {
        let n = v.queue_count();
        total += n;
        if take == 0 || skip >= n {
            skip = skip.saturating_sub(n);
            continue;
        }
        let got = v.queue_page(skip, take);
        skip = 0;
        take -= got.len();
        page.extend(got);
    }
    (page, total)
}

fn respond(
    vhosts: &[Arc<VHost>],
    q: &HashMap<String, String>,
    members: Option<Members>,
) -> Response {
    let p = match ListParams::parse(q) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Some((skip, take)) = p.natural_page() {
        let (page, total) = page_of(vhosts, skip, take);
        let items = page
            .iter()
            .map(|q| listed(q, &p, members.as_ref()))
            .collect();
        return p.respond_page(items, total);
    }
    let mut total = 0;
    let mut kept = Vec::new();
    for v in vhosts {
        let qs = sorted_queues(v);
        total += qs.len();
        kept.extend(qs.into_iter().filter(|q| p.keeps(&q.name)));
    }
    p.respond_lazy(kept, total, |q| listed(q, &p, members.as_ref()))
}

pub(super) async fn list_all(
    State(st): State<HttpState>,
    user: Authed,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    respond(&user.vhosts(&st), &q, Members::of(&st))
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    match user.vhost(&st, &vhost) {
        Ok(v) => respond(&[v], &q, Members::of(&st)),
        Err(r) => r,
    }
}

/// The queue named in the URL, or the response to send instead.
pub(crate) fn find(
    st: &HttpState,
    vhost: &str,
    name: &str,
) -> Result<(Arc<VHost>, Arc<Queue>), Response> {
    let v = vhost_or_404(st, vhost)?;
    let q = v.find_queue(name).ok_or_else(not_found)?;
    Ok((v, q))
}

pub(super) async fn one(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    match find(&st, &vhost, &name) {
        Ok((_, q)) => Json(queue_json(&q, true, Members::of(&st).as_ref())).into_response(),
        Err(r) => r,
    }
}

/// `PUT /api/queues/{vhost}/{name}`: declares; 201 if created, 204 if it
/// existed with the same properties, 400 if they differ.
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
    let dlx = arguments
        .inner()
        .get("x-dead-letter-exchange")
        .and_then(as_string);
    let declare = Action::DeclareQueue {
        name: &name,
        dead_letter_exchange: dlx.as_deref(),
    };
    if let Err(r) = user.may(&st, &vhost, &[declare]) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (durable, auto_delete) = match (
        flag(&body, "durable", true),
        flag(&body, "auto_delete", false),
    ) {
        (Ok(d), Ok(a)) => (d, a),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    if name.is_empty() {
        return bad_request("queue name must not be empty");
    }
    let existed = v.find_queue(&name).is_some();
    let d = QueueDeclare {
        passive: false,
        durable,
        exclusive: false,
        auto_delete,
        arguments,
    };
    match v.declare_queue(API_CONNECTION_ID, &name, &d, Instant::now()) {
        Ok(_) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/queues/{vhost}/{name}[?if-empty=true&if-unused=true]`.
pub(super) async fn delete(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[Action::On(Resource::Queue(&name), Perm::Configure)],
    ) {
        return r;
    }
    let (v, queue) = match find(&st, &vhost, &name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let owner = queue.exclusive_owner.unwrap_or(API_CONNECTION_ID);
    match v.delete_queue(
        owner,
        &name,
        query_flag(&q, "if-unused"),
        query_flag(&q, "if-empty"),
    ) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/queues/{vhost}/{name}/contents`: purge.
pub(super) async fn purge(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[Action::On(Resource::Queue(&name), Perm::Read)],
    ) {
        return r;
    }
    let (_, queue) = match find(&st, &vhost, &name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    queue.purge(Instant::now());
    StatusCode::NO_CONTENT.into_response()
}
