//! Queues: `GET /api/queues[/{vhost}[/{name}]]`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::args::QueueType;
use berth_broker::queue::Queue;
use berth_broker::vhost::VHost;
use serde_json::{json, Value};

use super::{not_found, sorted_vhosts, table_json, vhost_or_404, Authed, HttpState};

pub(crate) fn queue_json(q: &Queue) -> Value {
    let s = q.stats();
    json!({
        "name": q.name,
        "vhost": q.vhost_name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner.is_some(),
        "arguments": table_json(&q.arguments),
        "type": match q.args.queue_type { QueueType::Classic => "classic", QueueType::Quorum => "quorum" },
        "messages": s.ready + s.unacked,
        "messages_ready": s.ready,
        "messages_unacknowledged": s.unacked,
        "message_bytes_ready": s.ready_bytes,
        "messages_paged_out": s.paged_out,
        "messages_ram": s.ready - s.paged_out + s.unacked,
        "consumers": s.consumers,
        "state": "running",
    })
}

pub(crate) fn sorted_queues(v: &VHost) -> Vec<Arc<Queue>> {
    let mut qs = v.queues();
    qs.sort_by(|a, b| a.name.cmp(&b.name));
    qs
}

pub(super) async fn list_all(State(st): State<HttpState>, _: Authed) -> Response {
    let all: Vec<Value> = sorted_vhosts(&st)
        .iter()
        .flat_map(|v| sorted_queues(v))
        .map(|q| queue_json(&q))
        .collect();
    Json(all).into_response()
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    _: Authed,
    Path(vhost): Path<String>,
) -> Response {
    match vhost_or_404(&st, &vhost) {
        Ok(v) => Json(
            sorted_queues(&v)
                .iter()
                .map(|q| queue_json(q))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

pub(super) async fn one(
    State(st): State<HttpState>,
    _: Authed,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    match v.queues().into_iter().find(|q| q.name == name) {
        Some(q) => Json(queue_json(&q)).into_response(),
        None => not_found(),
    }
}
