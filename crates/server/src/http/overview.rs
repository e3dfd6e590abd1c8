//! `GET /api/overview`: product, object totals and queue totals.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{Authed, HttpState};

pub(super) async fn overview(State(st): State<HttpState>, _: Authed) -> Response {
    let (mut queues, mut exchanges, mut ready, mut unacked, mut consumers) = (0, 0, 0, 0, 0);
    for v in st.shared.broker.vhosts() {
        for q in v.queues() {
            let s = q.stats();
            queues += 1;
            ready += s.ready;
            unacked += s.unacked;
            consumers += s.consumers;
        }
        exchanges += v.exchanges().len();
    }
    Json(json!({
        "product_name": "berth",
        "product_version": env!("CARGO_PKG_VERSION"),
        "management_version": env!("CARGO_PKG_VERSION"),
        "object_totals": {
            "queues": queues,
            "exchanges": exchanges,
            "connections": st.connections.load(Ordering::Relaxed),
            "consumers": consumers,
        },
        "queue_totals": {
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        },
    }))
    .into_response()
}
