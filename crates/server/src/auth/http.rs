//! HTTP basic auth against the stored users, and RabbitMQ's management
//! tag rules: any of `management`, `policymaker`, `monitoring`,
//! `administrator` may use the API; `monitoring` and `administrator` see
//! every vhost, `management` only those it has permissions in; only
//! `administrator` changes users, vhosts and permissions.
//!
//! Invariants:
//! - Wrong or missing credentials, and valid credentials with too few
//!   tags, answer 401 with RabbitMQ's reasons (`Login failed`, `Not
//!   management user`, `Not administrator user`), as RabbitMQ 3.10 does.

// Handlers return axum's `Response` as their error: it is what they send.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use berth_broker::access::{
    AccessError, User, TAG_ADMINISTRATOR, TAG_MANAGEMENT, TAG_MONITORING, TAG_POLICYMAKER,
};
use serde_json::json;

use super::{api_permissions, api_users, api_vhosts, api_whoami};
use crate::connection::Shared;
use crate::http::HttpState;

/// The routes of users, vhosts, permissions, topic permissions and whoami.
pub fn routes() -> Router<HttpState> {
    Router::new()
        .route("/api/whoami", get(api_whoami::get))
        .route("/api/users", get(api_users::list))
        .route(
            "/api/users/{name}",
            get(api_users::get_one)
                .put(api_users::put)
                .delete(api_users::delete),
        )
        .route(
            "/api/users/{name}/permissions",
            get(api_permissions::of_user),
        )
        .route(
            "/api/vhosts/{name}",
            get(api_vhosts::get_one)
                .put(api_vhosts::put)
                .delete(api_vhosts::delete),
        )
        .route(
            "/api/vhosts/{name}/permissions",
            get(api_permissions::of_vhost),
        )
        .route("/api/permissions", get(api_permissions::list))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(api_permissions::get_one)
                .put(api_permissions::put)
                .delete(api_permissions::delete),
        )
        .route("/api/topic-permissions", get(api_permissions::topic_list))
        .route(
            "/api/topic-permissions/{vhost}/{user}",
            get(api_permissions::topic_get)
                .put(api_permissions::topic_put)
                .delete(api_permissions::topic_delete),
        )
}

pub fn unauthorized(why: &str) -> Response {
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

pub fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": "Object Not Found", "reason": "Not Found"})),
    )
        .into_response()
}

pub fn bad_request(why: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": "bad_request", "reason": why})),
    )
        .into_response()
}

/// A refused change, as HTTP.
pub fn access_error(e: &AccessError) -> Response {
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

fn is_management(u: &User) -> bool {
    [
        TAG_MANAGEMENT,
        TAG_POLICYMAKER,
        TAG_MONITORING,
        TAG_ADMINISTRATOR,
    ]
    .iter()
    .any(|t| u.has_tag(t))
}

/// Checks HTTP basic credentials: the user must exist, know its password,
/// obey the loopback rule and have a management tag.
pub fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<User>, Response> {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized("HTTP basic authentication required"));
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return Err(unauthorized("only HTTP basic authentication is supported"));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let Some((user, password)) = decoded.as_deref().and_then(|s| s.split_once(':')) else {
        return Err(unauthorized("malformed basic authentication header"));
    };
    let u = super::login(shared, user, password, peer).map_err(|why| {
        tracing::info!(%peer, %user, "HTTP login refused: {why}");
        let mut r = unauthorized("Login failed");
        r.extensions_mut().insert(LoginFailed);
        r
    })?;
    if !is_management(&u) {
        return Err(unauthorized("Not management user"));
    }
    Ok(u)
}

/// Marks the answer to a request whose credentials were wrong, for
/// [`throttle_failed_logins`].
#[derive(Clone, Copy)]
struct LoginFailed;

/// Middleware: an answer to wrong credentials goes through the same
/// per-address throttle as AMQP logins (`auth.login_failures_per_s_max`),
/// waiting asynchronously, so a password-guessing HTTP client slows itself
/// down and no one else.
pub async fn throttle_failed_logins(
    axum::extract::State(st): axum::extract::State<HttpState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if response.extensions().get::<LoginFailed>().is_some() {
        let wait = st
            .shared
            .logins
            .failed(peer.ip(), st.shared.config.auth.login_failures_per_s_max);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
    response
}

/// [`authenticate`], then the `administrator` tag.
pub fn authenticate_admin(
    shared: &Shared,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<User>, Response> {
    let u = authenticate(shared, headers, peer)?;
    if !u.has_tag(TAG_ADMINISTRATOR) {
        return Err(unauthorized("Not administrator user"));
    }
    Ok(u)
}

/// May `u` see `vhost` (administrator and monitoring see all; others the
/// vhosts they have permissions in)?
pub fn sees_vhost(shared: &Shared, u: &User, vhost: &str) -> bool {
    u.has_tag(TAG_ADMINISTRATOR)
        || u.has_tag(TAG_MONITORING)
        || shared.broker.access().permission(vhost, &u.name).is_some()
}
