//! The harness of the cluster tests: three members on loopback in one
//! process, each recording what it applies.
#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::{Read, Write};

use berth_cluster::{
    Apply, ClusterNode, NodeConfig, NodeId, SnapshotSource, SyncGate, WriteSnapshot,
};
use berth_testdir::TestDir;
use parking_lot::Mutex;
use tokio::net::TcpListener;

/// Records every applied command, in order.
#[derive(Default)]
pub struct Recorder {
    pub applied: Mutex<Vec<Vec<u8>>>,
}

impl Apply for Recorder {
    fn apply(&self, _index: u64, command: bytes::Bytes) {
        self.applied.lock().push(command.to_vec());
    }
    fn capture(&self, _at: u64) -> WriteSnapshot {
        let applied = self.applied.lock().clone();
        Box::new(move |out: &mut dyn Write| {
            for c in &applied {
                out.write_all(&u32::try_from(c.len()).unwrap().to_le_bytes())?;
                out.write_all(c)?;
            }
            Ok(())
        })
    }
    fn restore(&self, snapshot: &dyn SnapshotSource, _at: u64) {
        let mut whole = Vec::new();
        snapshot.open().unwrap().read_to_end(&mut whole).unwrap();
        let mut applied = Vec::new();
        let mut rest = whole.as_slice();
        while !rest.is_empty() {
            let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            applied.push(rest[4..4 + len].to_vec());
            rest = &rest[4 + len..];
        }
        *self.applied.lock() = applied;
    }
    fn start_empty(&self) {
        self.applied.lock().clear();
    }
}

pub struct Cluster {
    pub members: BTreeMap<NodeId, String>,
    /// Tunes each member's settings before it starts.
    pub tune: fn(&mut NodeConfig),
    pub nodes: BTreeMap<NodeId, (ClusterNode, Arc<Recorder>)>,
    /// The members' directories (`n{id}`), removed when the cluster drops,
    /// also when a test fails; last, so the members drop first.
    pub root: TestDir,
}

pub const SECRET: &[u8] = b"a cluster secret of enough bytes";
pub const WAIT: Duration = Duration::from_secs(20);

/// Binds a stopped member's address again for its restart. The port was
/// an ephemeral one, so until the kernel hands it out again it may be
/// the source port of some outgoing connection on 127.0.0.1 (seen in CI:
/// "Address already in use"): tried again for up to [`WAIT`].
pub async fn rebind(addr: &str) -> TcpListener {
    let deadline = Instant::now() + WAIT;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    }
}

impl Cluster {
    pub async fn start(
        name: &str,
        gates: &BTreeMap<NodeId, SyncGate>,
        secrets: &BTreeMap<NodeId, &[u8]>,
    ) -> Self {
        Self::start_with(name, gates, secrets, |_| {}).await
    }

    pub async fn start_tuned(
        name: &str,
        gates: &BTreeMap<NodeId, SyncGate>,
        tune: fn(&mut NodeConfig),
    ) -> Self {
        Self::start_with(name, gates, &BTreeMap::new(), tune).await
    }

    async fn start_with(
        name: &str,
        gates: &BTreeMap<NodeId, SyncGate>,
        secrets: &BTreeMap<NodeId, &[u8]>,
        tune: fn(&mut NodeConfig),
    ) -> Self {
        let root = TestDir::new(&format!("cluster-{name}"));
        let mut listeners = BTreeMap::new();
        for id in 1..=3u64 {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            listeners.insert(id, l);
        }
        let members: BTreeMap<NodeId, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().unwrap().to_string()))
            .collect();
        let mut cluster = Self {
            members,
            tune,
            nodes: BTreeMap::new(),
            root,
        };
        for (id, listener) in listeners {
            let gate = gates.get(&id).cloned().unwrap_or_default();
            let secret = secrets.get(&id).copied().unwrap_or(SECRET);
            cluster.start_node(id, listener, gate, secret).await;
        }
        cluster
    }

    pub async fn start_node(
        &mut self,
        id: NodeId,
        listener: TcpListener,
        gate: SyncGate,
        secret: &[u8],
    ) {
        let mut config = NodeConfig::new(
            id,
            self.root.join(format!("n{id}")),
            self.members.clone(),
            secret.to_vec(),
        );
        config.election_timeout_ms = (600, 1_200);
        config.heartbeat_ms = 150;
        config.sync_gate = gate;
        // Keep nothing durable of the log in memory: appends to followers,
        // catch-ups and restarts read entries back from the segments.
        config.log_resident_bytes = 0;
        (self.tune)(&mut config);
        let app = Arc::new(Recorder::default());
        let node = ClusterNode::start(config, listener, app.clone())
            .await
            .unwrap();
        self.nodes.insert(id, (node, app));
    }

    pub async fn leader(&self) -> NodeId {
        let deadline = Instant::now() + WAIT;
        loop {
            // A leader every live member agrees on.
            let seen: Vec<_> = self.nodes.values().map(|(n, _)| n.leader()).collect();
            if let Some(Some(l)) = seen.first() {
                if seen.iter().all(|s| *s == Some(*l)) && self.nodes.contains_key(l) {
                    return *l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {WAIT:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn propose_all(&self, leader: NodeId, from: u32, to: u32) {
        let node = &self.nodes[&leader].0;
        for i in from..to {
            node.propose(format!("c{i}").into_bytes(), WAIT)
                .await
                .unwrap_or_else(|e| panic!("c{i}: {e}"));
        }
    }

    /// Proposes each of `commands` at `leader`, one after another, each
    /// committed before the next.
    pub async fn propose_each(&self, leader: NodeId, commands: &[Vec<u8>]) {
        let node = &self.nodes[&leader].0;
        for c in commands {
            node.propose(c.clone(), WAIT).await.unwrap();
        }
    }

    /// Waits until every live member applied exactly `expected`, in order.
    pub async fn agree(&self, expected: &[Vec<u8>]) {
        let deadline = Instant::now() + WAIT;
        loop {
            let lists: Vec<_> = self
                .nodes
                .iter()
                .map(|(id, (_, r))| (*id, r.applied.lock().clone()))
                .collect();
            if lists.iter().all(|(_, l)| l == expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "members did not agree within {WAIT:?}: {:?}",
                lists
                    .iter()
                    .map(|(id, l)| (id, l.len()))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(mut self) {
        for (_, (node, _)) in std::mem::take(&mut self.nodes) {
            node.shutdown().await;
        }
    }
}

pub fn commands(to: u32) -> Vec<Vec<u8>> {
    (0..to).map(|i| format!("c{i}").into_bytes()).collect()
}

/// `count` commands of `bytes` bytes each: `c{i}:` padded with `x`.
pub fn big_commands(count: u32, bytes: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut c = format!("c{i}:").into_bytes();
            c.resize(bytes, b'x');
            c
        })
        .collect()
}
