//! A member whose data directory is wiped must not help a lagging member
//! win an election: with an empty log and no vote it would vote for
//! anyone, and a leader elected that way lacks messages it never had,
//! confirmed by the old majority. Its new member id gives it away
//! (`berth_cluster::identity`): the others refuse it until the operator
//! removes it and adds it again.
//!
//! Ignored by a plain `cargo test`; `scripts/test.sh` runs it in the
//! cluster suite:
//! `cargo test --release -p berth-cli --test cluster_rejoin -- --ignored --nocapture`.

use std::time::{Duration, Instant};

mod common;
use common::cluster::{drain, publish, signal, Cluster};

const QUEUE: &str = "rejoin";

#[test]
#[ignore = "a cluster fault test of ~30 s: scripts/test.sh runs it in the cluster suite"]
fn a_wiped_member_cannot_elect_a_leader_that_lacks_confirmed_messages() {
    let root = std::env::temp_dir().join(format!("berth-cluster-rejoin-{}", std::process::id()));
    let _left_over = std::fs::remove_dir_all(&root);
    let mut cluster = Cluster::start(&root);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leader = cluster.leader();
    let (wiped, lagging) = ((leader + 1) % 3, (leader + 2) % 3);
    let mut confirmed = rt.block_on(publish(&cluster.nodes[leader].uri(), QUEUE, 0..100, 8));
    // Members meet each other (learn their ids) within a moment of the
    // cluster forming; a wipe comes long after in any real cluster.
    std::thread::sleep(Duration::from_secs(1));

    // The lagging member misses what the leader and the other follower
    // confirm next.
    let lag_pid = cluster.nodes[lagging].pid().unwrap();
    signal(lag_pid, "STOP");
    confirmed.extend(rt.block_on(publish(&cluster.nodes[leader].uri(), QUEUE, 100..300, 8)));

    // The two that hold it all go down; one comes back with an empty data
    // directory under its old name, beside the lagging one.
    cluster.nodes[leader].kill9();
    cluster.nodes[wiped].kill9();
    std::fs::remove_dir_all(&cluster.nodes[wiped].dir).unwrap();
    signal(lag_pid, "CONT");
    cluster.restart(wiped);
    let watch = Instant::now();
    let mut led = None;
    while watch.elapsed() < Duration::from_secs(10) {
        if let Some(i) = [wiped, lagging]
            .into_iter()
            .find(|i| cluster.nodes[*i].leads())
        {
            led = Some(i);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(i) = led {
        // Whoever leads must hold every confirmed message.
        let held = rt.block_on(drain(&cluster.nodes[i].uri(), QUEUE));
        let lost = confirmed.difference(&held).count();
        panic!(
            "{} led with the wiped member's vote, holding {} of {} confirmed messages ({lost} lost)",
            cluster.nodes[i].name,
            held.len(),
            confirmed.len()
        );
    }
    let logs = cluster.logs();
    assert!(
        logs.contains("remove-node") && logs.contains("data directory is new"),
        "the refusal tells the operator what to do:\n{logs}"
    );

    // The member that held it all comes back: it leads, nothing is lost.
    cluster.restart(leader);
    let now = cluster.leader();
    let held = rt.block_on(drain(&cluster.nodes[now].uri(), QUEUE));
    let lost: Vec<&u64> = confirmed.difference(&held).collect();
    println!(
        "confirmed {}, delivered {}, lost {}; {} leads",
        confirmed.len(),
        held.len(),
        lost.len(),
        cluster.nodes[now].name
    );
    assert!(lost.is_empty(), "confirmed messages lost: {lost:?}");

    // The operator's procedure: remove the wiped member, add it again; it
    // catches up as a fresh member.
    let name = cluster.nodes[wiped].name.clone();
    let peer = format!(
        "{name}@{}:{}",
        cluster.nodes[wiped].cluster_ip, cluster.nodes[wiped].cluster
    );
    let (code, answer) =
        cluster.nodes[now].http("DELETE", &format!("/api/berth/cluster/members/{name}"), "");
    assert_eq!(code, 200, "remove-node: {answer}");
    std::thread::sleep(Duration::from_secs(2)); // every member forgets its id
    let (code, answer) = cluster.nodes[now].http(
        "POST",
        "/api/berth/cluster/members",
        &format!("{{\"peer\":\"{peer}\"}}"),
    );
    assert_eq!(code, 200, "add-node: {answer}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = cluster.nodes[now].http("GET", "/api/berth/cluster", "");
        let entry = status
            .split('{')
            .find(|m| m.contains(&format!("\"name\":\"{name}\"")))
            .unwrap_or("");
        if entry.contains("\"lag_entries\":0,") && entry.contains("\"voter\":true") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not rejoin: {status}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
