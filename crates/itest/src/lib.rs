//! Harness for black-box tests: starts the real `berth` binary (or points at
//! the broker named by `BERTH_TEST_URI`) and offers small helpers around lapin
//! so that each test reads as the behaviour it pins.
//!
//! Invariants:
//! - A broker started here never outlives its [`Broker`] value: `Drop` sends
//!   SIGTERM, waits briefly, then SIGKILLs, also while a test panics.
//! - No fixed ports: berth listens on port 0 and the harness reads the bound
//!   address from its `berth ready amqp=HOST:PORT` log line.
//! - Every name a test creates is unique ([`unique`]), so the suite can share
//!   one external broker (RabbitMQ, for reference runs) with other users.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use lapin;
use lapin::{Channel, Connection, ConnectionProperties};

mod errors;
pub use errors::*;
mod fields;
pub use fields::*;
mod publishing;
pub use publishing::*;
mod consuming;
pub use consuming::*;
pub mod load;
mod raw;
pub use raw::*;
/// Environment variable naming an already running broker to test instead of
/// starting berth (e.g. RabbitMQ, to check that the assertions are real
/// RabbitMQ behaviour).
pub const TEST_URI_ENV: &str = "BERTH_TEST_URI";
/// Environment variable overriding the path of the berth binary.
pub const BIN_ENV: &str = "BERTH_BIN";

/// When set, every checked reply code and text is printed (run with
/// `--nocapture` to list what a broker answers).
pub const SHOW_REPLIES_ENV: &str = "ITEST_SHOW_REPLIES";

/// Upper bound on one whole test; nothing in the suite may hang past it.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a test waits for something that should happen (a delivery, a
/// cancel notification) before calling it missing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a test waits to be convinced that something does *not* happen
/// (no further delivery past a prefetch limit).
pub const QUIET_PERIOD: Duration = Duration::from_millis(300);

const READY_MARKER: &str = "berth ready amqp=";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Lines of broker log kept for the failure report of a test.
const LOG_LINES_KEPT_MAX: usize = 400;

/// Runs a test body under [`TEST_TIMEOUT`], failing the test if it takes longer.
pub async fn within<F: Future<Output = ()>>(body: F) {
    if tokio::time::timeout(TEST_TIMEOUT, body).await.is_err() {
        panic!("test did not finish within {TEST_TIMEOUT:?}");
    }
}

/// Awaits `fut` for at most [`EVENT_TIMEOUT`], naming `what` if it takes longer.
#[track_caller]
pub fn bounded<F: Future>(what: &str, fut: F) -> impl Future<Output = F::Output> {
    let what = what.to_owned();
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(EVENT_TIMEOUT, fut).await {
            Ok(out) => out,
            Err(_) => panic!("{what}: no answer within {EVENT_TIMEOUT:?} (at {caller})"),
        }
    }
}

/// A name no other test (and no other run) uses: `prefix` plus process id,
/// a counter and the clock.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("itest.{prefix}.{}.{n}.{nanos:x}", std::process::id())
}

/// True when the suite runs against an external broker (`BERTH_TEST_URI`).
pub fn is_external() -> bool {
    std::env::var_os(TEST_URI_ENV).is_some_and(|v| !v.is_empty())
}

/// A broker under test: either a berth process owned by this value or the
/// external broker named by `BERTH_TEST_URI`.
pub struct Broker {
    uri: String,
    amqp_addr: String,
    process: Option<BrokerProcess>,
}

struct BrokerProcess {
    child: Child,
    data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Broker {
    /// The broker for a test that needs no special settings.
    pub fn start() -> Broker {
        if is_external() {
            let uri = std::env::var(TEST_URI_ENV).expect("BERTH_TEST_URI is set");
            let amqp_addr = authority_of(&uri);
            return Broker {
                uri,
                amqp_addr,
                process: None,
            };
        }
        Self::spawn(&[])
    }

    /// A berth started with extra `flags`, or `None` (the test is skipped,
    /// and says so) when the suite runs against an external broker, whose
    /// settings it cannot choose.
    pub fn start_with_flags(flags: &[&str]) -> Option<Broker> {
        if is_external() {
            eprintln!("skipped: needs berth started with {flags:?}, but {TEST_URI_ENV} is set");
            return None;
        }
        Some(Self::spawn(flags))
    }

    /// `None` (the test is skipped, and says so) when running against an
    /// external broker; for behaviour only berth has.
    pub fn start_berth_only(why: &str) -> Option<Broker> {
        if is_external() {
            eprintln!("skipped against {TEST_URI_ENV}: {why}");
            return None;
        }
        Some(Self::spawn(&[]))
    }

    fn spawn(flags: &[&str]) -> Broker {
        let bin = berth_bin();
        assert!(
            bin.exists(),
            "berth binary not found at {} (build it with `cargo build --release`, or set {BIN_ENV})",
            bin.display()
        );
        let data_dir = fresh_data_dir();
        let mut child = Command::new(&bin)
            .arg("serve")
            .arg("--amqp-listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(flags)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel::<String>();
        let log_writer = Arc::clone(&log);
        // Keeps draining stderr for the broker's whole life, so that a full
        // pipe can never stall it, and keeps the tail for failure reports.
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                if let Some(pos) = line.find(READY_MARKER) {
                    let addrs = line[pos + READY_MARKER.len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(addrs);
                    }
                }
                let mut kept = log_writer.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() >= LOG_LINES_KEPT_MAX {
                    kept.remove(0);
                }
                kept.push(line);
            }
        });
        let mut process = BrokerProcess {
            child,
            data_dir,
            log,
        };
        let addrs = match ready_rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(addrs) => addrs,
            Err(_) => {
                let status = process.child.try_wait().ok().flatten();
                let log = process.log_tail();
                drop(process);
                panic!(
                    "berth did not log `{READY_MARKER}HOST:PORT` within {STARTUP_TIMEOUT:?} \
                     (exit status {status:?}); its log:\n{log}"
                );
            }
        };
        let amqp_addr = addrs
            .split(',')
            .find(|a| !a.is_empty())
            .unwrap_or_else(|| panic!("no address in ready line: {addrs:?}"))
            .to_owned();
        Broker {
            uri: format!("amqp://guest:guest@{amqp_addr}/%2f"),
            amqp_addr,
            process: Some(process),
        }
    }

    /// The AMQP URI of this broker (vhost `/`, user guest).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The pid of the berth this value started (`None` for an external
    /// broker), for benchmarks reading its CPU time and RSS from /proc.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// `HOST:PORT` of the AMQP listener, for raw sockets.
    pub fn amqp_addr(&self) -> &str {
        &self.amqp_addr
    }

    /// The URI with another user, password or vhost (percent-encoded by caller).
    pub fn uri_with(&self, user: &str, password: &str, vhost: &str, query: &str) -> String {
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("amqp://{user}:{password}@{}/{vhost}{q}", self.amqp_addr)
    }

    /// A new connection as guest to vhost `/`.
    pub async fn connect(&self) -> Connection {
        bounded(
            "connect",
            Connection::connect(&self.uri, ConnectionProperties::default()),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.uri))
    }

    /// A new connection and one open channel on it.
    pub async fn channel(&self) -> (Connection, Channel) {
        let conn = self.connect().await;
        let ch = open_channel(&conn).await;
        (conn, ch)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(process) = self.process.as_mut() {
            if std::thread::panicking() {
                eprintln!(
                    "---- berth log ({}) ----\n{}\n---- end of berth log ----",
                    self.amqp_addr,
                    process.log_tail()
                );
            }
        }
    }
}

impl BrokerProcess {
    fn log_tail(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SIGTERM first so berth can shut down as an operator's would;
            // std only offers SIGKILL, so ask kill(1) for the polite signal.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn berth_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(bin);
    }
    workspace_root()
        .join("target")
        .join("release")
        .join("berth")
}

fn workspace_root() -> PathBuf {
    // crates/itest -> workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/itest lies two levels below the workspace root")
        .to_path_buf()
}

fn fresh_data_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("berth-data"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create data dir {}: {e}", dir.display()));
    dir
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte(@..~)
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn authority_of(uri: &str) -> String {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    let hostport = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5672")
    }
}

/// Opens a channel, failing the test on error.
pub async fn open_channel(conn: &Connection) -> Channel {
    bounded("channel.open", conn.create_channel())
        .await
        .expect("channel.open")
}
