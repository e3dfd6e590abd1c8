//! A process kill followed by a power loss (issue 16, item 1): after
//! `kill -9` the journal's tail may be in the page cache only; recovery
//! reads it from there, and what the reopened store confirms later follows
//! it in sequence. Recovery must make that tail durable before the store
//! accepts a write or writes a checkpoint, or a power loss in the writeback
//! window leaves a journal with records missing (recovery refuses to start)
//! or a checkpoint pointing past the durable end.

mod common;

use berth_store::fault::FaultStorage;
use berth_store::{MsgId, QueueId, SyncMode};
use bytes::Bytes;
use common::{config, open, wait};

fn payload(m: MsgId) -> Bytes {
    Bytes::from(format!("message {}", m.0).repeat(20))
}

/// Publishes `n` messages to queue 1 with `SyncMode::Never` (completed
/// after `write(2)`, never synced), then kills the process.
fn publish_unsynced_then_kill(fs: &FaultStorage, n: usize) {
    let mut cfg = config(1);
    cfg.sync = SyncMode::Never;
    let (store, _) = open(fs, &cfg);
    for _ in 0..n {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
    }
    fs.kill_process();
    drop(store); // its shutdown fails: the process is gone
    fs.power_on();
}

/// Reopens, publishes and confirms `n` messages (synced); returns them.
fn reopen_and_confirm(fs: &FaultStorage, n: usize) -> (berth_store::Store, Vec<MsgId>) {
    let (store, _) = open(fs, &config(1));
    let mut confirmed = Vec::new();
    for _ in 0..n {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
        confirmed.push(m);
    }
    (store, confirmed)
}

/// Reopens after the power loss and checks every confirmed message is
/// there and reads back whole.
fn assert_confirmed_survive(fs: &FaultStorage, confirmed: &[MsgId]) {
    let (store, rec) = berth_store::Store::open_with(config(1), std::sync::Arc::new(fs.clone()))
        .expect("the store starts after a kill, a confirm and a power loss");
    let live: Vec<MsgId> = rec.queues[&QueueId(1)].iter().map(|m| m.msg).collect();
    for m in confirmed {
        assert!(live.contains(m), "confirmed {m} lost; recovered {live:?}");
    }
    for &m in &live {
        assert_eq!(store.read(QueueId(1), m).unwrap(), payload(m), "{m}");
    }
}

#[test]
fn replayed_tail_is_synced_before_later_confirms() {
    let fs = FaultStorage::new(1);
    publish_unsynced_then_kill(&fs, 10);
    let (store, confirmed) = reopen_and_confirm(&fs, 5);
    fs.crash();
    drop(store);
    fs.power_on();
    assert_confirmed_survive(&fs, &confirmed);
}

#[test]
fn replayed_tail_is_synced_before_the_closing_checkpoint() {
    // The checkpoint at clean close covers the replayed tail: it must not
    // point past what a power loss leaves.
    let fs = FaultStorage::new(2);
    publish_unsynced_then_kill(&fs, 10);
    let (store, confirmed) = reopen_and_confirm(&fs, 5);
    store.close().unwrap();
    fs.crash();
    fs.power_on();
    assert_confirmed_survive(&fs, &confirmed);
}
