//! Three members on loopback in one process: what Raft promises berth.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_cluster::{NodeId, ProposeError, SyncGate};

mod common;
use common::{big_commands, commands, Cluster, SECRET, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_apply_one_order_and_survive_the_leader_stopping() {
    let mut cluster = Cluster::start("failover", &BTreeMap::new(), &BTreeMap::new()).await;
    let first = cluster.leader().await;
    cluster.propose_all(first, 0, 30).await;
    cluster.agree(&commands(30)).await;

    // Each member keeps only the newest bytes of its log in memory (the
    // harness keeps none once durable); older entries were read back from
    // the segments to be applied and sent, and were the same.
    for (id, (n, _)) in &cluster.nodes {
        let st = n.status();
        assert!(
            st.log_resident_bytes <= 1024,
            "n{id} holds {} bytes of log in memory",
            st.log_resident_bytes
        );
    }
    assert!(
        cluster
            .nodes
            .values()
            .any(|(n, _)| n.status().log_entries_read_from_disk > 0),
        "no member read an entry back from its segments"
    );

    // One cluster id, made at formation and learned by every member.
    let deadline = Instant::now() + WAIT;
    loop {
        let ids: Vec<_> = cluster
            .nodes
            .values()
            .map(|(n, _)| n.status().cluster_id)
            .collect();
        if ids[0].is_some() && ids.iter().all(|i| *i == ids[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "no common cluster id: {ids:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A follower refuses to propose and names the leader.
    let follower = *cluster.nodes.keys().find(|id| **id != first).unwrap();
    match cluster.nodes[&follower]
        .0
        .propose(b"x".to_vec(), WAIT)
        .await
    {
        Err(ProposeError::NotLeader { leader, addr }) => {
            assert_eq!(leader, Some(first));
            assert_eq!(addr.as_deref(), Some(cluster.members[&first].as_str()));
        }
        other => panic!("a follower must refuse with NotLeader, got {other:?}"),
    }

    // Stop the leader: its port closes, the others elect a new one.
    let stopped_at = Instant::now();
    let (old, _) = cluster.nodes.remove(&first).unwrap();
    old.shutdown().await;
    let second = cluster.leader().await;
    let failover = stopped_at.elapsed();
    assert_ne!(second, first);
    cluster.propose_all(second, 30, 60).await;
    eprintln!("failover: new leader {second} after {failover:?}");

    // The old leader comes back on its address and catches up.
    let listener = common::rebind(&cluster.members[&first]).await;
    cluster
        .start_node(first, listener, SyncGate::default(), SECRET)
        .await;
    cluster.agree(&commands(60)).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_commits_until_a_majority_has_fdatasynced() {
    let gates: BTreeMap<NodeId, SyncGate> = (1..=3).map(|id| (id, SyncGate::default())).collect();
    let cluster = Cluster::start("gate", &gates, &BTreeMap::new()).await;
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 0, 3).await;
    cluster.agree(&commands(3)).await;

    // Both followers' disks hold every fdatasync: the leader alone is no
    // majority, so nothing may commit or apply anywhere.
    let followers: Vec<NodeId> = gates.keys().copied().filter(|id| *id != leader).collect();
    for f in &followers {
        gates[f].close();
    }
    let node = &cluster.nodes[&leader].0;
    let before: Vec<_> = cluster
        .nodes
        .values()
        .map(|(n, _)| n.applied_index())
        .collect();
    match node
        .propose(b"c3".to_vec(), Duration::from_millis(2_000))
        .await
    {
        Err(ProposeError::Timeout(_)) => {}
        other => panic!("committed without a majority of fdatasyncs: {other:?}"),
    }
    for (id, (_, r)) in &cluster.nodes {
        assert_eq!(
            r.applied.lock().len(),
            3,
            "node {id} applied an entry no majority has synced"
        );
    }
    let after: Vec<_> = cluster
        .nodes
        .values()
        .map(|(n, _)| n.applied_index())
        .collect();
    assert_eq!(
        before, after,
        "an applied index moved while no majority had synced"
    );

    // One follower's disk catches up: leader + it are a majority.
    gates[&followers[0]].open();
    cluster.propose_all(leader, 4, 5).await;
    gates[&followers[1]].open();
    let mut expected = commands(3);
    expected.push(b"c3".to_vec());
    expected.push(b"c4".to_vec());
    cluster.agree(&expected).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_the_secret_gets_nothing() {
    let mut secrets: BTreeMap<NodeId, &[u8]> = BTreeMap::new();
    secrets.insert(3, b"not the secret the others share".as_slice());
    let mut cluster = Cluster::start("secret", &BTreeMap::new(), &secrets).await;
    let (stranger, stranger_log) = cluster.nodes.remove(&3).unwrap();
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 0, 5).await;
    cluster.agree(&commands(5)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        stranger_log.applied.lock().is_empty(),
        "a node with the wrong secret received entries"
    );
    assert_eq!(
        stranger.last_log_index(),
        None,
        "a node with the wrong secret has log entries"
    );
    assert_ne!(stranger.leader(), Some(leader));
    stranger.shutdown().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restart_keeps_every_committed_command() {
    let mut cluster = Cluster::start("restart", &BTreeMap::new(), &BTreeMap::new()).await;
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 0, 20).await;
    cluster.agree(&commands(20)).await;
    let ids: Vec<NodeId> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        let (node, _) = cluster.nodes.remove(id).unwrap();
        node.shutdown().await;
    }
    for id in &ids {
        let listener = common::rebind(&cluster.members[id]).await;
        cluster
            .start_node(*id, listener, SyncGate::default(), SECRET)
            .await;
    }
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 20, 25).await;
    cluster.agree(&commands(25)).await;
    cluster.stop().await;
}

/// A member that was away while snapshots replaced the log catches up from
/// a snapshot; the purged entries leave the disk (their segments are
/// deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_the_purged_log_catches_up_by_snapshot() {
    let mut cluster = Cluster::start_tuned("snap", &BTreeMap::new(), |c| {
        c.snapshot_after_entries = 20;
        c.log_segment_bytes = 64 * 1024;
    })
    .await;
    let leader = cluster.leader().await;
    let away = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let (node, _) = cluster.nodes.remove(&away).unwrap();
    node.shutdown().await;

    // 16 KiB commands: 200 of them fill ~50 segments of 64 KiB.
    let expected = big_commands(200, 16 * 1024);
    cluster.propose_each(leader, &expected).await;
    cluster.agree(&expected).await;
    // Snapshot, purge and rewrite follow the apply asynchronously.
    let dir = cluster.root.join(format!("n{leader}"));
    let deadline = Instant::now() + WAIT;
    loop {
        let log_bytes = log_bytes(&dir);
        if log_bytes < 100 * 16 * 1024 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Raft log still holds purged entries: {log_bytes} bytes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let listener = common::rebind(&cluster.members[&away]).await;
    cluster
        .start_node(away, listener, SyncGate::default(), SECRET)
        .await;
    cluster.agree(&expected).await;
    assert!(
        cluster.root.join(format!("n{away}/raft.snapshot")).exists(),
        "the member caught up without a snapshot"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_each_members_lag_and_a_lone_leader_loses_its_lease() {
    use berth_cluster::Role;
    let mut cluster = Cluster::start("status", &BTreeMap::new(), &BTreeMap::new()).await;
    let leader = cluster.leader().await;
    cluster.propose_all(leader, 0, 10).await;
    cluster.agree(&commands(10)).await;
    assert!(
        cluster.nodes[&leader].0.may_serve(),
        "a leader with a quorum may serve"
    );
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    assert!(
        !cluster.nodes[&follower].0.may_serve(),
        "a follower may not serve"
    );
    let s = cluster.nodes[&follower].0.status();
    assert_eq!((s.role, s.leader), (Role::Follower, Some(leader)));
    assert!(
        s.members.iter().all(|m| m.lag.is_none()),
        "only a leader knows lags"
    );

    // One follower stops; 5 more commands: the leader sees it behind.
    let (node, _) = cluster.nodes.remove(&follower).unwrap();
    node.shutdown().await;
    cluster.propose_all(leader, 10, 15).await;
    let s = cluster.nodes[&leader].0.status();
    assert_eq!(s.role, Role::Leader);
    assert_eq!(s.members.len(), 3);
    let away = s.members.iter().find(|m| m.id == follower).unwrap();
    assert!(away.lag.unwrap() >= 5, "the stopped member's lag: {away:?}");
    let me = s.members.iter().find(|m| m.id == leader).unwrap();
    assert_eq!(me.lag, Some(0));

    // The last follower stops too: the leader's lease runs out, it may no
    // longer confirm or deliver.
    let other = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let (node, _) = cluster.nodes.remove(&other).unwrap();
    node.shutdown().await;
    let deadline = Instant::now() + WAIT;
    while cluster.nodes[&leader].0.may_serve() {
        assert!(
            Instant::now() < deadline,
            "a leader without a quorum kept serving"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}

/// Bytes of a member's Raft log segments on disk. Callers poll it while
/// the member purges its log, so a segment listed can be gone when it is
/// looked at: it holds nothing then.
fn log_bytes(dir: &std::path::Path) -> u64 {
    berth_cluster::log_segments::segment_paths(dir)
        .unwrap()
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => panic!("{}: {e}", p.display()),
        })
        .sum()
}

/// Entries are whole batches, so a count of entries says nothing of their
/// size: a few hundred large ones must bring a snapshot (and the purge of
/// what it covers) as surely as many small ones, or a member holds
/// gigabytes of log in memory (seen: 10,000 entries of ~600 KB each
/// under the cluster benchmark, ~6 GB over three members).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_few_large_entries_is_snapshotted_by_its_bytes() {
    const SEGMENT_BYTES: u64 = 64 * 1024;
    let cluster = Cluster::start_tuned("snapbytes", &BTreeMap::new(), |c| {
        c.snapshot_after_entries = 10_000;
        c.snapshot_after_bytes = 512 * 1024;
        c.log_segment_bytes = SEGMENT_BYTES;
    })
    .await;
    let leader = cluster.leader().await;
    let expected = big_commands(200, 16 * 1024);
    cluster.propose_each(leader, &expected).await;
    cluster.agree(&expected).await;
    // 200 entries of 16 KiB: 3.2 MB of log, far fewer than 10,000
    // entries. (The test's state machine keeps every command, so its
    // snapshots grow and the threshold with them: twice the last
    // snapshot. Not all of the log goes, but a purge must have happened.)
    // How much goes depends on where the size check (a tick) first finds
    // the threshold passed: a first snapshot taken late raises the next
    // threshold past the 200 entries, and then only what lies before it,
    // less the entries kept behind it and the segment holding the cut, is
    // purged (seen: 520,350 bytes on a slow machine, against a margin of
    // 512 KiB this test once asked for). Without a snapshot by bytes
    // nothing is purged and the log holds more than was written, so one
    // whole segment gone is the proof.
    let dir = cluster.root.join(format!("n{leader}"));
    let written = 200 * 16 * 1024;
    let deadline = Instant::now() + WAIT;
    loop {
        let held = log_bytes(&dir);
        if dir.join("raft.snapshot").exists() && held + SEGMENT_BYTES < written {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "200 entries of 16 KiB and still {held} bytes of log on disk (snapshot taken: {})",
            dir.join("raft.snapshot").exists()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}
