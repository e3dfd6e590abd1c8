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
                "alarms": m.alarms,
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
        "log_resident_bytes": s.log_resident_bytes,
        "log_entries_read_from_disk": s.log_entries_read_from_disk,
        "member_id": format!("{:032x}", s.member_id),
        "cluster_id": s.cluster_id.map(|id| format!("{id:032x}")),
        "members": members,
    })
}

/// The members as `/api/nodes` lists them (RabbitMQ's node objects),
/// with each member's alarms as it last reported them to this leader
/// (`alarms` null where unknown: a follower hears only the leader, and a
/// member that stopped answering sends no report).
pub(super) fn nodes(st: &HttpState) -> Option<Vec<Value>> {
    let view = st.shared.cluster.as_ref()?;
    let status = view.node.status();
    Some(
        status
            .members
            .iter()
            .map(|m| {
                let alarms = m.alarms.as_ref();
                json!({
                    "name": view.name_of(m.id),
                    "type": "disc",
                    "running": running(st, m) || m.id == status.id,
                    "being_drained": false,
                    "disk_free_alarm": alarms.map(|a| a.iter().any(|x| x.starts_with("disk"))),
                    "mem_alarm": alarms.map(|_| false),
                    "alarms": alarms,
                })
            })
            .collect(),
    )
}

/// Every member's reported alarms but this one's, each named by its
/// member (for the cluster-wide alarms check on the leader).
pub(super) fn member_alarms(st: &HttpState) -> Vec<String> {
    let Some(view) = st.shared.cluster.as_ref() else {
        return Vec::new();
    };
    let status = view.node.status();
    (status.members.iter())
        .filter(|m| m.id != status.id)
        .flat_map(|m| {
            let name = view.name_of(m.id);
            (m.alarms.iter().flatten()).map(move |a| format!("member {name}: {a}"))
        })
        .collect()
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

/// What `/metrics` shows per member.
pub(super) struct MemberNumbers {
    pub name: String,
    /// Entries behind the leader's log.
    pub lag: u64,
    /// 1 while it answers the leader.
    pub running: u8,
    /// How many alarms it last reported (`None`: no fresh report).
    pub alarms: Option<u64>,
}

/// The numbers `/metrics` shows of a cluster member.
pub(super) struct Numbers {
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub leader: u64,
    /// Per member, where this member can tell (the leader).
    pub members: Vec<MemberNumbers>,
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
                    .map(|m| MemberNumbers {
                        name: view.name_of(m.id),
                        lag: m.lag.unwrap_or(0),
                        running: u8::from(running(m)),
                        alarms: m.alarms.as_ref().map(|a| a.len() as u64),
                    })
                    .collect()
            }),
            fenced: u64::from(s.fenced),
            on_probation: u64::from(s.on_probation),
        }
    }
}
