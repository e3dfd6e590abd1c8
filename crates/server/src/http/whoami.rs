//! `GET /api/whoami`: the authenticated user's name and tags.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::auth::authenticate;
use super::HttpState;

pub async fn get(
    State(st): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    match authenticate(&st.shared, &headers, peer) {
        Ok(u) => Json(json!({"name": u.name, "tags": u.tags})).into_response(),
        Err(r) => r,
    }
}
