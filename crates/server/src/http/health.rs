//! Health checks as RabbitMQ's API has them: `aliveness-test` (a real
//! publish and get through a queue named `aliveness-test`), alarms,
//! port listeners and virtual hosts. The alarms check also names every
//! log group that refuses writes, with what clears it (`store_alarms`). A passing check answers 200
//! `{"status":"ok"}`, a failing one 503 `{"status":"failed","reason":...}`.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::message::Message;
use berth_broker::vhost::QueueDeclare;
use berth_protocol::FieldTable;
use bytes::Bytes;
use serde_json::json;

use super::queues::API_CONNECTION_ID;
use super::{vhost_or_404, Authed, HttpState};

/// The queue RabbitMQ's aliveness test uses.
const ALIVENESS_QUEUE: &str = "aliveness-test";

fn ok() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

fn failed(reason: String) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "failed", "reason": reason})),
    )
        .into_response()
}

pub(super) async fn aliveness(
    State(st): State<HttpState>,
    user: Authed,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = user.may(&st, &vhost, &[]) {
        return r;
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let now = Instant::now();
    let d = QueueDeclare {
        passive: false,
        durable: false,
        exclusive: false,
        auto_delete: false,
        arguments: FieldTable::default(),
    };
    if let Err(e) = v.declare_queue(API_CONNECTION_ID, ALIVENESS_QUEUE, &d, now) {
        return failed(e.reply_text());
    }
    let msg = match Message::new(
        String::new(),
        ALIVENESS_QUEUE.to_owned(),
        Bytes::from_static(&[0, 0]),
        Bytes::from_static(b"test_message"),
    ) {
        Ok(m) => m,
        Err(e) => return failed(e.reply_text()),
    };
    let mut never_durable = || -> berth_broker::durable::Done { Box::new(|_| {}) };
    if let Err(e) = v.publish("", &msg, now, &mut never_durable) {
        return failed(e.reply_text());
    }
    let Some(q) = v.find_queue(ALIVENESS_QUEUE) else {
        return failed("aliveness-test queue vanished".into());
    };
    match q.get(true, now) {
        Some(_) => ok(),
        None => failed("the test message did not come back".into()),
    }
}

/// `GET /api/health/checks/alarms`: this broker's alarms and, on a
/// cluster's leader, every member's (as each last reported them).
pub(super) async fn alarms(State(st): State<HttpState>, _: Authed) -> Response {
    let mut alarms = local(&st);
    alarms.extend(super::cluster::member_alarms(&st));
    verdict(alarms)
}

/// `GET /api/health/checks/local-alarms`: this broker's own.
pub(super) async fn local_alarms(State(st): State<HttpState>, _: Authed) -> Response {
    verdict(local(&st))
}

fn local(st: &HttpState) -> Vec<String> {
    let used = berth_broker::message::message_bytes();
    let limit = st.shared.config.limits.memory_high_watermark();
    let mut alarms = Vec::new();
    if limit > 0 && used >= limit {
        alarms.push(format!(
            "memory ({used} bytes of messages held, limits.memory_high_watermark is {limit} bytes)"
        ));
    }
    alarms.extend(super::store_alarms::store_alarms(&st.journal.store.stats()));
    if let Some(view) = &st.shared.cluster {
        let node = &view.node;
        alarms.extend(
            node.status()
                .members
                .into_iter()
                .find(|m| m.id == node.id())
                .and_then(|m| m.alarms)
                .unwrap_or_default(),
        );
    }
    alarms
}

fn verdict(alarms: Vec<String>) -> Response {
    if alarms.is_empty() {
        return ok();
    }
    failed(format!(
        "resource alarm(s) in effect: {}",
        alarms.join("; ")
    ))
}

pub(super) async fn port_listener(
    State(st): State<HttpState>,
    _: Authed,
    Path(port): Path<String>,
) -> Response {
    let Ok(port) = port.parse::<u16>() else {
        return super::bad_request(format!("'{port}' is not a port number"));
    };
    if st.listeners.iter().any(|a| a.port() == port) {
        Json(json!({"status": "ok", "port": port})).into_response()
    } else {
        failed(format!("no listener on port {port}"))
    }
}

pub(super) async fn vhosts(State(_): State<HttpState>, _: Authed) -> Response {
    // Every vhost berth has is running: they are created at startup.
    ok()
}
