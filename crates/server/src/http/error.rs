//! Every error answer of the management API, in RabbitMQ's JSON shapes
//! (`{"error": ..., "reason": ...}`), so that each status and body is
//! written once.
//!
//! Invariants:
//! - A 401 always carries RabbitMQ's `WWW-Authenticate` realm, so
//!   browsers and tools ask for credentials the way they do with
//!   RabbitMQ.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::access::AccessError;
use berth_broker::AmqpError;
use serde_json::json;

/// RabbitMQ's 404 body.
pub(crate) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": "Object Not Found", "reason": "Not Found"})),
    )
        .into_response()
}

/// RabbitMQ's 400 body.
pub(crate) fn bad_request(reason: impl Into<String>) -> Response {
    error_400("bad_request", reason)
}

/// A 400 with RabbitMQ's `error` name for it.
pub(crate) fn error_400(error: &str, reason: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": error, "reason": reason.into()})),
    )
        .into_response()
}

/// RabbitMQ's 401 body, with the realm that asks for basic credentials.
pub(crate) fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            "Basic realm=\"RabbitMQ Management\"",
        )],
        Json(json!({"error": "not_authorised", "reason": why})),
    )
        .into_response()
}

/// 429 to a request whose credentials were not checked because its
/// address spent its login budget ([`crate::throttle`]); `why` says for how
/// long, and so does `Retry-After`.
pub(crate) fn too_many_logins(why: &crate::throttle::NotChecked) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, why.retry_after_s().to_string())],
        Json(json!({"error": "too_many_requests", "reason": why.to_string()})),
    )
        .into_response()
}

/// The HTTP answer to a broker error: 404 for a missing object, 501 for
/// what berth does not implement, 400 with the AMQP reply text otherwise
/// (as RabbitMQ's API answers a failed declare or delete).
pub(crate) fn amqp_error(e: &AmqpError) -> Response {
    match e.reply_code {
        berth_protocol::reply::NOT_FOUND => not_found(),
        berth_protocol::reply::NOT_IMPLEMENTED => (
            StatusCode::NOT_IMPLEMENTED,
            Json(json!({"error": "not_implemented", "reason": e.reply_text()})),
        )
            .into_response(),
        _ => bad_request(e.reply_text()),
    }
}

/// A refused change of users, vhosts or permissions, as HTTP.
pub(crate) fn access_error(e: &AccessError) -> Response {
    match e {
        AccessError::Invalid(why) => bad_request(why),
        AccessError::NotFound(_) => not_found(),
        AccessError::Journal(j) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "internal_error", "reason": j.to_string()})),
        )
            .into_response(),
    }
}
