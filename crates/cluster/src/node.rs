//! One member of a cluster: its Raft engine, log, state machine and peer
//! listener, behind an API with no openraft type in it.
//!
//! Invariants:
//! - `propose` returns `Ok(index)` only once the command is committed (on a
//!   majority of members, each having fdatasynced it) and applied locally.
//! - A cluster forms from the static peer list with no further command: the
//!   member with the smallest id initialises it on its first start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::ClusterError;
use crate::limits::{APPEND_ENTRIES_MAX, SECRET_BYTES_MIN, SNAPSHOT_CHUNK_BYTES};
use crate::log_file;
use crate::log_store::LogStore;
use crate::state_machine::{Apply, StateMachine};
use crate::sync_gate::SyncGate;
use crate::transport::{self, Network};
use crate::types::{Command, NodeId, Raft};

/// Everything a member needs to start.
pub struct NodeConfig {
    pub id: NodeId,
    /// The node's cluster directory (its Raft log, vote and snapshot).
    pub dir: PathBuf,
    /// Every member of the cluster, this one included: id → `host:port` of
    /// its cluster listener.
    pub members: BTreeMap<NodeId, String>,
    /// The shared secret; every member must hold the same bytes.
    pub secret: Vec<u8>,
    /// A follower that hears nothing from a leader for a random time in
    /// this range starts an election.
    pub election_timeout_ms: (u64, u64),
    pub heartbeat_ms: u64,
    /// Committed entries kept before a snapshot replaces them.
    pub snapshot_after_entries: u64,
    /// Test hook in front of every fdatasync; production passes the default.
    pub sync_gate: SyncGate,
}

impl NodeConfig {
    /// Settings sized for small, shared machines (docs/CLUSTERING.md).
    #[must_use]
    pub fn new(
        id: NodeId,
        dir: PathBuf,
        members: BTreeMap<NodeId, String>,
        secret: Vec<u8>,
    ) -> Self {
        Self {
            id,
            dir,
            members,
            secret,
            election_timeout_ms: (1_000, 2_000),
            heartbeat_ms: 250,
            snapshot_after_entries: 10_000,
            sync_gate: SyncGate::default(),
        }
    }

    fn check(&self) -> Result<(), ClusterError> {
        if self.secret.len() < SECRET_BYTES_MIN {
            return Err(ClusterError::Config(format!(
                "the cluster secret has {} bytes; it needs at least {SECRET_BYTES_MIN} (e.g. `head -c 32 /dev/urandom | base64 > secret`)",
                self.secret.len()
            )));
        }
        if !self.members.contains_key(&self.id) {
            return Err(ClusterError::Config(format!(
                "node {} is not in the member list {:?}: list every member, this one included",
                self.id,
                self.members.keys().collect::<Vec<_>>()
            )));
        }
        let (lo, hi) = self.election_timeout_ms;
        if self.heartbeat_ms == 0 || lo <= self.heartbeat_ms * 2 || hi <= lo {
            return Err(ClusterError::Config(format!(
                "election timeout {lo}..{hi} ms must be above twice the heartbeat ({} ms) and a non-empty range",
                self.heartbeat_ms
            )));
        }
        Ok(())
    }
}

/// Why a proposal was not committed.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the leader; the leader is {leader:?} at {addr:?}")]
    NotLeader {
        leader: Option<NodeId>,
        addr: Option<String>,
    },
    #[error("not committed within {0:?}: no majority is reachable (or its disks are slow)")]
    Timeout(Duration),
    #[error("the Raft node has stopped: {0}")]
    Stopped(String),
}

pub struct ClusterNode {
    id: NodeId,
    raft: Raft,
    log: LogStore,
    listener: JoinHandle<()>,
}

impl ClusterNode {
    /// Opens the node's directory, starts Raft and the peer listener, and
    /// forms the cluster if this is its first start and this member has the
    /// smallest id. `listener` is bound by the caller (tests bind port 0).
    pub async fn start(
        config: NodeConfig,
        listener: TcpListener,
        app: Arc<dyn Apply>,
    ) -> Result<Self, ClusterError> {
        config.check()?;
        let (loaded, writer) = log_file::open(&config.dir, config.sync_gate.clone())?;
        let log = LogStore::from_loaded(&config.dir, &loaded, writer.clone())?;
        let sm = StateMachine::from_loaded(&config.dir, &loaded, writer, app)?;
        let raft_config = Config {
            cluster_name: "berth".into(),
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            heartbeat_interval: config.heartbeat_ms,
            max_payload_entries: APPEND_ENTRIES_MAX,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
            // Entries kept behind a snapshot, so that a follower a little
            // behind catches up from the log rather than a whole snapshot.
            max_in_snapshot_log_to_keep: config.snapshot_after_entries.min(1_000),
            ..Config::default()
        }
        .validate()
        .map_err(|e| ClusterError::Config(e.to_string()))?;
        let secret = Arc::new(config.secret);
        let network = Network {
            node: config.id,
            secret: secret.clone(),
        };
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log.clone(), sm)
            .await
            .map_err(|e| ClusterError::Engine(e.to_string()))?;
        let listener = tokio::spawn(transport::serve(listener, raft.clone(), secret));
        let node = Self {
            id: config.id,
            raft,
            log,
            listener,
        };
        let first = config.members.keys().next().copied();
        if first == Some(config.id)
            && !node
                .raft
                .is_initialized()
                .await
                .map_err(|e| ClusterError::Engine(e.to_string()))?
        {
            let members: BTreeMap<NodeId, BasicNode> = config
                .members
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect();
            if let Err(e) = node.raft.initialize(members).await {
                // Another start of this member got there first: fine.
                tracing::info!(error = %e, "cluster already initialised");
            }
        }
        Ok(node)
    }

    #[must_use]
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Replicates `command`; `Ok(index)` once it is committed and applied.
    pub async fn propose(&self, command: Vec<u8>, timeout: Duration) -> Result<u64, ProposeError> {
        match tokio::time::timeout(timeout, self.raft.client_write(Command(command))).await {
            Err(_) => Err(ProposeError::Timeout(timeout)),
            Ok(Ok(reply)) => Ok(reply.log_id.index),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id,
                    addr: f.leader_node.map(|n| n.addr),
                })
            }
            Ok(Err(e)) => Err(ProposeError::Stopped(e.to_string())),
        }
    }

    /// The leader this node currently follows (or itself).
    #[must_use]
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Waits until this node knows a leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Option<NodeId> {
        let mut metrics = self.raft.metrics();
        tokio::time::timeout(timeout, async {
            loop {
                if let Some(l) = metrics.borrow().current_leader {
                    return Some(l);
                }
                if metrics.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// The index of the last command applied here.
    #[must_use]
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|l| l.index)
    }

    /// The index of the last entry in this node's log.
    #[must_use]
    pub fn last_log_index(&self) -> Option<u64> {
        self.log.last_index()
    }

    /// The voting members as the latest membership says.
    #[must_use]
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Stops Raft and the listener (the process keeps running).
    pub async fn shutdown(self) {
        self.listener.abort();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft did not stop cleanly");
        }
    }
}
