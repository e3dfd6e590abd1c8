//! What a node knows about its cluster, in berth's terms, for `berth
//! cluster status`, the management API and Prometheus.

use crate::types::NodeId;

/// A node's part in Raft right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Stopped,
}

#[derive(Clone, Debug)]
pub struct MemberStatus {
    pub id: NodeId,
    /// Its cluster listener, as the membership records it.
    pub addr: String,
    pub voter: bool,
    /// The last index the leader knows this member holds (only a leader
    /// knows; `None` elsewhere or before the first answer).
    pub matched_index: Option<u64>,
    /// Entries this member is behind the leader's log (leader only).
    pub lag: Option<u64>,
    /// Milliseconds since this member last answered a call of this node
    /// (0 for the node itself; `None` if it never did).
    pub millis_since_heard: Option<u64>,
    /// The member's alarms: this node's own, or (leader only) the last
    /// report the member sent within a few seconds; `None` when unknown.
    pub alarms: Option<Vec<String>>,
}

#[derive(Clone, Debug)]
pub struct ClusterStatus {
    pub id: NodeId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// Milliseconds since a quorum last acknowledged this leader (leader
    /// only): the age of its lease.
    pub millis_since_quorum_ack: Option<u64>,
    /// Disk stalled: no proposals, no heartbeats, no elections.
    pub fenced: bool,
    /// Damaged log: no vote, no election until caught up.
    pub on_probation: bool,
    /// Bytes of Raft log entries held in memory (the newest, up to
    /// `LOG_RESIDENT_BYTES_MAX` once durable).
    pub log_resident_bytes: u64,
    /// Entries read back from the log's segments since the start.
    pub log_entries_read_from_disk: u64,
    /// This member's id (made with its data directory).
    pub member_id: u128,
    /// Its cluster's id, once made or learned.
    pub cluster_id: Option<u128>,
    pub members: Vec<MemberStatus>,
}
