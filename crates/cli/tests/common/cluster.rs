//! Three real `berth serve` processes forming a cluster on loopback
//! ports: each member has its own loopback address for its cluster
//! listener, so a partition can name it.
//!
//! Invariants:
//! - No fixed ports: every port is a free one picked at start.
//! - A member started here never outlives its [`Cluster`] (`Drop` kills
//!   and reaps every process and removes the directory).
//! - A member's stderr is read to the end; its last lines are kept for
//!   failure reports and every `ERROR` line apart.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A cluster with a majority alive elects a leader within this.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
pub const ELECTION_TIMEOUT_MS: &str = "1000";

#[derive(Default)]
pub struct Log {
    pub tail: VecDeque<String>,
    pub errors: Vec<String>,
}

pub struct Node {
    pub name: String,
    /// This member's own loopback address for its cluster listener (and
    /// the connections it makes to peers), so a partition can name it.
    pub cluster_ip: String,
    pub amqp: u16,
    pub http: u16,
    pub cluster: u16,
    pub dir: PathBuf,
    /// Started with `--cluster-join` (to be added to a running cluster).
    pub join: bool,
    /// More flags for this member (TLS files, say).
    pub extra: Vec<String>,
    pub child: Option<Child>,
    pub log: Arc<Mutex<Log>>,
}

/// The binary the members run: this build's, or `BERTH_TEST_BIN` (to
/// run a test against another build, say the one before a fix).
pub fn berth_bin() -> PathBuf {
    std::env::var_os("BERTH_TEST_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_berth").into(), PathBuf::from)
}

pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

pub fn free_port_on(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Loopback addresses of this run's three members: `127.A.B.11`–`13`, with
/// A.B from the process id so that two runs side by side never share one.
pub fn member_ips() -> Vec<String> {
    let pid = std::process::id();
    let (a, b) = (100 + pid % 100, 1 + (pid / 100) % 250);
    (11..=13).map(|d| format!("127.{a}.{b}.{d}")).collect()
}

impl Node {
    pub fn start(&mut self, peers: &[String], secret: &Path) {
        let mut cmd = Command::new(berth_bin());
        cmd.args(["serve", "--amqp-listen"])
            .arg(format!("127.0.0.1:{}", self.amqp))
            .arg("--http-listen")
            .arg(format!("127.0.0.1:{}", self.http))
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--cluster-node-id", &self.name, "--cluster-listen"])
            .arg(format!("{}:{}", self.cluster_ip, self.cluster))
            .arg("--cluster-secret-file")
            .arg(secret)
            .args(["--cluster-election-timeout-ms", ELECTION_TIMEOUT_MS])
            .args(["--log-level", "info"]);
        for p in peers {
            cmd.args(["--cluster-peer", p]);
        }
        if self.join {
            cmd.arg("--cluster-join");
        }
        cmd.args(&self.extra);
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start berth");
        let stderr = child.stderr.take().expect("piped");
        let log = Arc::clone(&self.log);
        let name = self.name.clone();
        // Every line also to `$BERTH_TEST_LOG_DIR/NAME.log`, when set: the
        // tail kept here is short.
        let mut full = std::env::var_os("BERTH_TEST_LOG_DIR").and_then(|d| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(&d).join(format!("{name}.log")))
                .ok()
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(f) = full.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                let mut l = log.lock().unwrap();
                if line.contains(" ERROR ") {
                    l.errors.push(format!("{name}: {line}"));
                }
                if l.tail.len() == 100 {
                    l.tail.pop_front();
                }
                l.tail.push_back(line);
            }
        });
        self.child = Some(child);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "CONT");
            let _already_dead_is_fine = c.kill();
            let _reaped = c.wait();
        }
    }

    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp)
    }

    /// `GET /api/health/checks/is-leader` answered 200.
    pub fn leads(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.http)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!(
            "GET /api/health/checks/is-leader HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.http
        );
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.1 200")
    }

    /// One HTTP request as `guest`; the status code and the body.
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.http)) else {
            return (0, String::new());
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.http,
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let code = answer
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (code, body.to_owned())
    }

    /// The Raft log's last segment, `raft.<20-digit base>.log` (the
    /// names sort in log order; docs/FORMAT.md).
    pub fn raft_log(&self) -> PathBuf {
        let dir = self.dir.join("cluster");
        let last = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.len() == 29 && n.starts_with("raft.") && n.ends_with(".log"))
                    .max()
            })
            .ok()
            .flatten();
        dir.join(last.unwrap_or_else(|| "raft.log".into()))
    }
}

pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub peers: Vec<String>,
    pub secret: PathBuf,
    pub root: PathBuf,
}

impl Cluster {
    pub fn start(root: &Path) -> Cluster {
        Cluster::start_with(root, |_| Vec::new())
    }

    /// Three members; `extra(i)` gives member `i` (0-based) more flags.
    pub fn start_with(root: &Path, extra: impl Fn(usize) -> Vec<String>) -> Cluster {
        std::fs::create_dir_all(root).unwrap();
        let secret = root.join("secret");
        std::fs::write(&secret, "a test secret of more than sixteen bytes\n").unwrap();
        let ips = member_ips();
        let mut nodes: Vec<Node> = (1..=3)
            .map(|i| Node {
                name: format!("n{i}"),
                cluster_ip: ips[i - 1].clone(),
                amqp: free_port(),
                http: free_port(),
                cluster: free_port_on(&ips[i - 1]),
                dir: root.join(format!("n{i}")),
                join: false,
                extra: extra(i - 1),
                child: None,
                log: Arc::default(),
            })
            .collect();
        let peers: Vec<String> = nodes
            .iter()
            .map(|n| format!("{}@{}:{}", n.name, n.cluster_ip, n.cluster))
            .collect();
        for n in &mut nodes {
            n.start(&peers, &secret);
        }
        Cluster {
            nodes,
            peers,
            secret,
            root: root.to_owned(),
        }
    }

    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill9();
        let (peers, secret) = (self.peers.clone(), self.secret.clone());
        self.nodes[i].start(&peers, &secret);
    }

    /// The index of the member that serves now, waiting for one.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            if let Some(i) =
                (0..3).find(|i| self.nodes[*i].child.is_some() && self.nodes[*i].leads())
            {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no member served within {LEADER_TIMEOUT:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn uris(&self) -> Vec<String> {
        self.nodes.iter().map(Node::uri).collect()
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let l = n.log.lock().unwrap();
                format!(
                    "--- {} ---\n{}",
                    n.name,
                    l.tail.iter().cloned().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn errors(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flat_map(|n| n.log.lock().unwrap().errors.clone())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill9();
        }
        let _may_be_gone = std::fs::remove_dir_all(&self.root);
    }
}

/// Publishes messages `ids` (each body: the id, little-endian, padded to
/// `bytes`) persistent to the durable queue `queue` through `uri`, each
/// confirmed before the next; returns the confirmed ids (all of them: a
/// nack fails the test).
pub async fn publish(
    uri: &str,
    queue: &str,
    ids: std::ops::Range<u64>,
    bytes: usize,
) -> std::collections::HashSet<u64> {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
    let conn = lapin::Connection::connect(uri, Default::default())
        .await
        .expect("connect to the leader");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, lapin::types::FieldTable::default())
        .await
        .unwrap();
    let mut confirmed = std::collections::HashSet::new();
    for id in ids {
        let mut body = id.to_le_bytes().to_vec();
        body.resize(bytes.max(8), b'x');
        let c = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        assert!(c.await.expect("confirm").is_ack(), "message {id} nacked");
        confirmed.insert(id);
    }
    let _ = conn.close(200, "published".into()).await;
    confirmed
}

/// Takes (and acks) every message of `queue` through `uri`: the ids.
pub async fn drain(uri: &str, queue: &str) -> std::collections::HashSet<u64> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let conn = lapin::Connection::connect(uri, Default::default())
        .await
        .expect("connect to the leader");
    let ch = conn.create_channel().await.unwrap();
    let mut got = std::collections::HashSet::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .expect("basic.get")
    {
        got.insert(u64::from_le_bytes(m.delivery.data[..8].try_into().unwrap()));
        m.delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    got
}
