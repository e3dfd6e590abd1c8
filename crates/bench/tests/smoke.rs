//! Smoke runs of every scenario at `--scale smoke`, asserting the accounting
//! (published = confirmed = consumed, depths as expected), not speed.
//!
//! The broker is `BERTH_TEST_URI` when set; otherwise the real berth binary
//! (`BERTH_BIN`, default `target/release/berth`) started on a free port with
//! a temporary data directory and stopped at the end of each test. Without
//! either, the tests print why and pass as skipped.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};

use berth_testdir::TestDir;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use berth_bench::scenarios::{fanin, groupcommit, pagesize, restart, spooler, Plan};
use berth_bench::{CommonArgs, Outcome, Target, Ui};

/// A broker for one test; stops what it started on drop.
struct Broker {
    uri: String,
    child: Option<Child>,
    /// Held for its drop: removed after the broker is stopped (see
    /// berth-testdir).
    _data_dir: Option<TestDir>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The process may already be gone (a restart test killed it).
            c.kill().ok();
            c.wait().ok();
        }
    }
}

fn berth_bin() -> PathBuf {
    std::env::var_os("BERTH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/berth"),
        PathBuf::from,
    )
}

/// Starts `berth serve` with `listen` and waits for its ready line.
fn start_berth(listen: &str, data_dir: &Path) -> Result<(Child, String), String> {
    let bin = berth_bin();
    let mut child = Command::new(&bin)
        .args(["serve", "--amqp-listen", listen, "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(rest) = line.split("berth ready amqp=").nth(1) {
                    let addr = rest
                        .split([',', ' '])
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    tx.send(addr).ok();
                    sent = true;
                }
            }
            // Keep draining so the broker never blocks on a full pipe.
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(addr) => Ok((child, addr)),
        Err(_) => {
            child.kill().ok();
            child.wait().ok();
            Err("berth printed no `berth ready` line within 30 s".into())
        }
    }
}

fn broker(test: &str) -> Option<Broker> {
    if let Ok(uri) = std::env::var("BERTH_TEST_URI") {
        return Some(Broker {
            uri,
            child: None,
            _data_dir: None,
        });
    }
    let bin = berth_bin();
    if !bin.exists() {
        eprintln!(
            "{test}: skipped: BERTH_TEST_URI unset and no berth binary at {} \
             (cargo build --release -p berth-cli)",
            bin.display()
        );
        return None;
    }
    let dir = TestDir::new(&format!("bench-{test}"));
    let (child, addr) = start_berth("127.0.0.1:0", &dir).expect("start berth");
    Some(Broker {
        uri: format!("amqp://guest:guest@{addr}/%2f"),
        child: Some(child),
        _data_dir: Some(dir),
    })
}

fn run(plan: &Plan, uri: &str) -> Outcome {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let target = Target {
        label: "a",
        uri: uri.to_string(),
        pid: None,
        mgmt_url: None,
    };
    rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(120),
            berth_bench::measure(plan, &target, &Ui::new(true)),
        )
        .await
        .expect("smoke run finishes within 120 s")
        .unwrap_or_else(|e| panic!("{} smoke run failed: {e}", plan.name()))
    })
}

fn common(uri: &str) -> CommonArgs {
    CommonArgs::for_uri(uri)
}

#[test]
fn fanin_smoke_confirms_and_enqueues_every_message() {
    let Some(b) = broker("fanin") else { return };
    let args = fanin::Args {
        common: common(&b.uri),
        concurrency: None,
        size: 1024,
        messages: None,
    };
    let plan = Plan::Fanin(fanin::Config::from_args(&args).unwrap());
    let out = run(&plan, &b.uri);
    // 2 modes × (1 + 3 producers) × 20 messages.
    assert_eq!(out.accounting.published, 2 * 4 * 20);
    assert_eq!(out.accounting.confirmed, out.accounting.published);
    assert!(
        out.accounting.failures.is_empty(),
        "{:?}",
        out.accounting.failures
    );
    assert!(out.metrics.iter().any(|m| m.name == "shared.c3.msgs_per_s"));
}

#[test]
fn pagesize_smoke_produces_then_drains_every_message() {
    let Some(b) = broker("pagesize") else { return };
    let args = pagesize::Args {
        common: common(&b.uri),
        sizes: "2048,16384".into(),
        queues: 5,
        messages: None,
        confirm_window: 16,
        prefetch: 20,
        warm: true,
    };
    let plan = Plan::Pagesize(pagesize::Config::from_args(&args).unwrap());
    let out = run(&plan, &b.uri);
    let total = 2 * 5 * 50;
    assert_eq!(out.accounting.published, total);
    assert_eq!(out.accounting.confirmed, total);
    assert_eq!(out.accounting.consumed, total);
    assert!(
        out.accounting.failures.is_empty(),
        "{:?}",
        out.accounting.failures
    );
}

#[test]
fn groupcommit_smoke_commits_what_it_consumes_and_rollbacks_leave_nothing() {
    let Some(b) = broker("groupcommit") else {
        return;
    };
    let args = groupcommit::Args {
        common: common(&b.uri),
        clients: 50,
        k: 5,
        rollback_share: 0.2,
        stall_share: 0.2,
        stall_ms: 1000,
        size: 512,
    };
    let cfg = groupcommit::Config::from_args(&args).unwrap();
    assert!(cfg.rollback >= 1 && cfg.stall_clients >= 1 && cfg.good >= 1);
    let out = run(&Plan::Groupcommit(cfg), &b.uri);
    assert!(out.accounting.confirmed > 0);
    assert_eq!(out.accounting.consumed, out.accounting.confirmed);
    assert!(
        out.accounting.published > out.accounting.confirmed,
        "rollbacks publish"
    );
    assert!(
        out.accounting.failures.is_empty(),
        "{:?}",
        out.accounting.failures
    );
    assert!(out
        .metrics
        .iter()
        .any(|m| m.name == "adverse.good_tx_per_s"));
}

#[test]
fn spooler_smoke_delivers_backlog_and_load() {
    let Some(b) = broker("spooler") else { return };
    let args = spooler::Args {
        common: common(&b.uri),
        queues: 5000,
        producers: 2048,
        backlog: 80_000,
        rate: None,
        size: 256,
        consumer_connections: 16,
        prefetch: 10,
        status_interval: 2.0,
    };
    let plan = Plan::Spooler(spooler::Config::from_args(&args).unwrap());
    let out = run(&plan, &b.uri);
    assert_eq!(out.accounting.published, out.accounting.confirmed);
    assert_eq!(out.accounting.consumed, out.accounting.confirmed);
    assert!(
        out.accounting.confirmed > 200,
        "load adds to the 200 backlog"
    );
    assert!(
        out.accounting.failures.is_empty(),
        "{:?}",
        out.accounting.failures
    );
    assert!(out.metrics.iter().any(|m| m.name == "e2e_ms_p99"));
}

/// Restart needs a broker that keeps persistent messages across a kill.
/// Against the berth binary (not BERTH_TEST_URI, which the bench may not
/// kill) on a port picked free and kept across the restart.
#[test]
fn restart_smoke_recovers_every_confirmed_message() {
    if std::env::var("BERTH_TEST_URI").is_ok() {
        eprintln!("restart: skipped: never kill a broker given by BERTH_TEST_URI");
        return;
    }
    let bin = berth_bin();
    if !bin.exists() {
        eprintln!("restart: skipped: no berth binary at {}", bin.display());
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let dir = TestDir::new("bench-restart");
    let (child, addr) = start_berth(&listen, &dir).expect("start berth");
    let b = Broker {
        uri: format!("amqp://guest:guest@{addr}/%2f"),
        child: Some(child),
        _data_dir: None,
    };
    let args = restart::Args {
        common: common(&b.uri),
        queues: 3,
        messages: None,
        size: 2048,
        rr_rate: 20.0,
        cache: "warm".into(),
        keep_queues: false,
        start_cmd: Some(format!(
            "exec {} serve --amqp-listen {listen} --data-dir {} --queue-resident-messages-max 10",
            bin.display(),
            dir.display()
        )),
        kill_pid: b.child.as_ref().map(Child::id),
        pid_file: None,
        kill_cmd: None,
        vs_start_cmd: None,
        vs_kill_pid: None,
        vs_pid_file: None,
        vs_kill_cmd: None,
        recovery_timeout: None,
        broker_log: None,
    };
    let cfg = restart::Config::from_args(&args).unwrap();
    let control = cfg.control_a.clone();
    let plan = Plan::Restart(Box::new(cfg));
    let result = std::panic::catch_unwind(|| run(&plan, &b.uri));
    control.kill_started().expect("stop the restarted berth");
    let out = result.expect("restart smoke run");
    assert_eq!(out.accounting.confirmed, 3 * 50);
    assert!(
        out.accounting.failures.is_empty(),
        "{:?}",
        out.accounting.failures
    );
    assert!(out.metrics.iter().any(|m| m.name == "warm.all_depths_s"));
}
