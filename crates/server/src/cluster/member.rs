//! This process as a cluster member: opens its store as a replica,
//! starts its Raft node, waits to lead, and notices when it no longer may.
//!
//! Invariants:
//! - A member serves clients only after the entry announcing it as leader
//!   is committed and applied here: Raft applies in log order, so every
//!   entry committed before it — every confirm any earlier leader sent —
//!   is in this member's store when its broker opens from that store.
//! - A member that stops being leader, whose lease ran out (no majority
//!   answered within the election timeout), or whose replica failed,
//!   stops serving at once: it replaces itself with a fresh process
//!   (`exec` of the same command line), which starts as a follower. Its
//!   in-memory broker state is never trusted again.
//! - A member whose Raft stopped (a write to its log failed: a full disk)
//!   says so in its alarms, waits until its data directories have room
//!   again, and restarts the same way: its log is reopened, a torn tail
//!   cut, and it catches up from the leader. Nothing it acknowledged is
//!   lost (an append is answered only once fdatasynced).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_cluster::{ClusterNode, NodeConfig, ProposeError};
use berth_store::Store;
use tokio::net::TcpListener;

use super::command::Command;
use super::peers::{self, raft_id};
use super::replica::Replica;
use super::view::{Announcements, ClusterView, Serves};
use crate::config::Config;
use crate::limits::{
    CLUSTER_ANNOUNCE_TIMEOUT_MS, CLUSTER_RESTART_AFTER_STOP_MS, CLUSTER_RESTART_FREE_BYTES_MIN,
    CLUSTER_ROLE_POLL_MS, RAFT_WORKER_THREADS,
};
use crate::store_journal::StoreJournal;
use crate::ServerError;

pub struct Member {
    pub view: Arc<ClusterView>,
    pub replica: Arc<Replica>,
    /// Where the cluster listener is bound.
    pub cluster_addr: SocketAddr,
    lease: Duration,
    /// The data directories, and the free space that lets a member whose
    /// Raft stopped start again.
    data_dirs: Vec<PathBuf>,
    room_bytes: u64,
    /// Raft's own runtime (see `start`).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Member {
    fn drop(&mut self) {
        // Dropped at shutdown, possibly on a worker of the broker's
        // runtime, where a blocking runtime drop would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn startup(why: impl std::fmt::Display) -> ServerError {
    ServerError::Startup(why.to_string())
}

/// The Raft directory of a member: beside its store, in the first data
/// directory.
#[must_use]
pub fn raft_dir(config: &Config) -> PathBuf {
    config.store.data_dirs[0].join("cluster")
}

/// A member's store settings: the configured ones, except that the store
/// never waits for fdatasync. Its durability is the Raft log's: every
/// command is fdatasynced there (on a majority) before it is applied or
/// confirmed, and at a start the store is kept only as far as a flush
/// showed it holds the last snapshot, and the log after it is replayed
/// (else it is rebuilt from the snapshot: `replica`'s invariants), so an
/// fdatasync of every store write would only cost time.
#[must_use]
pub fn store_config(config: &Config) -> berth_store::StoreConfig {
    let mut c = config.store_config();
    c.sync = berth_store::SyncMode::Never;
    c
}

impl Member {
    /// Opens the store as a replica and starts the Raft node (joining or
    /// forming the cluster from the peer list).
    pub async fn start(config: &Config) -> Result<Self, ServerError> {
        let c = &config.cluster;
        let name = c.node_id.clone().expect("cluster mode has a node id");
        let peers = peers::parse_all(&c.peers)
            .map_err(|(v, why)| startup(format!("cluster.peers {v}: {why}")))?;
        let secret_file = c.secret_file.as_ref().expect("validated");
        let secret = std::fs::read(secret_file).map_err(|e| {
            startup(format!(
                "cannot read the cluster secret {}: {e} (every member needs the same file)",
                secret_file.display()
            ))
        })?;
        let secret = secret.trim_ascii_end().to_vec();
        let listen = c.listen.as_deref().expect("validated");
        let bind_error = |source| ServerError::Bind {
            addr: format!("cluster.listen {listen}"),
            source,
        };
        let listener = std::net::TcpListener::bind(listen).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let cluster_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: format!("cluster.listen {listen}"),
            source,
        })?;
        let store_config = store_config(config);
        let (store, held) = {
            let sc = store_config.clone();
            let (store, recovered) = tokio::task::spawn_blocking(move || Store::open(sc))
                .await
                .map_err(|e| startup(format!("store recovery did not finish: {e}")))?
                .map_err(|source| ServerError::Store { source })?;
            (store, super::replica::held_through(&recovered))
        };
        let local = Arc::new(StoreJournal {
            store,
            events: std::sync::OnceLock::new(),
        });
        let announced = Arc::new(Announcements::default());
        for p in &peers {
            announced.set_name(raft_id(&p.name), p.name.clone());
        }
        let replica = Arc::new(Replica::new(local, Arc::clone(&announced), held));
        let members: BTreeMap<u64, String> = peers
            .iter()
            .map(|p| (raft_id(&p.name), p.addr.clone()))
            .collect();
        let t = c.election_timeout_ms;
        let mut nc = NodeConfig::new(raft_id(&name), raft_dir(config), members, secret);
        nc.election_timeout_ms = (t, 2 * t);
        nc.heartbeat_ms = (t / 5).max(50);
        nc.sync_stall_ms_max = c.sync_stall_ms_max;
        nc.commit_timeout_ms = (4 * t).max(5_000);
        nc.may_form = !c.join;
        // A committed entry's confirms go out once per connection, as a
        // store group's batch's do (`connection/awaiting_store.rs`).
        nc.reply_batch = |waiting, replies| {
            berth_store::completion::completing(waiting, replies);
        };
        if c.tls {
            if c.tls_ca_file.is_none() {
                tracing::warn!(
                    "cluster.tls trusts tls.ca_file, the clients' CA: give members a CA of their own (cluster.tls_ca_file)"
                );
            }
            nc.tls = Some(
                crate::tls::peer_tls(&config.tls, c.tls_ca_file.as_deref())
                    .map_err(|e| startup(format!("cluster.tls: {e}")))?,
            );
        }
        // Raft runs on a runtime of its own: broker workers blocked on a
        // lock or a disk (a declare holds its vhost's lock until the
        // command commits) must never stall the heartbeats and commits
        // they wait for.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RAFT_WORKER_THREADS)
            .thread_name("berth-raft")
            .enable_all()
            .build()
            .map_err(|e| startup(format!("cannot start the Raft runtime: {e}")))?;
        let app = Arc::clone(&replica) as Arc<dyn berth_cluster::Apply>;
        let started = runtime
            .spawn(async move {
                let listener = TcpListener::from_std(listener)
                    .map_err(|e| startup(format!("cannot use the cluster listener: {e}")))?;
                ClusterNode::start(nc, listener, app)
                    .await
                    .map_err(|e| startup(format!("cannot start the cluster member: {e}")))
            })
            .await
            .map_err(|e| startup(format!("the cluster member did not start: {e}")))
            .and_then(|r| r);
        let node = match started {
            Ok(node) => node,
            Err(e) => {
                // Dropping a runtime blocks, which a runtime worker (this
                // code's caller) may not: that panic hid the real error.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        tracing::info!(member = %name, cluster = %cluster_addr, "cluster member started");
        let node = Arc::new(node);
        super::alarms::install(
            &node,
            super::alarms::Watched {
                data_dirs: config.store.data_dirs.clone(),
                disk_free_bytes_min: config.limits.disk_free_bytes_min,
            },
        );
        Ok(Self {
            view: Arc::new(ClusterView {
                name,
                node,
                announced,
            }),
            replica,
            cluster_addr,
            lease: Duration::from_millis(t),
            data_dirs: config.store.data_dirs.clone(),
            room_bytes: config
                .limits
                .disk_free_bytes_min
                .max(CLUSTER_RESTART_FREE_BYTES_MIN),
            runtime: Some(runtime),
        })
    }

    /// Where Raft's tasks run; the leader's journal forwards there.
    pub fn raft_runtime(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("taken only when the member is dropped")
            .handle()
            .clone()
    }

    /// Waits until this member leads and its announcement is committed
    /// and applied (so is every entry before it).
    pub async fn until_leading(&self, serves: &Serves) {
        let poll = Duration::from_millis(CLUSTER_ROLE_POLL_MS);
        let mut stopped_since = None;
        loop {
            if let Some(why) = self.replica.failure() {
                restart(&why);
            }
            if self.view.node.status().role == berth_cluster::Role::Stopped {
                let since = *stopped_since.get_or_insert_with(std::time::Instant::now);
                self.restart_when_room(since);
                tokio::time::sleep(poll).await;
                continue;
            }
            if !self.view.leads() || !self.view.node.may_serve() {
                tokio::time::sleep(poll).await;
                continue;
            }
            let announce = Command::Announce {
                name: self.view.name.clone(),
                amqp: serves.amqp.clone(),
                http: serves.http.clone(),
            };
            let timeout = Duration::from_millis(CLUSTER_ANNOUNCE_TIMEOUT_MS);
            match self.view.node.propose(announce.encode(), timeout).await {
                Ok(index) => {
                    tracing::info!(
                        index,
                        "this member leads; every earlier committed entry is applied"
                    );
                    return;
                }
                Err(ProposeError::NotLeader { .. }) => tokio::time::sleep(poll).await,
                Err(e) => {
                    tracing::warn!(error = %e, "the leadership announcement did not commit; trying again");
                    tokio::time::sleep(poll).await;
                }
            }
        }
    }

    /// Raft stopped (since `since`): a write to its log failed. Restarts
    /// once the data directories have room again, and not sooner than
    /// [`CLUSTER_RESTART_AFTER_STOP_MS`] after the stop (a failing disk
    /// must not turn into a loop of restarts).
    fn restart_when_room(&self, since: std::time::Instant) {
        if since.elapsed() < Duration::from_millis(CLUSTER_RESTART_AFTER_STOP_MS) {
            return;
        }
        match crate::disk::lowest_free_bytes(&self.data_dirs) {
            Ok(free) if free >= self.room_bytes => restart(&format!(
                "its Raft stopped after a failed log write; the disk has room again ({free} bytes free)"
            )),
            Ok(_) | Err(_) => {}
        }
    }

    /// Returns why this member must stop serving, once it must: another
    /// member leads, its lease ran out, or its replica failed.
    pub async fn until_deposed(&self) -> String {
        let poll = Duration::from_millis(CLUSTER_ROLE_POLL_MS);
        loop {
            tokio::time::sleep(poll).await;
            if let Some(why) = self.replica.failure() {
                return why;
            }
            if !self.view.leads() {
                return match self.view.leader_name() {
                    Some(l) => format!("{l} leads now"),
                    None => "this member is no longer the leader".into(),
                };
            }
            if !self.view.node.may_serve() {
                return format!(
                    "no majority answered within {:?} (or this member's disk stalled)",
                    self.lease
                );
            }
        }
    }
}

/// Replaces this process with a fresh start of the same command line: it
/// comes back as a follower, its broker rebuilt from the replicated log.
/// Never returns.
pub fn restart(why: &str) -> ! {
    tracing::error!("this member stops serving: {why}; it restarts as a follower");
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let exe = std::env::current_exe();
    if let Ok(exe) = exe {
        use std::os::unix::process::CommandExt;
        let e = std::process::Command::new(exe).args(&args[1..]).exec();
        tracing::error!(error = %e, "could not restart this process; exiting");
    }
    std::process::exit(3)
}
