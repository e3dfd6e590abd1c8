//! A follower's HTTP listener: `GET /api/health/checks/is-leader` answers
//! 503 naming the leader (so a load balancer sends clients to the leader),
//! and every other request is answered 503 the same way: a follower holds
//! no broker to manage.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::view::ClusterView;

fn not_leader(view: &ClusterView) -> Response {
    let reason = view.not_leader_text(|s| {
        if s.http.is_empty() {
            format!("amqp {}", s.amqp)
        } else {
            format!("http {}", s.http)
        }
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": "failed",
            "reason": reason,
            "node": view.name,
            "leader": view.leader_name(),
        })),
    )
        .into_response()
}

/// The follower's router.
pub fn router(view: Arc<ClusterView>) -> Router {
    let fallback = Arc::clone(&view);
    Router::new()
        .route(
            "/api/health/checks/is-leader",
            get(move || async move { not_leader(&view) }),
        )
        .fallback(move || async move { not_leader(&fallback) })
}
