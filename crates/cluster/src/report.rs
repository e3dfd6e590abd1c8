//! What each member tells the leader about itself: its alarms (a disk
//! below the free space it must keep, its log's disk stalled, its Raft
//! stopped), so that the leader's management API, health checks and
//! metrics show a follower's trouble, as RabbitMQ's `/api/nodes` and
//! alarms check show every node's.
//!
//! The application says what its alarms are ([`LocalAlarms`]); the leader
//! asks every other member once a second over the peer transport and
//! keeps the last answer.
//!
//! Invariants:
//! - A report older than [`REPORT_FRESH_MS`] is never shown: a member that
//!   stops answering is shown without a report (unknown), not as
//!   alarm-free.
//! - Answering costs a member no Raft work, and it answers while its Raft
//!   is stopped (that is when its report matters most).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::BasicNode;
use openraft::ServerState;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::limits::{REPORT_FRESH_MS, REPORT_INTERVAL_MS};
use crate::transport::Network;
use crate::types::{NodeId, Raft};

/// A member's own alarms, each one sentence; empty when all is well.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberReport {
    pub alarms: Vec<String>,
}

/// How the application tells its alarms.
pub type LocalAlarms = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// This member's alarm source, and the reports the leader heard.
#[derive(Default)]
pub(crate) struct Reports {
    local: RwLock<Option<LocalAlarms>>,
    heard: Mutex<BTreeMap<NodeId, (MemberReport, Instant)>>,
}

impl Reports {
    pub(crate) fn set_local(&self, alarms: LocalAlarms) {
        *self.local.write() = Some(alarms);
    }

    /// This member's report, now.
    pub(crate) fn local(&self) -> MemberReport {
        let alarms = self.local.read().as_ref().map(|f| f()).unwrap_or_default();
        MemberReport { alarms }
    }

    /// Member `id`'s last report, if fresh.
    pub(crate) fn of(&self, id: NodeId) -> Option<MemberReport> {
        let heard = self.heard.lock();
        let (report, at) = heard.get(&id)?;
        (at.elapsed() < Duration::from_millis(REPORT_FRESH_MS)).then(|| report.clone())
    }

    fn heard(&self, id: NodeId, report: MemberReport) {
        let mut heard = self.heard.lock();
        let changed = heard.get(&id).is_none_or(|(r, _)| *r != report);
        if changed && !report.alarms.is_empty() {
            tracing::warn!(member = id, alarms = %report.alarms.join("; "), "a cluster member reports alarms");
        }
        heard.insert(id, (report, Instant::now()));
    }
}

/// While this member leads, asks every other member for its report once
/// a second (all at once, each within the interval).
pub(crate) async fn collect(raft: Raft, mut network: Network, reports: Arc<Reports>) {
    use openraft::RaftNetworkFactory;
    let interval = Duration::from_millis(REPORT_INTERVAL_MS);
    let mut peers: BTreeMap<NodeId, (String, crate::transport::Peer)> = BTreeMap::new();
    loop {
        tokio::time::sleep(interval).await;
        let (me, leads, members): (NodeId, bool, BTreeMap<NodeId, BasicNode>) = {
            let m = raft.metrics();
            let m = m.borrow();
            let nodes = m.membership_config.membership().nodes();
            (
                m.id,
                m.state == ServerState::Leader,
                nodes.map(|(id, n)| (*id, n.clone())).collect(),
            )
        };
        if !leads {
            peers.clear(); // no connections held while following
            continue;
        }
        peers.retain(|id, (addr, _)| members.get(id).is_some_and(|n| n.addr == *addr));
        for (id, node) in &members {
            if *id != me && !peers.contains_key(id) {
                let peer = network.new_client(*id, node).await;
                peers.insert(*id, (node.addr.clone(), peer));
            }
        }
        let asks = peers
            .iter_mut()
            .map(|(id, (_, peer))| async move { (*id, peer.report(interval).await) });
        for (id, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(report) => reports.heard(id, report),
                Err(e) => tracing::debug!(member = id, error = %e, "no report from a member"),
            }
        }
    }
}
