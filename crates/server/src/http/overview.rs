//! `GET /api/overview` (product, totals, rates) and `/api/nodes[/{name}]`.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use berth_broker::totals::Totals;

use super::{not_found, Authed, HttpState};

/// This node's name, `berth@HOSTNAME`, as RabbitMQ's `rabbit@HOSTNAME`.
pub(crate) fn node_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        format!("berth@{host}")
    })
}

/// The totals cover the vhosts the user may see (and, for users who see
/// only their vhosts, their own connections), as RabbitMQ's do. Queue
/// totals are read as each vhost keeps them (`berth_broker::totals`): no
/// queue is visited, whatever their number. Counts (`publish`,
/// `deliver_get`, `ack`) are since the broker started, deleted queues'
/// included.
pub(super) async fn overview(State(st): State<HttpState>, user: Authed) -> Response {
    let mut totals = Totals::default();
    let mut exchanges = 0;
    let (mut delayed_exchanges, mut delayed, mut next_due) = (0usize, 0usize, None::<u64>);
    for v in user.vhosts(&st) {
        totals.add(&v.totals());
        exchanges += v.exchange_count();
        for e in v.exchanges() {
            if let Some(d) = e.delayed.as_ref() {
                let s = d.stats();
                delayed_exchanges += 1;
                delayed += s.messages;
                next_due = match (next_due, s.next_due_unix_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    let c = totals.counters;
    let visible: Vec<_> = st
        .shared
        .registry
        .list()
        .into_iter()
        .filter(|c| user.sees_connection(c))
        .collect();
    let channels: usize = visible.iter().map(|c| c.channels.lock().len()).sum();
    let connections = if user.sees_all() {
        st.connections.load(Ordering::Relaxed)
    } else {
        visible.len()
    };
    let listeners: Vec<Value> = st
        .listeners
        .iter()
        .map(|a| json!({"node": node_name(), "ip_address": a.ip().to_string(), "port": a.port()}))
        .collect();
    Json(json!({
        "product_name": "berth",
        "product_version": env!("CARGO_PKG_VERSION"),
        "management_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.0",
        "cluster_name": node_name(),
        "node": node_name(),
        "listeners": listeners,
        "object_totals": {
            "queues": totals.queues,
            "exchanges": exchanges,
            "connections": connections,
            "channels": channels,
            "consumers": totals.consumers,
        },
        "queue_totals": {
            "messages": totals.ready + totals.unacked,
            "messages_ready": totals.ready,
            "messages_unacknowledged": totals.unacked,
        },
        // berth's: messages held by delayed exchanges (docs/DELAYED.md).
        "delayed_totals": {
            "exchanges": delayed_exchanges,
            "messages_delayed": delayed,
            "next_due_unix_ms": next_due,
        },
        "message_stats": {
            "publish": c.published,
            "publish_details": {"rate": c.published_rate},
            "deliver_get": c.delivered,
            "deliver_get_details": {"rate": c.delivered_rate},
            "ack": c.acked,
            "ack_details": {"rate": c.acked_rate},
        },
    }))
    .into_response()
}

fn node_json(st: &HttpState) -> Value {
    json!({
        "name": node_name(),
        "type": "disc",
        "running": true,
        "mem_used": berth_broker::message::message_bytes(),
        "mem_limit": st.shared.config.limits.memory_high_watermark(),
        "mem_alarm": false,
        "disk_free_alarm": false,
    })
}

pub(super) async fn nodes(State(st): State<HttpState>, _: Authed) -> Response {
    match super::cluster::nodes(&st) {
        Some(members) => Json(members).into_response(),
        None => Json(vec![node_json(&st)]).into_response(),
    }
}

pub(super) async fn node(
    State(st): State<HttpState>,
    _: Authed,
    Path(name): Path<String>,
) -> Response {
    if name == node_name() {
        Json(node_json(&st)).into_response()
    } else {
        not_found()
    }
}
