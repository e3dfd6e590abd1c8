//! The cluster as the management API shows it: `GET
//! /api/health/checks/is-leader` (200 on the leader; a follower's own
//! listener answers 503, see `cluster::follower_http`), `GET
//! /api/berth/cluster` (every member's log position and lag as the leader
//! sees them), the members in `/api/nodes`, and the quorum-queue fields
//! `leader`, `members`, `online` of every queue.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_cluster::{MemberStatus, Role};
use serde_json::{json, Value};

use super::auth::AdminAuthed;
use super::{bad_request, Authed, HttpState};
use crate::cluster::view::ClusterView;

/// A member counts as running while it answered the leader within this
/// many election timeouts (a leader calls every member every heartbeat).
const RUNNING_TIMEOUTS: u64 = 2;

/// The members of a cluster as queue JSON names them.
pub(crate) struct Members {
    pub leader: String,
    pub all: Vec<String>,
    pub online: Vec<String>,
}

/// Whether a member answered the leader recently enough to count as
/// running.
fn running(st: &HttpState, m: &berth_cluster::MemberStatus) -> bool {
    let running_ms = RUNNING_TIMEOUTS * st.shared.config.cluster.election_timeout_ms;
    m.millis_since_heard.is_some_and(|ms| ms < running_ms)
}

impl Members {
    /// This server's cluster members, or `None` on a single node.
    pub(crate) fn of(st: &HttpState) -> Option<Self> {
        let view = st.shared.cluster.as_ref()?;
        let status = view.node.status();
        let all: Vec<String> = status.members.iter().map(|m| view.name_of(m.id)).collect();
        let online = status
            .members
            .iter()
            .filter(|m| running(st, m))
            .map(|m| view.name_of(m.id))
            .collect();
        Some(Self {
            leader: view.name.clone(),
            all,
            online,
        })
    }

    /// Adds `leader`, `members` and `online` to a queue's JSON, and names
    /// the leader as its `node`, as RabbitMQ does for a quorum queue (the
    /// member names of `/api/nodes`).
    pub(crate) fn add_to(&self, queue: &mut Value) {
        queue["node"] = json!(self.leader);
        queue["leader"] = json!(self.leader);
        queue["members"] = json!(self.all);
        queue["online"] = json!(self.online);
    }
}

/// `GET /api/health/checks/is-leader` on the serving member.
pub(super) async fn is_leader(State(st): State<HttpState>) -> Response {
    match &st.shared.cluster {
        Some(view) if view.leads() => {
            Json(json!({"status": "ok", "node": view.name, "leader": view.name})).into_response()
        }
        Some(view) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({"status": "failed", "reason": "this member no longer leads",
                        "node": view.name, "leader": view.leader_name()}),
            ),
        )
            .into_response(),
        // A single node leads itself.
        None => Json(json!({"status": "ok"})).into_response(),
    }
}

/// `GET /api/berth/cluster`: the cluster as this member sees it.
pub(super) async fn status(State(st): State<HttpState>, _: Authed) -> Response {
    let Some(view) = &st.shared.cluster else {
        return Json(json!({"clustered": false})).into_response();
    };
    Json(status_of(view, &|m| Some(running(&st, m)))).into_response()
}

/// The cluster as member `view` sees it; `running` tells whether a member
/// answered the leader lately (`None` where this member cannot tell: a
/// follower hears only the leader).
pub(super) fn status_of(
    view: &ClusterView,
    running: &dyn Fn(&MemberStatus) -> Option<bool>,
) -> Value {
    let s = view.node.status();
    let members: Vec<Value> = s
        .members
        .iter()
        .map(|m| {
            let name = view.name_of(m.id);
            let serves = view.announced.get(&name).unwrap_or_default();
            json!({
                "name": name,
                "cluster_address": m.addr,
                "amqp": serves.amqp,
                "voter": m.voter,
                "leader": s.leader == Some(m.id),
                "running": running(m),
                "matched_index": m.matched_index,
                "lag_entries": m.lag,
                "millis_since_heard": m.millis_since_heard,
            })
        })
        .collect();
    json!({
        "clustered": true,
        "node": view.name,
        "role": match s.role {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Stopped => "stopped",
        },
        "term": s.term,
        "leader": view.leader_name(),
        "last_log_index": s.last_log_index,
        "applied_index": s.applied_index,
        "snapshot_index": s.snapshot_index,
        "millis_since_quorum_ack": s.millis_since_quorum_ack,
        "fenced": s.fenced,
        "on_probation": s.on_probation,
        "member_id": format!("{:032x}", s.member_id),
        "cluster_id": s.cluster_id.map(|id| format!("{id:032x}")),
        "members": members,
    })
}

/// The members as `/api/nodes` lists them (RabbitMQ's node objects).
pub(super) fn nodes(st: &HttpState) -> Option<Vec<Value>> {
    let members = Members::of(st)?;
    Some(
        members
            .all
            .iter()
            .map(|name| {
                json!({
                    "name": name,
                    "type": "disc",
                    "running": members.online.contains(name),
                    "being_drained": false,
                })
            })
            .collect(),
    )
}

/// `POST /api/berth/cluster/members` `{"peer": "NAME@HOST:PORT"}`: adds a
/// member (administrator; leader only). Answers once it is a voter.
pub(super) async fn add(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Json(body): Json<Value>,
) -> Response {
    let Some(view) = &st.shared.cluster else {
        return bad_request("this broker is not a cluster member");
    };
    let Some(peer) = body.get("peer").and_then(Value::as_str) else {
        return bad_request("expected {\"peer\": \"NAME@HOST:PORT\"}");
    };
    match view.add(peer).await {
        Ok(name) => Json(json!({"added": name})).into_response(),
        Err(e) => bad_request(&e),
    }
}

/// `DELETE /api/berth/cluster/members/{name}` (administrator; leader only).
pub(super) async fn remove(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(name): Path<String>,
) -> Response {
    let Some(view) = &st.shared.cluster else {
        return bad_request("this broker is not a cluster member");
    };
    match view.remove(&name).await {
        Ok(()) => Json(json!({"removed": name})).into_response(),
        Err(e) => bad_request(&e),
    }
}

/// The numbers `/metrics` shows of a cluster member.
pub(super) struct Numbers {
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub leader: u64,
    /// Per member: name, lag in entries, running (1) or not (0).
    pub members: Vec<(String, u64, u8)>,
    /// 1 while this member's disk stalls (it neither leads nor votes).
    pub fenced: u64,
    /// 1 while this member catches up after a damaged log.
    pub on_probation: u64,
}

impl Numbers {
    pub(super) fn of(st: &HttpState) -> Option<Self> {
        let view = st.shared.cluster.as_ref()?;
        Some(Self::of_view(view, Some(&|m| running(st, m))))
    }

    /// Member `view`'s numbers; per member only where `running` can tell
    /// (the leader).
    pub(super) fn of_view(
        view: &ClusterView,
        running: Option<&dyn Fn(&MemberStatus) -> bool>,
    ) -> Self {
        let s = view.node.status();
        Self {
            term: s.term,
            last_log_index: s.last_log_index.unwrap_or(0),
            applied_index: s.applied_index.unwrap_or(0),
            snapshot_index: s.snapshot_index.unwrap_or(0),
            leader: u64::from(s.role == Role::Leader),
            members: running.map_or_else(Vec::new, |running| {
                (s.members.iter())
                    .map(|m| (view.name_of(m.id), m.lag.unwrap_or(0), u8::from(running(m))))
                    .collect()
            }),
            fenced: u64::from(s.fenced),
            on_probation: u64::from(s.on_probation),
        }
    }
}
