//! Proposals share Raft entries; a wedged disk loses the leadership.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_cluster::{NodeId, ProposeError, SyncGate};

mod common;
use common::{Cluster, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_are_gathered_into_few_entries_in_one_order() {
    let cluster = Arc::new(Cluster::start("gather", &BTreeMap::new(), &BTreeMap::new()).await);
    let leader = cluster.leader().await;
    let before = cluster.nodes[&leader].0.last_log_index().unwrap_or(0);
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let cluster = cluster.clone();
        tasks.push(tokio::spawn(async move {
            cluster.nodes[&leader]
                .0
                .propose(format!("p{i}").into_bytes(), WAIT)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let entries = cluster.nodes[&leader].0.last_log_index().unwrap() - before;
    assert!(
        entries < 200,
        "400 concurrent proposals took {entries} Raft entries: they were not gathered"
    );
    // Every member applied the same 400 commands in the same order.
    let reference = cluster.nodes[&leader].1.applied.lock().clone();
    assert_eq!(reference.len(), 400);
    cluster.agree(&reference).await;
    eprintln!("400 proposals in {entries} entries");
    Arc::into_inner(cluster)
        .expect("tasks are done")
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_fdatasync_stalls_loses_the_leadership() {
    let gates: BTreeMap<NodeId, SyncGate> = (1..=3).map(|id| (id, SyncGate::default())).collect();
    let cluster = Cluster::start_tuned("stall", &gates, |c| c.sync_stall_ms_max = 500).await;
    let old = cluster.leader().await;
    cluster.propose_all(old, 0, 3).await;

    // Wedge the leader's disk with a write in flight.
    gates[&old].close();
    let node = &cluster.nodes[&old].0;
    let _ = node
        .propose(b"in flight".to_vec(), Duration::from_millis(300))
        .await;

    // The two others elect one of themselves while the old leader's disk
    // stays wedged.
    let started = Instant::now();
    let new = loop {
        let views: Vec<Option<NodeId>> = cluster
            .nodes
            .iter()
            .filter(|(id, _)| **id != old)
            .map(|(_, (n, _))| n.leader())
            .collect();
        if let [Some(a), Some(b)] = views[..] {
            if a == b && a != old {
                break a;
            }
        }
        assert!(
            started.elapsed() < WAIT,
            "the wedged leader {old} kept the leadership: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "leadership left the wedged disk after {:?}",
        started.elapsed()
    );
    assert!(
        cluster.nodes[&old].0.fenced(),
        "the wedged node is not fenced"
    );
    match cluster.nodes[&old]
        .0
        .propose(b"refused".to_vec(), WAIT)
        .await
    {
        Err(ProposeError::DiskStalled(_)) => {}
        other => panic!("a wedged node must refuse proposals, got {other:?}"),
    }
    cluster.nodes[&new]
        .0
        .propose(b"after".to_vec(), WAIT)
        .await
        .unwrap();

    // The disk answers again: the old leader follows and catches up.
    gates[&old].open();
    let reference = cluster.nodes[&new].1.applied.lock().clone();
    assert_eq!(
        reference.last().map(Vec::as_slice),
        Some(b"after".as_slice())
    );
    cluster.agree(&reference).await;
    let lifted = Instant::now();
    while cluster.nodes[&old].0.fenced() {
        assert!(
            lifted.elapsed() < WAIT,
            "the fence stayed after the disk answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}

/// Replies run by the counting `reply_batch` below, and the batches.
static REPLY_BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
std::thread_local! {
    static IN_REPLY_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn counting_reply_batch(_waiting: usize, replies: &mut dyn FnMut()) {
    REPLY_BATCHES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    IN_REPLY_BATCH.set(true);
    replies();
    IN_REPLY_BATCH.set(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replies_to_one_entry_run_in_one_reply_batch() {
    let cluster = Arc::new(
        Cluster::start_tuned("reply-batch", &BTreeMap::new(), |c| {
            c.reply_batch = counting_reply_batch;
        })
        .await,
    );
    let leader = cluster.leader().await;
    let before = REPLY_BATCHES.load(std::sync::atomic::Ordering::SeqCst);
    let mut answers = Vec::new();
    for i in 0..200u32 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            cluster.nodes[&leader]
                .0
                .submit(
                    format!("r{i}").into_bytes(),
                    Box::new(move |r| {
                        let _ = tx.send((r.is_ok(), IN_REPLY_BATCH.get()));
                    }),
                )
                .await;
        });
        answers.push(rx);
    }
    for a in answers {
        let (ok, in_batch) = tokio::time::timeout(WAIT, a).await.unwrap().unwrap();
        assert!(ok, "committed");
        assert!(in_batch, "every reply runs inside the node's reply batch");
    }
    let batches = REPLY_BATCHES.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(
        (1..200).contains(&batches),
        "200 concurrent proposals were replied to in {batches} batches"
    );
    Arc::into_inner(cluster)
        .expect("tasks are done")
        .stop()
        .await;
}
