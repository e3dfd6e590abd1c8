//! One member of a cluster: its Raft engine, log, state machine and peer
//! listener, behind an API with no openraft type in it.
//!
//! Invariants:
//! - `propose` returns `Ok(index)` only once the command is committed (on a
//!   majority of members, each having fdatasynced it) and applied locally.
//! - Proposals made while an entry is being committed are gathered into the
//!   next entry (one Raft entry per batch, so Raft's per-entry cost is paid
//!   per batch); they keep the order in which they reached the node.
//! - A node whose own fdatasync has run longer than `sync_stall_ms_max`
//!   refuses proposals, stops sending heartbeats and starting elections, so
//!   a wedged disk cannot keep the leadership (LavinMQ #2151); it takes part
//!   again once its disk answers.
//! - A cluster forms from the static peer list with no further command: the
//!   member with the smallest id initialises it on its first start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::batch;
use crate::error::ClusterError;
use crate::identity::Identity;
use crate::limits::{
    APPEND_ENTRIES_MAX, DISK_WATCH_INTERVAL, ENTRIES_KEPT_BEHIND_SNAPSHOT, ENTRY_BYTES_MAX,
    LEARNER_CATCH_UP_MS, LOG_RESIDENT_BYTES_MAX, LOG_SEGMENT_BYTES, PEER_FRAME_BYTES_MAX,
    PROPOSALS_PER_ENTRY_MAX, PROPOSALS_QUEUED_MAX, SECRET_BYTES_MIN, SNAPSHOT_AFTER_LOG_BYTES,
    SNAPSHOT_AFTER_LOG_BYTES_MAX, SNAPSHOT_CHECK_INTERVAL, SNAPSHOT_CHUNK_BYTES,
    SNAPSHOT_CHUNK_TIMEOUT_MS,
};
use crate::log_file::{self, Writer};
use crate::log_store::LogStore;
use crate::probation::Probation;
use crate::report::{LocalAlarms, Reports};
use crate::snapshot_file::SNAPSHOT_FILE;
use crate::standing::Standing;
use crate::state_machine::{Apply, StateMachine};
use crate::status::{ClusterStatus, MemberStatus, Role};
use crate::sync_gate::SyncGate;
use crate::transport::PeerTls;
use crate::transport::{self, Heard, Network};
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
    /// Committed entries kept before a snapshot replaces them (`u64::MAX`,
    /// the default: no count, only bytes; tests set a count)…
    pub snapshot_after_entries: u64,
    /// …or bytes of them, whichever comes first (twice the last snapshot's
    /// size if larger, up to [`SNAPSHOT_AFTER_LOG_BYTES_MAX`]).
    pub snapshot_after_bytes: u64,
    /// The newest bytes of the log kept in memory once durable
    /// ([`LOG_RESIDENT_BYTES_MAX`]; tests lower it to read every older
    /// entry back from disk).
    pub log_resident_bytes: u64,
    /// Size at which a Raft log segment is closed (tests make it small).
    pub log_segment_bytes: u64,
    /// An fdatasync running longer than this fences the node (see above).
    pub sync_stall_ms_max: u64,
    /// A proposal not committed within this is answered `Timeout` (its
    /// outcome unknown) so that later ones are not stuck behind it.
    pub commit_timeout_ms: u64,
    /// Whether this member may form the cluster from `members` at its
    /// first start (if it has the smallest id); a member started to join
    /// an existing cluster must not.
    pub may_form: bool,
    /// Test hook in front of every fdatasync; production passes the default.
    pub sync_gate: SyncGate,
    /// TLS between members (`None`: plain TCP, the secret still proven).
    pub tls: Option<PeerTls>,
    /// Largest frame between authenticated members; larger appends are
    /// split. [`PEER_FRAME_BYTES_MAX`] unless a test makes it small.
    pub peer_frame_bytes_max: usize,
    /// Runs the replies to one committed entry's proposals (the argument
    /// says how many more proposals wait), so that a user of the node can
    /// do once per entry what each reply would otherwise do (a connection
    /// writing its confirms once for all of them). Runs them as they are
    /// by default.
    pub reply_batch: ReplyBatch,
}

/// How the replies to one entry's proposals are run: `replies` runs them
/// all; `waiting` proposals are queued behind them.
pub type ReplyBatch = fn(waiting: usize, replies: &mut dyn FnMut());

fn run_replies(_waiting: usize, replies: &mut dyn FnMut()) {
    replies();
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
            snapshot_after_entries: u64::MAX,
            snapshot_after_bytes: SNAPSHOT_AFTER_LOG_BYTES,
            log_resident_bytes: LOG_RESIDENT_BYTES_MAX,
            log_segment_bytes: LOG_SEGMENT_BYTES,
            sync_stall_ms_max: 5_000,
            commit_timeout_ms: 5_000,
            may_form: true,
            sync_gate: SyncGate::default(),
            tls: None,
            peer_frame_bytes_max: PEER_FRAME_BYTES_MAX,
            reply_batch: run_replies,
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

/// Why a proposal was not committed. After `Timeout` (and `Stopped`) the
/// outcome is unknown: the entry may still commit.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the leader; the leader is {leader:?} at {addr:?}")]
    NotLeader {
        leader: Option<NodeId>,
        addr: Option<String>,
    },
    #[error("not committed within {0:?}: no majority is reachable (or its disks are slow)")]
    Timeout(Duration),
    #[error(
        "this node's disk has not finished an fdatasync for {0:?}; it does not lead until it does"
    )]
    DiskStalled(Duration),
    #[error("the Raft node has stopped: {0}")]
    Stopped(String),
}

/// What a proposer is told once its proposal's entry committed (or
/// could not): called once, on the gathering task, so it must be short.
pub type Reply = Box<dyn FnOnce(Result<u64, ProposeError>) + Send>;

struct Proposal {
    command: Vec<u8>,
    reply: Reply,
}

pub struct ClusterNode {
    id: NodeId,
    raft: Raft,
    log: LogStore,
    proposals: mpsc::Sender<Proposal>,
    writer: Writer,
    standing: Arc<Standing>,
    /// A leader's lease: the shortest election timeout.
    lease_ms: u64,
    /// When each peer last answered this node.
    heard: Arc<Heard>,
    identity: Arc<Identity>,
    reports: Arc<Reports>,
    tasks: Vec<JoinHandle<()>>,
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
        let (loaded, writer) = log_file::open_keeping(
            &config.dir,
            config.sync_gate.clone(),
            config.log_segment_bytes,
            config.log_resident_bytes,
        )?;
        let log = LogStore::from_loaded(
            &config.dir,
            &loaded,
            writer.clone(),
            config.log_resident_bytes,
        )?;
        let log_damaged = loaded.damaged_at.is_some()
            || config.dir.join(crate::probation::PROBATION_FILE).exists();
        let sm = StateMachine::from_loaded(&config.dir, app, log.last_index(), log_damaged)?;
        let raft_config = Config {
            cluster_name: "berth".into(),
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            heartbeat_interval: config.heartbeat_ms,
            max_payload_entries: APPEND_ENTRIES_MAX,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            // By bytes (`snapshot_by_size`), unless a test asks for entries.
            snapshot_policy: if config.snapshot_after_entries == u64::MAX {
                SnapshotPolicy::Never
            } else {
                SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries)
            },
            install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
            max_in_snapshot_log_to_keep: config
                .snapshot_after_entries
                .min(ENTRIES_KEPT_BEHIND_SNAPSHOT),
            ..Config::default()
        }
        .validate()
        .map_err(|e| ClusterError::Config(e.to_string()))?;
        let secret = Arc::new(config.secret);
        let identity = Arc::new(Identity::open(&config.dir)?);
        let heard = Arc::new(Heard::default());
        let network = Network {
            node: config.id,
            secret: secret.clone(),
            identity: identity.clone(),
            heard: heard.clone(),
            // Connections to peers leave from the address peers know this
            // node by, unless it listens on every address.
            source: listener
                .local_addr()
                .ok()
                .map(|a| a.ip())
                .filter(|ip| !ip.is_unspecified()),
            tls: config.tls.clone(),
            frame_max: config.peer_frame_bytes_max,
        };
        let network_for_meeting = network.clone();
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log.clone(), sm)
            .await
            .map_err(|e| ClusterError::Engine(e.to_string()))?;
        let standing = Arc::new(Standing {
            fenced: AtomicBool::new(false),
            probation: Probation::open(&config.dir, loaded.damaged_at.is_some()).map_err(
                |source| ClusterError::Io {
                    path: config.dir.join(crate::probation::PROBATION_FILE),
                    source,
                },
            )?,
        });
        if standing.probation.active() {
            raft.runtime_config().elect(false);
        }
        let reports = Arc::new(Reports::default());
        let (proposals, queue) = mpsc::channel(PROPOSALS_QUEUED_MAX);
        let stall = Duration::from_millis(config.sync_stall_ms_max);
        let tasks = vec![
            tokio::spawn(transport::serve(
                listener,
                raft.clone(),
                (secret, identity.clone()),
                (standing.clone(), reports.clone()),
                config.tls.clone(),
                config.peer_frame_bytes_max,
            )),
            tokio::spawn(gather(
                raft.clone(),
                queue,
                Duration::from_millis(config.commit_timeout_ms),
                config.reply_batch,
            )),
            tokio::spawn(snapshot_by_size(
                raft.clone(),
                log.clone(),
                config.dir.join(SNAPSHOT_FILE),
                config.snapshot_after_bytes,
            )),
            tokio::spawn(crate::meeting::meet_members(
                raft.clone(),
                network_for_meeting.clone(),
                identity.clone(),
            )),
            tokio::spawn(crate::report_collect::collect(
                raft.clone(),
                network_for_meeting,
                reports.clone(),
            )),
            tokio::spawn(watch_disk(
                raft.clone(),
                writer.clone(),
                standing.clone(),
                stall,
            )),
        ];
        let node = Self {
            id: config.id,
            raft,
            log,
            proposals,
            writer,
            standing,
            lease_ms: config.election_timeout_ms.0,
            heard,
            identity,
            reports,
            tasks,
        };
        let first = config.members.keys().next().copied();
        if first == Some(config.id)
            && config.may_form
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
            // The cluster's id, before anyone can meet the cluster.
            node.identity
                .found_cluster()
                .map_err(|source| ClusterError::Io {
                    path: config.dir.join(crate::identity::CLUSTER_ID_FILE),
                    source,
                })?;
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

    /// Tells this member how to list its own alarms: answered to the
    /// leader's reports (`report.rs`) and shown in its own status.
    pub fn set_local_alarms(&self, alarms: LocalAlarms) {
        self.reports.set_local(alarms);
    }

    /// Replicates `command`; `Ok(index)` once it is committed and applied
    /// (`index` is that of the Raft entry it was gathered into).
    pub async fn propose(&self, command: Vec<u8>, timeout: Duration) -> Result<u64, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let work = async {
            self.submit(
                command,
                Box::new(move |r| {
                    let _ = reply.send(r); // the proposer may have timed out and gone
                }),
            )
            .await;
            answer
                .await
                .unwrap_or_else(|_| Err(ProposeError::Stopped("the proposal was dropped".into())))
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or(Err(ProposeError::Timeout(timeout)))
    }

    /// Queues `command` for the next entry and returns once it is queued;
    /// `reply` runs when the entry committed and was applied here (or
    /// could not be: after `Timeout` the outcome is unknown). Proposals
    /// submitted one after another by one task keep that order in the log,
    /// which is what a journal's positions need.
    pub async fn submit(&self, command: Vec<u8>, reply: Reply) {
        if self.standing.fenced.load(Ordering::Acquire) {
            reply(Err(ProposeError::DiskStalled(
                self.writer.sync_running_for().unwrap_or_default(),
            )));
            return;
        }
        if let Err(refused) = self.proposals.send(Proposal { command, reply }).await {
            (refused.0.reply)(Err(ProposeError::Stopped(
                "the proposal queue is closed".into(),
            )));
        }
    }

    /// Adds a member (leader only): it joins as a learner, catches up (by
    /// snapshot if it is far behind), then becomes a voter. Returns once
    /// the new membership is committed.
    ///
    /// It becomes a voter only once it holds the log as it was when it
    /// was added: openraft's own wait (`add_learner`'s `blocking`)
    /// returned within milliseconds for a member removed and added again
    /// with an empty directory, leaving a voter with nothing, one failure
    /// away from a cluster that cannot commit.
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<(), ProposeError> {
        self.raft
            .add_learner(id, BasicNode::new(addr), true)
            .await
            .map_err(membership_error)?;
        self.learner_caught_up(id).await?;
        let mut voters = self.voters();
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Waits until learner `id` holds this leader's log as it is now.
    async fn learner_caught_up(&self, id: NodeId) -> Result<(), ProposeError> {
        let wanted = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(LEARNER_CATCH_UP_MS);
        loop {
            let (held, leads) = {
                let m = self.raft.metrics();
                let m = m.borrow();
                let held = (m.replication.as_ref())
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map_or(0, |l| l.index);
                (held, m.state == ServerState::Leader)
            };
            if held >= wanted {
                return Ok(());
            }
            if !leads {
                return Err(ProposeError::Stopped(format!(
                    "this node stopped leading while {id} caught up (at index {held} of {wanted}); \
                     it stays a learner: add it again on the leader"
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProposeError::Stopped(format!(
                    "{id} did not catch up within {} s (at index {held} of {wanted}); it stays a \
                     learner, receiving the log: add it again to make it a voter once it has",
                    LEARNER_CATCH_UP_MS / 1000
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Removes a member (leader only); returns once the new membership is
    /// committed. The removed node stops receiving entries.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ProposeError> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(ProposeError::Stopped(format!(
                "{id} is not a voting member"
            )));
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Is this node fenced off by a stalled disk?
    #[must_use]
    pub fn fenced(&self) -> bool {
        self.standing.fenced.load(Ordering::Acquire)
    }

    /// Is this node on probation after a damaged log (no vote, no
    /// election until it has caught up with a leader)?
    #[must_use]
    pub fn on_probation(&self) -> bool {
        self.standing.probation.active()
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

    /// This node's part in Raft right now.
    #[must_use]
    pub fn role(&self) -> Role {
        role_of(self.raft.metrics().borrow().state)
    }

    /// The node's view of the cluster (see [`ClusterStatus`]).
    #[must_use]
    pub fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let role = role_of(m.state);
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).copied().flatten())
                    .map(|l| l.index);
                let matched = if *id == m.id && role == Role::Leader {
                    m.last_log_index
                } else {
                    matched
                };
                let lag = match (role, m.last_log_index) {
                    (Role::Leader, Some(last)) => Some(last.saturating_sub(matched.unwrap_or(0))),
                    _ => None,
                };
                MemberStatus {
                    alarms: if *id == m.id {
                        Some(self.reports.local().alarms)
                    } else if role == Role::Leader {
                        self.reports.of(*id).map(|r| r.alarms)
                    } else {
                        None
                    },
                    millis_since_heard: if *id == m.id {
                        Some(0)
                    } else {
                        self.heard
                            .since(*id)
                            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    },
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index: matched,
                    lag,
                }
            })
            .collect();
        ClusterStatus {
            id: m.id,
            role,
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            fenced: self.fenced(),
            on_probation: self.on_probation(),
            log_resident_bytes: self.log.memory().0,
            log_entries_read_from_disk: self.log.memory().1,
            member_id: self.identity.own(),
            cluster_id: self.identity.cluster(),
            members,
        }
    }

    /// May this node confirm and deliver right now? Only a leader whose
    /// disk is not stalled and that a quorum acknowledged within the
    /// shortest election timeout: past that, another leader may exist
    /// (the lease has run out) and a deposed leader must not deliver.
    #[must_use]
    pub fn may_serve(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader
            && !self.fenced()
            && m.millis_since_quorum_ack
                .is_some_and(|ms| ms < self.lease_ms)
    }

    /// Stops Raft, the listener and the node's tasks (the process keeps
    /// running).
    /// Stops the node; once this returns its peer listener is closed (a
    /// restart in the same process can bind its address again).
    pub async fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft did not stop cleanly");
        }
        // An aborted task is dropped (with the listener it owns) only when
        // the runtime next polls it; on a busy machine that came after a
        // test bound the address again (`Address already in use`).
        for task in self.tasks {
            let _ = task.await; // cancelled, as asked
        }
    }
}

fn role_of(state: ServerState) -> Role {
    match state {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Stopped,
    }
}

fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ProposeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
            addr: f.leader_node.map(|n| n.addr),
        },
        other => ProposeError::Stopped(other.to_string()),
    }
}

/// Gathers proposals that arrive while an entry is being committed into the
/// next entry (see [`batch`] for its bytes).
async fn gather(
    raft: Raft,
    mut queue: mpsc::Receiver<Proposal>,
    commit_timeout: Duration,
    reply_batch: ReplyBatch,
) {
    while let Some(first) = queue.recv().await {
        let mut bytes = first.command.len();
        let mut batch = vec![first];
        while batch.len() < PROPOSALS_PER_ENTRY_MAX && bytes < ENTRY_BYTES_MAX {
            match queue.try_recv() {
                Ok(p) => {
                    bytes += p.command.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let entry = batch::encode(batch.iter().map(|p| p.command.as_slice()));
        // A leader that cannot reach a majority waits here: after the
        // timeout the outcome is unknown (the entry may still commit) and
        // the gatherer moves on, so later proposals are not stuck behind it.
        let written = tokio::time::timeout(
            commit_timeout,
            raft.client_write(Command::new(entry.into())),
        )
        .await;
        let result = match written {
            Err(_) => Err(ProposeError::Timeout(commit_timeout)),
            Ok(Ok(reply)) => Ok(reply.log_id.index),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id,
                    addr: f.leader_node.map(|n| n.addr),
                })
            }
            Ok(Err(e)) => Err(ProposeError::Stopped(e.to_string())),
        };
        let mut batch = Some(batch);
        reply_batch(queue.len(), &mut || {
            for p in batch.take().into_iter().flatten() {
                (p.reply)(result.clone());
            }
        });
    }
}

/// Asks for a snapshot once the entries since the last one hold
/// `after_bytes` (or twice the last snapshot's size, if larger, up to
/// [`SNAPSHOT_AFTER_LOG_BYTES_MAX`]: the log since the last snapshot is
/// held in memory), however
/// few they are: openraft's policy counts entries only, and one entry is a
/// whole batch (up to [`ENTRY_BYTES_MAX`]), so 10,000 of them could hold
/// gigabytes — all of it in memory, and all of it copied at the purge.
async fn snapshot_by_size(raft: Raft, log: LogStore, snapshot_file: PathBuf, after_bytes: u64) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (snapshot_index, applied) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.snapshot.map(|l| l.index), m.last_applied.map(|l| l.index))
        };
        // Only what was applied since can make a new snapshot: a member
        // whose log runs ahead of what it may apply (restarted, waiting
        // to hear the commit index) would build the same one again and
        // again (seen: 140 MB every 600 ms).
        if applied <= snapshot_index {
            continue;
        }
        // A stat of one file: no I/O worth a blocking thread.
        let last_size = std::fs::metadata(&snapshot_file).map_or(0, |m| m.len());
        let threshold = after_bytes.max(
            last_size
                .saturating_mul(2)
                .min(SNAPSHOT_AFTER_LOG_BYTES_MAX),
        );
        if log.bytes_after(snapshot_index) >= threshold {
            // Ignored by openraft while a snapshot is being built.
            if raft.trigger().snapshot().await.is_err() {
                return; // the node has stopped
            }
        }
    }
}

/// Fences the node while its own fdatasync is stalled, and lifts the fence
/// once the disk answers again.
async fn watch_disk(raft: Raft, writer: Writer, standing: Arc<Standing>, stall: Duration) {
    let fenced = &standing.fenced;
    let mut tick = tokio::time::interval(DISK_WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let running = writer.sync_running_for();
        let stalled = running.is_some_and(|d| d > stall);
        if stalled && !fenced.load(Ordering::Acquire) {
            tracing::error!(?running, "this node's fdatasync is stalled: it stops leading, heartbeating and electing until the disk answers");
            fenced.store(true, Ordering::Release);
            raft.runtime_config().heartbeat(false);
            raft.runtime_config().elect(false);
        } else if !stalled && fenced.load(Ordering::Acquire) {
            tracing::info!("this node's disk answers again: it takes part in elections again");
            raft.runtime_config().heartbeat(true);
            if !standing.probation.active() {
                raft.runtime_config().elect(true);
            }
            fenced.store(false, Ordering::Release);
        }
    }
}
