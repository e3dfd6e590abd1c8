//! A follower whose disk fills: one failed write to its Raft log stopped
//! its Raft for good (until an operator restarted it), and nothing said
//! so. Now its alarms say so, the others keep committing, and once the
//! disk has room it restarts by itself, catches up, and can take over
//! with every confirmed message.
//!
//! The follower's data directory is a small tmpfs mounted by the test
//! (needs root, as the cluster suite does for iptables); a filler file
//! takes its free space and is removed later.
//!
//! Ignored by a plain `cargo test`; `scripts/test.sh` runs it in the
//! cluster suite:
//! `cargo test --release -p berth-cli --test cluster_disk_full -- --ignored --nocapture`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{drain, publish, Cluster};

const QUEUE: &str = "disk-full";
const TMPFS_BYTES: &str = "400m";
const BODY_BYTES: usize = 64 * 1024;
const WAIT: Duration = Duration::from_secs(60);

/// The tmpfs under a member's data directory; unmounted when dropped.
struct Mount(std::path::PathBuf);

impl Mount {
    fn new(dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_BYTES}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cannot mount a tmpfs at {} (this test needs root)",
            dir.display()
        );
        Mount(dir.to_owned())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `filler` until it is full.
fn fill(filler: &Path) {
    let _full_is_the_point = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

#[test]
#[ignore = "a cluster fault test of ~30 s: scripts/test.sh runs it in the cluster suite"]
fn a_follower_whose_disk_filled_says_so_and_recovers_by_itself() {
    let root = std::env::temp_dir().join(format!("berth-disk-full-{}", std::process::id()));
    let _left_over = std::fs::remove_dir_all(&root);
    let _mount = Mount::new(&root.join("n3"));
    let mut cluster = Cluster::start(&root);
    // The member on the small disk must follow.
    let mut leader = cluster.leader();
    for _ in 0..3 {
        if leader != 2 {
            break;
        }
        cluster.restart(2);
        std::thread::sleep(Duration::from_secs(2));
        leader = cluster.leader();
    }
    assert_ne!(leader, 2, "n3 keeps leading");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let uri = cluster.nodes[leader].uri();
    let mut confirmed = rt.block_on(publish(&uri, QUEUE, 0..50, BODY_BYTES));

    let filler = root.join("n3").join("filler");
    fill(&filler);
    // Past the full disk: the follower's log writes fail; the other two
    // still commit every publish.
    confirmed.extend(rt.block_on(publish(&uri, QUEUE, 50..400, BODY_BYTES)));
    let f = &cluster.nodes[2];
    let deadline = Instant::now() + WAIT;
    let alarms = loop {
        let (code, body) = f.http("GET", "/api/health/checks/alarms", "");
        if code == 503 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the full follower raised no alarm: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(alarms.contains("disk"), "{alarms}");
    // The leader shows it too: in its cluster-wide alarms check (not in
    // its local one), in /api/nodes and in /metrics.
    let l = &cluster.nodes[leader];
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = l.http("GET", "/api/health/checks/alarms", "");
        if code == 503 && body.contains("member n3: disk") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader does not show the follower's alarm: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = l.http("GET", "/api/health/checks/local-alarms", "");
    assert_eq!(code, 200, "the leader's own alarms: {body}");
    let (_, nodes) = l.http("GET", "/api/nodes", "");
    let n3 = json(&nodes)
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n3")
        .cloned()
        .unwrap_or_else(|| panic!("no n3 in {nodes}"));
    assert_eq!(n3["disk_free_alarm"], true, "{n3}");
    let (_, metrics) = l.http("GET", "/metrics", "");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("berth_raft_member_alarms{member=\"n3\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );

    // Room again: the follower comes back by itself and catches up.
    std::fs::remove_file(&filler).unwrap();
    let (_, status) = cluster.nodes[leader].http("GET", "/api/berth/cluster", "");
    let target = json(&status)["last_log_index"].as_u64().unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = f.http("GET", "/api/berth/cluster", "");
        let applied = json(&body)["applied_index"].as_u64();
        let running = json(&body)["role"] == "follower";
        if code == 200 && running && applied.is_some_and(|a| a >= target) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower did not catch up to {target} after its disk had room: {code} {body}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Its Raft runs again. (The small disk may still be below
    // limits.disk_free_bytes_min: the store and the log prepare their
    // segments ahead, so that alarm can stay.)
    let (_, alarms) = f.http("GET", "/api/health/checks/alarms", "");
    assert!(!alarms.contains("raft"), "{alarms}");

    // It holds every confirmed message: with the leader gone, it and the
    // third member elect a leader that has them all.
    cluster.nodes[leader].kill9();
    let now = cluster.leader();
    let held = rt.block_on(drain(&cluster.nodes[now].uri(), QUEUE));
    let lost: Vec<u64> = confirmed.difference(&held).copied().collect();
    println!(
        "disk-full follower: {} confirmed, {} held after failover to n{}, {} lost",
        confirmed.len(),
        held.len(),
        now + 1,
        lost.len()
    );
    assert!(lost.is_empty(), "confirmed messages lost: {lost:?}");
}
