//! A member whose Raft log is damaged (a complete frame with a wrong
//! checksum) or shorter than what it had fdatasynced (cut on a frame
//! boundary, as a disk that lost synced writes) may have lost entries it
//! acknowledged: it rejoins on probation, never helping to elect a leader
//! until it has caught up.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use berth_cluster::{NodeId, SyncGate};

mod common;
use common::{commands, Cluster, SECRET, WAIT};

/// Where the `n`th frame of `bytes` starts.
fn frame_start(bytes: &[u8], n: usize) -> usize {
    let mut at = 0usize;
    for _ in 0..n {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
    }
    assert!(
        at + 9 < bytes.len(),
        "the Raft log has fewer than {n} frames"
    );
    at
}

/// Flips one payload byte of the 3rd frame of a node's Raft log.
fn flip_a_byte(log: &Path) {
    let mut bytes = std::fs::read(log).unwrap();
    let at = frame_start(&bytes, 3);
    bytes[at + 9] ^= 0x20;
    std::fs::write(log, bytes).unwrap();
}

/// Cuts a node's Raft log just before its 3rd frame: it still ends cleanly.
fn cut_on_a_frame_boundary(log: &Path) {
    let mut bytes = std::fs::read(log).unwrap();
    bytes.truncate(frame_start(&bytes, 3));
    std::fs::write(log, bytes).unwrap();
}

async fn restart(cluster: &mut Cluster, id: NodeId) {
    let listener = common::rebind(&cluster.members[&id]).await;
    cluster
        .start_node(id, listener, SyncGate::default(), SECRET)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_damaged_log_votes_only_after_catching_up() {
    votes_only_after_catching_up("damaged", flip_a_byte, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_log_lost_synced_entries_votes_only_after_catching_up() {
    votes_only_after_catching_up("shortened", cut_on_a_frame_boundary, false).await;
}

async fn votes_only_after_catching_up(name: &str, damage: fn(&Path), kept_aside: bool) {
    let mut cluster = Cluster::start(name, &BTreeMap::new(), &BTreeMap::new()).await;
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 0, 20).await;
    cluster.agree(&commands(20)).await;
    let damaged = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let third = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != damaged)
        .unwrap();

    // The leader and the damaged member stop; the damaged member's log
    // loses its tail from the 3rd frame on.
    for id in [leader, damaged] {
        let (node, _) = cluster.nodes.remove(&id).unwrap();
        node.shutdown().await;
    }
    let dir = cluster.root.join(format!("n{damaged}"));
    damage(&berth_cluster::log_segments::segment_paths(&dir).unwrap()[0]);
    restart(&mut cluster, damaged).await;
    assert!(
        cluster.nodes[&damaged].0.on_probation(),
        "a damaged log must start on probation"
    );
    let aside = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("raft.log.damaged-")
        });
    assert_eq!(
        aside, kept_aside,
        "damaged bytes are kept aside (and only those)"
    );

    // With only the third member and the damaged one alive, nobody may be
    // elected: the damaged member grants no vote (the third would need it).
    let quiet_until = Instant::now() + Duration::from_millis(3_000);
    while Instant::now() < quiet_until {
        for (id, (node, _)) in &cluster.nodes {
            assert_ne!(
                node.leader(),
                Some(*id),
                "node {id} became leader with the damaged member's help"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The old leader returns: a leader is elected without the damaged
    // member, which catches up and leaves probation.
    restart(&mut cluster, leader).await;
    let now_leading = cluster.leader().await;
    assert_ne!(now_leading, damaged);
    cluster.agree(&commands(20)).await;
    let deadline = Instant::now() + WAIT;
    while cluster.nodes[&damaged].0.on_probation() {
        assert!(
            Instant::now() < deadline,
            "the damaged member never left probation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Now it counts again: with the third member stopped, the other two
    // (one of them the formerly damaged) still commit.
    let (node, _) = cluster.nodes.remove(&third).unwrap();
    node.shutdown().await;
    let now_leading = cluster.leader().await;
    cluster.propose_all(now_leading, 20, 25).await;
    cluster.agree(&commands(25)).await;
    cluster.stop().await;
}
