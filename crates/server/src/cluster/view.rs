//! What the rest of the server may know of this member's cluster: its
//! Raft node, its name and its peers' names, and where each leader said it
//! serves clients. Held by the shared state for the HTTP side; imports
//! nothing else of the server.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_cluster::ClusterNode;
use parking_lot::Mutex;

/// Where a leader serves clients (comma-separated addresses; `http` is
/// empty when its management API is off).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Serves {
    pub amqp: String,
    pub http: String,
}

/// Member name → where it serves clients, as it announced when it became
/// leader (a replicated command, so every member knows it).
#[derive(Default)]
pub struct Announcements(Mutex<BTreeMap<String, Serves>>);

impl Announcements {
    pub fn get(&self, name: &str) -> Option<Serves> {
        self.0.lock().get(name).cloned()
    }

    pub fn set(&self, name: String, serves: Serves) {
        self.0.lock().insert(name, serves);
    }

    pub fn all(&self) -> BTreeMap<String, Serves> {
        self.0.lock().clone()
    }
}

pub struct ClusterView {
    pub name: String,
    pub node: Arc<ClusterNode>,
    /// Raft id → member name, from the peer list.
    pub names: BTreeMap<u64, String>,
    pub announced: Arc<Announcements>,
}

impl ClusterView {
    /// The name of the member this one follows (or its own), if known.
    pub fn leader_name(&self) -> Option<String> {
        let id = self.node.leader()?;
        Some(
            self.names
                .get(&id)
                .cloned()
                .unwrap_or_else(|| format!("#{id}")),
        )
    }

    /// Is this member the leader now?
    pub fn leads(&self) -> bool {
        self.leader_name().as_deref() == Some(self.name.as_str())
    }

    /// What a client turned away by a follower is told.
    pub fn not_leader_text(&self, addresses: impl Fn(&Serves) -> String) -> String {
        match self.leader_name() {
            Some(leader) if leader != self.name => match self.announced.get(&leader) {
                Some(serves) => format!(
                    "node {} is a follower; the leader is {leader} at {}",
                    self.name,
                    addresses(&serves)
                ),
                None => format!(
                    "node {} is a follower; the leader is {leader} (its address is not known yet)",
                    self.name
                ),
            },
            Some(_) => format!(
                "node {} was elected leader and is opening its broker; try again shortly",
                self.name
            ),
            None => format!(
                "node {} knows no leader: an election is under way or no majority is reachable",
                self.name
            ),
        }
    }
}
