//! Issue 20 (CPU per message): a group writer gathering a batch from
//! committers who come back one by one is woken once, when as many as it
//! waits for are queued (or at its deadline), not once per arrival. Each
//! wake-up of a thread is a futex call by the sender and a context switch
//! of the writer; in fanin at 10-20 producers those were several per
//! batch.
//!
//! Counted, not timed: the writer thread's voluntary context switches
//! (`/proc/self/task/*/status`) per batch while eight committers, each
//! with one publish in flight, come back 150 µs apart after every 2 ms
//! fdatasync.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use berth_store::fault::FaultStorage;
use berth_store::QueueId;
use bytes::Bytes;
use common::{config, open, wait};

/// The voluntary context switches of this process's thread named `name`.
fn voluntary_switches(name: &str) -> u64 {
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task entry").path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).expect("task status");
        return status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches in status");
    }
    panic!("no thread named {name}");
}

#[test]
fn a_gathered_batch_wakes_the_writer_once_not_once_per_arrival() {
    const COMMITTERS: u64 = 8;
    const ROUNDS: usize = 40;
    let fs = FaultStorage::new(20);
    fs.set_sync_latency(Duration::from_millis(2));
    let mut cfg = config(1);
    cfg.commit_delay_us_max = 5_000;
    cfg.segment_prepare = false;
    let (store, _) = open(&fs, &cfg);
    let store = Arc::new(store);
    let publish = |store: &berth_store::Store, q: u64| {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(q)], Bytes::from_static(b"x"), Some(d))).unwrap();
    };
    // Let the smoothed fdatasync time settle at the injected 2 ms.
    for _ in 0..10 {
        publish(&store, 0);
    }
    let switches_before = voluntary_switches("berth-group-0");
    let stats_before = store.stats()[0].clone();
    let threads: Vec<_> = (0..COMMITTERS)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    std::thread::sleep(Duration::from_micros(150 * t));
                    publish(&store, t);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let switches = voluntary_switches("berth-group-0") - switches_before;
    let st = store.stats()[0].clone();
    let batches = st.batches - stats_before.batches;
    let waits = st.gather_waits - stats_before.gather_waits;
    assert!(
        waits * 2 > batches,
        "the committers were not gathered in most batches ({waits} waits, {batches} batches): {st:?}"
    );
    // Per batch: the wait for its first request, the gathering, the
    // fdatasync (a sleep here), and a little slack for anything else; one
    // wake-up per arrival would add up to seven.
    let per_batch = switches as f64 / batches as f64;
    eprintln!("writer: {switches} voluntary switches over {batches} batches ({waits} gathered): {per_batch:.2} per batch");
    assert!(
        per_batch <= 4.5,
        "the writer was woken {per_batch:.2} times per batch ({switches} over {batches} batches, {waits} gathered): once per arrival?"
    );
}
