//! A follower's HTTP listener. It holds no broker, so most requests are
//! answered 503 naming the leader (a load balancer sends clients there),
//! but it answers for itself what an operator and a monitor ask of every
//! member: `GET /api/health/checks/is-leader` (503, the leader named),
//! `/api/health/checks/alarms` and `local-alarms` (its own disk, its Raft
//! log), `/api/health/checks/port-listener/{port}`, `/api/berth/cluster`
//! (its role, term and log positions: `berth cluster status --url` of
//! this member) and `/metrics` (its Raft numbers).
//!
//! These answer without a login: a follower has no user database open
//! to check one against. They show names, addresses and log positions,
//! as RabbitMQ's Prometheus endpoint does without a login; nothing they
//! answer changes anything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::cluster::view::ClusterView;

/// What a follower's HTTP side knows of its member.
pub struct Follower {
    pub view: Arc<ClusterView>,
    /// The data directories and the free space each must keep
    /// (`limits.disk_free_bytes_min`; 0: no alarm).
    pub data_dirs: Vec<PathBuf>,
    pub disk_free_bytes_min: u64,
    /// Every bound listener, for the port-listener check.
    pub listeners: Vec<SocketAddr>,
}

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

/// This member's alarms (`cluster::alarms`).
fn alarms(f: &Follower) -> Vec<String> {
    crate::cluster::alarms::of(
        &f.view.node,
        &crate::cluster::alarms::Watched {
            data_dirs: f.data_dirs.clone(),
            disk_free_bytes_min: f.disk_free_bytes_min,
        },
    )
}

fn check(alarms: Vec<String>) -> Response {
    if alarms.is_empty() {
        return Json(json!({"status": "ok"})).into_response();
    }
    let reason = format!("resource alarm(s) in effect: {}", alarms.join("; "));
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "failed", "reason": reason})),
    )
        .into_response()
}

/// The follower's router.
pub fn router(f: Follower) -> Router {
    let f = Arc::new(f);
    let (leader, status, metrics) = (Arc::clone(&f), Arc::clone(&f), Arc::clone(&f));
    let (alarmed, local, ports, fallback) = (
        Arc::clone(&f),
        Arc::clone(&f),
        Arc::clone(&f),
        Arc::clone(&f),
    );
    Router::new()
        .route(
            "/api/health/checks/is-leader",
            get(move || async move { not_leader(&leader.view) }),
        )
        .route(
            "/api/health/checks/alarms",
            get(move || async move { check(alarms(&alarmed)) }),
        )
        .route(
            "/api/health/checks/local-alarms",
            get(move || async move { check(alarms(&local)) }),
        )
        .route(
            "/api/health/checks/port-listener/{port}",
            get(move |Path(port): Path<String>| async move {
                match port.parse::<u16>() {
                    Ok(p) if ports.listeners.iter().any(|a| a.port() == p) => {
                        Json(json!({"status": "ok", "port": p})).into_response()
                    }
                    Ok(p) => check(vec![format!("no listener on port {p}")]),
                    Err(_) => super::bad_request(format!("'{port}' is not a port number")),
                }
            }),
        )
        .route(
            "/api/berth/cluster",
            get(move || async move {
                Json(super::cluster::status_of(&status.view, &|_| None)).into_response()
            }),
        )
        .route(
            "/metrics",
            get(move || async move { super::metrics::follower(&metrics.view) }),
        )
        .fallback(move || async move { not_leader(&fallback.view) })
}
