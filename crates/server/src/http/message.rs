//! Messages through the API: `POST /api/queues/{vhost}/{name}/get`
//! (`count`, `ackmode`, `encoding`, `truncate`) and
//! `POST /api/exchanges/{vhost}/{name}/publish` (answers `routed`, and
//! `delayed: true` when a delayed exchange holds the message: it has
//! reached no queue yet, so `routed` is false, as with the plugin).
//!
//! Invariants:
//! - A publish answers only once a persistent message routed to durable
//!   queues is on disk (as a publisher confirm would), bounded by
//!   [`crate::limits::HTTP_PUBLISH_STORE_WAIT_MS`].
//! - A get takes at most [`GET_COUNT_MAX`] messages, and stops before the
//!   message that would take the bodies it answers past
//!   [`crate::limits::HTTP_GET_BODY_BYTES_MAX`] (that one goes back to
//!   the queue, flagged redelivered, whatever the ackmode); with
//!   `ack_requeue_*` or `reject_requeue_true` they all go back, flagged
//!   redelivered, as RabbitMQ does.
//! - A publish is refused (503 `resource_alarm`, naming the alarm) while
//!   the memory or disk alarm is on: AMQP publishers are not read then,
//!   and the API must not be a way around that.

use crate::permissions::Action;
use berth_broker::access::{Perm, Resource};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use berth_broker::durable::Done;
use berth_broker::message::Message;
use berth_protocol::codec::{decode_properties, encode_properties};
use berth_protocol::{AMQPProperties, ShortString};
use bytes::Bytes;
use serde_json::{json, Value};

use super::queues::find;
use super::{
    amqp_error, bad_request, exchange_name, json_table, table_json, vhost_or_404, Authed, HttpState,
};

/// The most messages one `get` request takes.
pub const GET_COUNT_MAX: usize = 10_000;

fn properties_json(raw: &[u8]) -> Value {
    let Ok(p) = decode_properties(raw) else {
        return json!({});
    };
    let mut m = serde_json::Map::new();
    let mut s = |k: &str, v: &Option<ShortString>| {
        if let Some(v) = v {
            m.insert(k.to_owned(), json!(v.as_str()));
        }
    };
    s("content_type", p.content_type());
    s("content_encoding", p.content_encoding());
    s("correlation_id", p.correlation_id());
    s("reply_to", p.reply_to());
    s("expiration", p.expiration());
    s("message_id", p.message_id());
    s("type", p.kind());
    s("user_id", p.user_id());
    s("app_id", p.app_id());
    s("cluster_id", p.cluster_id());
    if let Some(h) = p.headers() {
        m.insert("headers".into(), table_json(h));
    }
    if let Some(d) = p.delivery_mode() {
        m.insert("delivery_mode".into(), json!(d));
    }
    if let Some(x) = p.priority() {
        m.insert("priority".into(), json!(x));
    }
    if let Some(t) = p.timestamp() {
        m.insert("timestamp".into(), json!(t));
    }
    Value::Object(m)
}

/// RabbitMQ's publish `properties` object as AMQP properties.
fn properties_from_json(v: &Value) -> Result<AMQPProperties, Response> {
    let mut p = AMQPProperties::default();
    let Some(obj) = v.as_object() else {
        return Ok(p);
    };
    let text = |k: &str| -> Result<Option<ShortString>, Response> {
        let Some(s) = obj.get(k).and_then(Value::as_str) else {
            return Ok(None);
        };
        ShortString::try_new(s).map(Some).map_err(|_| {
            let why = berth_broker::name_rules::shortstr_problem(s).unwrap_or_default();
            bad_request(format!("property {k} is {why}"))
        })
    };
    let small = |k: &str| -> Result<Option<u8>, Response> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
                .and_then(|n| u8::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| bad_request(format!("property {k} must be an integer 0..255"))),
        }
    };
    if let Some(x) = text("content_type")? {
        p = p.with_content_type(x);
    }
    if let Some(x) = text("content_encoding")? {
        p = p.with_content_encoding(x);
    }
    if let Some(h) = obj.get("headers") {
        p = p.with_headers(json_table(h).map_err(|why| bad_request(format!("headers: {why}")))?);
    }
    if let Some(d) = small("delivery_mode")? {
        p = p.with_delivery_mode(d);
    }
    if let Some(d) = small("priority")? {
        p = p.with_priority(d);
    }
    for (k, set) in [
        (
            "correlation_id",
            AMQPProperties::with_correlation_id
                as fn(AMQPProperties, ShortString) -> AMQPProperties,
        ),
        ("reply_to", AMQPProperties::with_reply_to),
        ("expiration", AMQPProperties::with_expiration),
        ("message_id", AMQPProperties::with_message_id),
        ("type", AMQPProperties::with_type),
        ("user_id", AMQPProperties::with_user_id),
        ("app_id", AMQPProperties::with_app_id),
    ] {
        if let Some(x) = text(k)? {
            p = set(p, x);
        }
    }
    if let Some(t) = obj.get("timestamp").and_then(Value::as_u64) {
        p = p.with_timestamp(t);
    }
    Ok(p)
}

/// Why publishing is stopped now, if it is: the memory alarm, then the
/// disk alarm, checked as a publishing AMQP connection checks them.
fn resource_alarm(st: &HttpState) -> Option<String> {
    let used = crate::memory::used_bytes();
    let limit = st.shared.config.limits.memory_high_watermark();
    if used > limit {
        return Some(format!(
            "resource alarm in effect: memory ({used} bytes in use, limits.memory_high_watermark is {limit} bytes); publishing resumes when it clears"
        ));
    }
    if st.shared.disk.is_on() {
        return Some(format!(
            "resource alarm in effect: disk (a data directory has less than limits.disk_free_bytes_min = {} bytes free); publishing resumes when it clears",
            st.shared.config.limits.disk_free_bytes_min
        ));
    }
    None
}

/// `POST /api/exchanges/{vhost}/{name}/publish`.
pub(super) async fn publish(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let exchange = exchange_name(&name);
    let Some(routing_key) = body.get("routing_key").and_then(Value::as_str) else {
        return bad_request("routing_key is required");
    };
    let publish = Action::Publish {
        exchange,
        routing_key,
    };
    if let Err(r) = user.may(&st, &vhost, &[publish]) {
        return r;
    }
    if let Some(alarm) = resource_alarm(&st) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "resource_alarm", "reason": alarm})),
        )
            .into_response();
    }
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !exchange.is_empty() && v.exchange(exchange).is_err() {
        return super::not_found();
    }
    let payload = body.get("payload").and_then(Value::as_str).unwrap_or("");
    let payload = match body.get("payload_encoding").and_then(Value::as_str) {
        None | Some("string") => Bytes::from(payload.as_bytes().to_vec()),
        Some("base64") => match base64::engine::general_purpose::STANDARD.decode(payload) {
            Ok(b) => Bytes::from(b),
            Err(e) => return bad_request(format!("payload is not valid base64: {e}")),
        },
        Some(other) => {
            return bad_request(format!(
                "payload_encoding must be \"string\" or \"base64\", got \"{other}\""
            ))
        }
    };
    let props = match properties_from_json(body.get("properties").unwrap_or(&Value::Null)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    // As a client's publish: a `user_id` must name the user (406
    // PRECONDITION_FAILED over AMQP, 400 with its text here).
    let msg = match Message::published(
        exchange.to_owned(),
        routing_key.to_owned(),
        encode_properties(&props),
        payload,
        &user.0.name,
    ) {
        Ok(m) => m,
        Err(e) => return amqp_error(&e),
    };
    let mut waits = Vec::new();
    let mut make_done = || -> Done {
        let (tx, rx) = tokio::sync::oneshot::channel();
        waits.push(rx);
        Box::new(move |r| {
            let _receiver_may_have_given_up = tx.send(r);
        })
    };
    let result = match v.publish(exchange, &msg, Instant::now(), &mut make_done) {
        Ok(r) => r,
        Err(e) => return amqp_error(&e),
    };
    let wait = Duration::from_millis(crate::limits::HTTP_PUBLISH_STORE_WAIT_MS);
    for rx in waits {
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(json!({"error": "internal_error", "reason": format!("message not stored: {e}")})),
                )
                    .into_response()
            }
            _ => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"error": "timeout", "reason": "the store did not confirm the message in time; it may still be stored"})),
                )
                    .into_response()
            }
        }
    }
    let mut answer = json!({ "routed": result.routed_now() });
    if result.delayed {
        answer["delayed"] = json!(true);
    }
    Json(answer).into_response()
}

enum AckMode {
    Requeue,
    Ack,
    Reject,
}

/// `POST /api/queues/{vhost}/{name}/get`.
pub(super) async fn get(
    State(st): State<HttpState>,
    user: Authed,
    Path((vhost, name)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = user.may(
        &st,
        &vhost,
        &[Action::On(Resource::Queue(&name), Perm::Read)],
    ) {
        return r;
    }
    let (_, q) = match find(&st, &vhost, &name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let count = body
        .get("count")
        .and_then(|c| {
            c.as_u64()
                .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or(1);
    let Ok(count) = usize::try_from(count) else {
        return bad_request("count is too large");
    };
    if count > GET_COUNT_MAX {
        return bad_request(format!("count must be at most {GET_COUNT_MAX}"));
    }
    let mode = match body.get("ackmode").and_then(Value::as_str) {
        Some("ack_requeue_true" | "reject_requeue_true") => AckMode::Requeue,
        Some("ack_requeue_false") => AckMode::Ack,
        Some("reject_requeue_false") => AckMode::Reject,
        other => {
            return bad_request(format!(
                "ackmode must be ack_requeue_true, ack_requeue_false, reject_requeue_true or reject_requeue_false, got {other:?}"
            ))
        }
    };
    let base64_only = match body.get("encoding").and_then(Value::as_str) {
        None | Some("auto") => false,
        Some("base64") => true,
        Some(other) => return bad_request(format!("encoding must be auto or base64, got {other}")),
    };
    let truncate = body
        .get("truncate")
        .and_then(|c| {
            c.as_u64()
                .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
        })
        .and_then(|n| usize::try_from(n).ok());
    let now = Instant::now();
    let mut taken = Vec::new();
    let mut out = Vec::new();
    let mut shown_bytes = 0;
    while taken.len() < count {
        let Some((m, remaining)) = q.get(false, now) else {
            break;
        };
        let body = &m.msg.body;
        let shown = &body[..truncate.unwrap_or(body.len()).min(body.len())];
        shown_bytes += shown.len();
        if shown_bytes > crate::limits::HTTP_GET_BODY_BYTES_MAX && !taken.is_empty() {
            q.requeue(vec![m], now, None);
            break;
        }
        let (payload, encoding) = match std::str::from_utf8(shown) {
            Ok(s) if !base64_only => (s.to_owned(), "string"),
            _ => (
                base64::engine::general_purpose::STANDARD.encode(shown),
                "base64",
            ),
        };
        out.push(json!({
            "payload_bytes": body.len(),
            "redelivered": m.redelivered,
            "exchange": m.msg.exchange,
            "routing_key": m.msg.routing_key,
            "message_count": remaining,
            "properties": properties_json(&m.msg.properties),
            "payload": payload,
            "payload_encoding": encoding,
        }));
        taken.push(m);
    }
    if !taken.is_empty() {
        match mode {
            AckMode::Requeue => q.requeue(taken, now, None),
            AckMode::Ack => q.settle(taken, now, None),
            AckMode::Reject => q.reject(taken, now, None),
        }
    }
    Json(out).into_response()
}
