//! Members meeting each other outside Raft's own calls: every member
//! proves itself to every other once (and once more after it learns its
//! cluster id), so that member ids and the cluster id are known by all
//! within seconds of the cluster forming (`identity.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;

use crate::identity::Identity;
use crate::limits::MEET_RETRY_MS;
use crate::transport::Network;
use crate::types::{NodeId, Raft};

/// Meets every member once (a proven handshake, then the connection
/// closes), so that each learns every other's member id within seconds
/// of the cluster forming, not only those it happens to call (followers
/// never call each other until an election): a member wiped later is then
/// known by all as replaced. Meets each once more after this member's
/// cluster id is made or learned, so that every member learns it (a
/// handshake carries it both ways). Forgets the ids of nodes that left
/// the membership, so that one removed and added again is met afresh.
///
/// In a cluster formed before cluster ids existed, the member with the
/// smallest node id makes one: a single member, so two ids never compete.
pub(crate) async fn meet_members(raft: Raft, mut network: Network, identity: Arc<Identity>) {
    use openraft::RaftNetworkFactory;
    let mut all_met = false;
    // Members met since this member knew its cluster id, and under which.
    let mut told: (Option<crate::identity::ClusterId>, BTreeSet<NodeId>) = (None, BTreeSet::new());
    loop {
        // Often while someone is still to be met, then once a second.
        let pause = if all_met { 1_000 } else { MEET_RETRY_MS };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let (me, members): (NodeId, BTreeMap<NodeId, BasicNode>) = {
            let m = raft.metrics();
            let m = m.borrow();
            if m.membership_config.log_id().is_none() {
                continue; // not formed yet: nobody to meet, nobody has left
            }
            let nodes = m.membership_config.membership().nodes();
            (m.id, nodes.map(|(id, n)| (*id, n.clone())).collect())
        };
        identity.forget_all_but(&members.keys().copied().collect());
        if identity.cluster().is_none() && members.keys().next() == Some(&me) {
            if let Err(e) = identity.found_cluster() {
                tracing::warn!(error = %e, "cannot record this cluster's new id; retrying");
            }
        }
        if told.0 != identity.cluster() {
            told = (identity.cluster(), BTreeSet::new());
        }
        all_met = true;
        for (id, node) in members {
            let tell = told.0.is_some() && !told.1.contains(&id);
            if id == me || (identity.knows(id) && !tell) {
                continue;
            }
            let peer = network.new_client(id, &node).await;
            match peer.meet().await {
                Ok(()) => {
                    told.1.insert(id);
                }
                Err(e) => {
                    all_met = false;
                    tracing::debug!(peer = id, error = %e, "could not meet a member yet");
                }
            }
        }
    }
}
