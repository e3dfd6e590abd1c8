//! The crash tests' harness: start the real `berth` binary on a data
//! directory that outlives it, find its port from the `berth ready` line,
//! SIGKILL it, start it again on the same directory.
//!
//! Invariants:
//! - No fixed ports: the broker listens on port 0 and the address is read
//!   from its `berth ready amqp=HOST:PORT` log line.
//! - A broker started here never outlives its [`Broker`] value (`Drop`
//!   kills and reaps it, also while a test panics).
//! - The broker's stderr is read to the end, so it can never block on a
//!   full pipe; its last lines are kept for failure reports, and every
//!   `ERROR` line is kept apart for the test to check.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_testdir::TestDir;
use lapin::{Connection, ConnectionProperties};

pub mod cluster;

/// How long a broker may take to recover and report ready.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of broker log kept for a failure report.
const LOG_LINES_KEPT_MAX: usize = 200;

/// What the broker has logged so far.
#[derive(Default)]
pub struct Log {
    /// The last [`LOG_LINES_KEPT_MAX`] lines.
    pub tail: VecDeque<String>,
    /// Every line logged at `ERROR` level (damage, loss, a poisoned group).
    pub errors: Vec<String>,
    /// Every line logged at `WARN` level (a torn tail truncated, ...).
    pub warnings: Vec<String>,
}

pub struct Broker {
    child: Child,
    pub uri: String,
    pub log: Arc<Mutex<Log>>,
    /// The `berth ready ...` line, for the other listeners' addresses.
    pub ready: String,
}

impl Broker {
    /// Starts `berth serve` on `data_dirs` with `flags` added.
    pub fn start(data_dirs: &[&Path], flags: &[&str]) -> Broker {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(["serve", "--amqp-listen", "127.0.0.1:0"]);
        for d in data_dirs {
            cmd.arg("--data-dir").arg(d);
        }
        let mut child = cmd
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start berth");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Log::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("berth ready") {
                    if let Some(tx) = tx.take() {
                        let _receiver_may_have_given_up = tx.send(line.clone());
                    }
                }
                let mut log = kept.lock().unwrap();
                if line.contains(" ERROR ") {
                    log.errors.push(line.clone());
                }
                if line.contains(" WARN ") {
                    log.warnings.push(line.clone());
                }
                if log.tail.len() == LOG_LINES_KEPT_MAX {
                    log.tail.pop_front();
                }
                log.tail.push_back(line);
            }
        });
        let Ok(ready) = rx.recv_timeout(STARTUP_TIMEOUT) else {
            let _already_dead_is_fine = child.kill();
            let _reap_errors_do_not_matter = child.wait();
            let tail: Vec<String> = log.lock().unwrap().tail.iter().cloned().collect();
            panic!(
                "berth did not report ready within {STARTUP_TIMEOUT:?}; its log:\n{}",
                tail.join("\n")
            );
        };
        let addr = ready_addr(&ready, "amqp").expect("the ready line names the AMQP listener");
        Broker {
            child,
            uri: format!("amqp://guest:guest@{addr}/%2f"),
            log,
            ready,
        }
    }

    /// The first address of the `kind` listener (`amqp`, `mqtt`, ...).
    pub fn addr(&self, kind: &str) -> Option<String> {
        ready_addr(&self.ready, kind)
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// The last lines the broker logged, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Every `WARN` line logged so far.
    pub fn warnings(&self) -> Vec<String> {
        self.log.lock().unwrap().warnings.clone()
    }

    /// Every `ERROR` line logged so far.
    pub fn errors(&self) -> Vec<String> {
        self.log.lock().unwrap().errors.clone()
    }
}

/// The first address after ` KIND=` in a ready line.
fn ready_addr(ready: &str, kind: &str) -> Option<String> {
    let after = ready.split(&format!("{kind}=")).nth(1)?;
    Some(after.split([',', ' ']).next()?.to_owned())
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _already_dead_is_fine = self.child.kill();
            let _reap_errors_do_not_matter_on_drop = self.child.wait();
        }
    }
}

pub async fn connect(uri: &str) -> Connection {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("connect")
}

/// A directory for one test run, not made yet, removed when the test
/// ends, passed or failed (see berth-testdir).
pub fn temp_dir(name: &str, seed: u64) -> TestDir {
    TestDir::unmade(&format!("{name}-{seed}"))
}

/// The seed of a seeded test: `BERTH_TEST_SEED` if set, else random.
pub fn seed(test: &str) -> u64 {
    let seed: u64 = std::env::var("BERTH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test} seed {seed} (replay with BERTH_TEST_SEED={seed})");
    seed
}

/// Every client call of the fault tests is bounded, so a broker that stops
/// answering fails the test instead of hanging it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `fut` within [`CALL_TIMEOUT`]; `None` if it failed or timed out.
pub async fn bounded<T, E>(fut: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Some(v),
        _ => None,
    }
}

/// Declares a durable queue (fails the test if the broker refuses).
pub async fn declare_durable(ch: &lapin::Channel, queue: &str) {
    ch.queue_declare(
        queue.into(),
        lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        lapin::types::FieldTable::default(),
    )
    .await
    .expect("declare");
}
