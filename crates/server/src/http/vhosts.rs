//! `GET /api/vhosts`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{Authed, HttpState};

/// The vhosts the user may see (all for `administrator` and `monitoring`).
pub(super) async fn list(State(st): State<HttpState>, user: Authed) -> Response {
    let vhosts = user.vhosts(&st);
    let mut names: Vec<&str> = vhosts.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    Json(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()).into_response()
}
