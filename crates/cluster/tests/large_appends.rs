//! A follower far behind catches up even when what it lacks is larger
//! than one frame between members: appends are split (openraft's
//! `PayloadTooLarge` hint) instead of being refused by the receiver over
//! and over while the follower, hearing nothing, deposes the leader.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::{Cluster, SECRET, WAIT};

/// The frame limit of this test: three entries of a little over 1 MiB do
/// not fit in one frame.
const FRAME_MAX: usize = 3 * 1024 * 1024;
const ENTRIES: usize = 12;

fn command(i: usize) -> Vec<u8> {
    let mut c = vec![u8::try_from(i).unwrap(); 1024 * 1024 + 100];
    c[..8].copy_from_slice(&(i as u64).to_le_bytes());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_by_more_than_one_frame_catches_up() {
    let mut cluster = Cluster::start_tuned("large-appends", &BTreeMap::new(), |c| {
        c.peer_frame_bytes_max = FRAME_MAX;
    })
    .await;
    let leader = cluster.leader().await;
    let behind = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let (node, _) = cluster.nodes.remove(&behind).unwrap();
    node.shutdown().await;

    // While it is away, the others commit twelve entries of ~1 MiB each.
    for i in 0..ENTRIES {
        cluster.nodes[&leader]
            .0
            .propose(command(i), WAIT)
            .await
            .unwrap_or_else(|e| panic!("entry {i}: {e}"));
    }

    let listener = common::rebind(&cluster.members[&behind]).await;
    cluster
        .start_node(behind, listener, berth_cluster::SyncGate::default(), SECRET)
        .await;
    let deadline = Instant::now() + WAIT;
    loop {
        let applied = cluster.nodes[&behind].1.applied.lock().len();
        if applied == ENTRIES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower applied {applied} of {ENTRIES} entries within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let applied = cluster.nodes[&behind].1.applied.lock().clone();
    assert!(
        applied.iter().enumerate().all(|(i, c)| *c == command(i)),
        "the follower applied other commands than the leader"
    );
    assert_eq!(
        cluster.leader().await,
        leader,
        "the leader kept its leadership while the follower caught up"
    );
    cluster.stop().await;
}
