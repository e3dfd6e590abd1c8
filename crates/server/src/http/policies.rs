//! `/api/policies` and `/api/operator-policies`: berth does not implement
//! policies yet. Listing answers the truth (there are none); creating or
//! deleting one answers 501 so a tool never believes a policy is in force.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{not_found, vhost_or_404, Authed, HttpState};

fn not_implemented() -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({
            "error": "not_implemented",
            "reason": "berth does not implement policies yet; set x- arguments when declaring queues (see docs/MANAGEMENT.md)",
        })),
    )
        .into_response()
}

pub(super) async fn list(State(_): State<HttpState>, _: Authed) -> Response {
    Json(json!([])).into_response()
}

pub(super) async fn list_in(
    State(st): State<HttpState>,
    _: Authed,
    Path(vhost): Path<String>,
) -> Response {
    match vhost_or_404(&st, &vhost) {
        Ok(_) => Json(json!([])).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn one(
    State(_): State<HttpState>,
    _: Authed,
    Path(_): Path<(String, String)>,
) -> Response {
    not_found()
}

pub(super) async fn change(
    State(_): State<HttpState>,
    _: Authed,
    Path(_): Path<(String, String)>,
) -> Response {
    not_implemented()
}
