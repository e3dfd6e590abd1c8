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

/// What members said of themselves through the log (so every member
/// knows it): member name → where it serves clients, as it announced when
/// it became leader; Raft id → member name.
#[derive(Default)]
pub struct Announcements {
    serves: Mutex<BTreeMap<String, Serves>>,
    names: Mutex<BTreeMap<u64, String>>,
}

impl Announcements {
    pub fn get(&self, name: &str) -> Option<Serves> {
        self.serves.lock().get(name).cloned()
    }

    pub fn set(&self, name: String, serves: Serves) {
        self.serves.lock().insert(name, serves);
    }

    pub fn all(&self) -> BTreeMap<String, Serves> {
        self.serves.lock().clone()
    }

    pub fn name(&self, id: u64) -> Option<String> {
        self.names.lock().get(&id).cloned()
    }

    pub fn set_name(&self, id: u64, name: String) {
        self.names.lock().insert(id, name);
    }

    pub fn names(&self) -> BTreeMap<u64, String> {
        self.names.lock().clone()
    }
}

pub struct ClusterView {
    pub name: String,
    pub node: Arc<ClusterNode>,
    /// Raft id → member name: the peer list's, and those of members added
    /// since (a replicated command, see [`Announcements::name`]).
    pub announced: Arc<Announcements>,
}

impl ClusterView {
    /// A member's name (`#id` for one this member never heard named).
    pub fn name_of(&self, id: u64) -> String {
        self.announced.name(id).unwrap_or_else(|| format!("#{id}"))
    }

    /// The name of the member this one follows (or its own), if known.
    pub fn leader_name(&self) -> Option<String> {
        Some(self.name_of(self.node.leader()?))
    }

    /// Is this member the leader now?
    pub fn leads(&self) -> bool {
        self.leader_name().as_deref() == Some(self.name.as_str())
    }

    /// Adds the member `peer` (`NAME@HOST:PORT`): its name goes through
    /// the log first, then Raft adds it as a learner, lets it catch up
    /// (by snapshot when the log behind it is purged) and makes it a
    /// voter. Leader only.
    pub async fn add(&self, peer: &str) -> Result<String, String> {
        let p = super::peers::parse(peer)?;
        let id = super::peers::raft_id(&p.name);
        if self.node.voters().contains(&id) {
            return Err(format!("{} is already a member", p.name));
        }
        let named = super::command::Command::Member {
            name: p.name.clone(),
        };
        let timeout = std::time::Duration::from_millis(crate::limits::CLUSTER_ANNOUNCE_TIMEOUT_MS);
        self.node
            .propose(named.encode(), timeout)
            .await
            .map_err(|e| e.to_string())?;
        self.node
            .add_member(id, p.addr.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(p.name)
    }

    /// Removes the member named `name`. Leader only; a leader does not
    /// remove itself (stop it, let another lead, then remove it there).
    pub async fn remove(&self, name: &str) -> Result<(), String> {
        if name == self.name {
            return Err(format!(
                "{name} leads: stop it so that another member leads, then remove it there"
            ));
        }
        self.node
            .remove_member(super::peers::raft_id(name))
            .await
            .map_err(|e| e.to_string())
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
