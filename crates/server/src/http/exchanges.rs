//! Exchanges: `GET /api/exchanges[/{vhost}]`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::vhost::VHost;
use serde_json::{json, Value};

use super::{table_json, vhost_or_404, Authed, HttpState};

pub(crate) fn exchanges_json(v: &VHost) -> Vec<Value> {
    let mut es = v.exchanges();
    es.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = vec![
        json!({"name": "", "vhost": v.name, "type": "direct", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}),
    ];
    out.extend(es.iter().map(|e| {
        json!({
            "name": e.name,
            "vhost": v.name,
            "type": e.kind.as_str(),
            "durable": e.durable,
            "auto_delete": e.auto_delete,
            "internal": e.internal,
            "arguments": table_json(&e.arguments),
        })
    }));
    out
}

pub(super) async fn list_all(State(st): State<HttpState>, _: Authed) -> Response {
    let all: Vec<Value> = st
        .shared
        .broker
        .vhosts()
        .flat_map(|v| exchanges_json(v))
        .collect();
    Json(all).into_response()
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    _: Authed,
    Path(vhost): Path<String>,
) -> Response {
    match vhost_or_404(&st, &vhost) {
        Ok(v) => Json(exchanges_json(&v)).into_response(),
        Err(r) => r,
    }
}
