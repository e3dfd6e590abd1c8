//! The leader's side of members' reports (`report.rs`): while this member
//! leads, it asks every other member for its report over the peer
//! transport, once a second. Apart from `report.rs` so that the report's
//! types, which the transport carries, do not depend on the transport.
//!
//! Invariants:
//! - A follower holds no connection for this: they are dropped as soon
//!   as this member stops leading.
//! - One member's silence delays no other's report (all asked at once,
//!   each within the interval).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ServerState};

use crate::limits::REPORT_INTERVAL_MS;
use crate::report::Reports;
use crate::transport::Network;
use crate::types::{NodeId, Raft};

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
