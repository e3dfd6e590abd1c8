//! A disk that fills up before the disk alarm trips (another process wrote
//! to it): the batch that met ENOSPC fails, nothing of it stays on disk,
//! and the group takes writes again by itself once space returns — while a
//! failed fdatasync still poisons the group until the store is reopened.

mod common;

use std::time::{Duration, Instant};

use berth_store::fault::FaultStorage;
use berth_store::{MsgId, QueueId, Store, StoreError};
use bytes::Bytes;
use common::{config, group_dir, open, seed, wait};

const Q: QueueId = QueueId(1);

fn publish(store: &Store, payload: &[u8]) -> (MsgId, Result<(), StoreError>) {
    let m = store.next_msg_id();
    let r = wait(|d| store.publish(m, &[Q], Bytes::copy_from_slice(payload), Some(d)));
    (m, r)
}

fn segments(fs: &FaultStorage) -> Vec<String> {
    fs.names(&group_dir(0))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect()
}

/// Publishes until one is confirmed, for at most 10 s; the ids of the
/// refused ones go to `failed`.
fn publish_until_confirmed(store: &Store, payload: &[u8], failed: &mut Vec<MsgId>) -> MsgId {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (m, r) = publish(store, payload);
        match r {
            Ok(()) => return m,
            Err(e) => {
                failed.push(m);
                assert!(
                    Instant::now() < deadline,
                    "the group never took writes again after space returned; last error: {e}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The scenario of both tests below: `before` confirmed publishes, a disk
/// filled to `slack_bytes` above what the store holds, refused publishes,
/// space back, more publishes; then a power loss (torn writes on) and a
/// restart must find every confirmed message exactly once and none of the
/// refused ones.
fn fill_then_free(before: usize, payload_bytes: usize, slack_bytes: u64) -> (FaultStorage, usize) {
    let fs = FaultStorage::new(seed(1615));
    fs.set_tear_on_crash(true);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    // A prepared next segment holds its space already, and a roll into it
    // cannot meet a full disk: these tests are about segments that grow
    // (what a writer falls back to when preparing failed).
    cfg.segment_prepare = false;
    let (store, _) = open(&fs, &cfg);
    let payload = vec![0xa5u8; payload_bytes];
    let mut confirmed = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..before {
        let (m, r) = publish(&store, &payload);
        r.expect("disk not full yet");
        confirmed.push(m);
    }
    let segments_before = segments(&fs);

    // Another process fills the disk: less room than one record is left.
    fs.set_capacity_bytes(Some(fs.used_bytes() + slack_bytes));
    for _ in 0..3 {
        let (m, r) = publish(&store, &payload);
        let e = r.expect_err("no room for the record: the publish must fail");
        assert!(
            !matches!(e, StoreError::Poisoned { .. }),
            "a full disk must not poison the group: {e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("no space") && text.contains("free space"),
            "the error must say the disk is full and what to do: {text}"
        );
        failed.push(m);
    }
    assert!(
        !store.stats()[0].poisoned,
        "a full disk is not a poisoned group"
    );
    assert_eq!(
        segments(&fs),
        segments_before,
        "a segment started by the failed batch must be taken back"
    );

    // The other process's file is deleted.
    fs.set_capacity_bytes(None);
    confirmed.push(publish_until_confirmed(&store, &payload, &mut failed));
    for _ in 0..5 {
        let (m, r) = publish(&store, &payload);
        r.expect("space is back");
        confirmed.push(m);
    }
    for m in &confirmed {
        assert_eq!(store.read(Q, *m).unwrap(), Bytes::from(payload.clone()));
    }

    // Power loss, restart.
    fs.crash();
    drop(store);
    fs.power_on();
    let (store, rec) = open(&fs, &cfg);
    let got: Vec<MsgId> = rec.queues[&Q].iter().map(|r| r.msg).collect();
    assert_eq!(
        got, confirmed,
        "after the restart: every confirmed message exactly once, none of the refused {failed:?}"
    );
    for m in &got {
        assert_eq!(store.read(Q, *m).unwrap(), Bytes::from(payload.clone()));
    }
    drop(store);
    (fs, failed.len())
}

#[test]
fn full_disk_fails_the_batch_and_the_group_writes_again_once_space_returns() {
    // A torn record in the active segment (100 bytes of a 1 KB one fit).
    fill_then_free(2, 1000, 100);
}

#[test]
fn full_disk_at_a_segment_roll_takes_the_new_segment_back() {
    // Three 1200-byte records fill a 4096-byte segment: the fourth starts
    // a new one, whose header and part of the record fit in 40 bytes.
    fill_then_free(3, 1200, 40);
}

#[test]
fn full_disk_with_not_even_the_segment_file_writable_recovers() {
    // Nothing fits at all: the write fails before a single byte lands.
    fill_then_free(2, 1000, 0);
}

/// The fsyncgate lesson: after a failed fdatasync the page cache's state
/// is unknown, so retrying the sync and trusting it would be a lie. A
/// failed sync keeps the group poisoned — past every no-space retry —
/// until the store is reopened and recovery reads what is really there.
#[test]
fn failed_fsync_still_poisons_until_reopen_even_after_retries() {
    let fs = FaultStorage::new(seed(1616));
    let cfg = config(1);
    let (store, _) = open(&fs, &cfg);
    let (ok, r) = publish(&store, b"ok");
    r.unwrap();
    fs.fail_syncs_after(Some(0));
    let (_, r) = publish(&store, b"lost");
    let e = r.unwrap_err();
    assert!(matches!(e, StoreError::Poisoned { .. }), "{e}");
    fs.fail_syncs_after(None);
    std::thread::sleep(Duration::from_millis(
        3 * berth_store::limits::NO_SPACE_RETRY_MS,
    ));
    let (_, r) = publish(&store, b"later");
    let e = r.unwrap_err();
    assert!(matches!(e, StoreError::Poisoned { .. }), "{e}");
    assert!(store.stats()[0].poisoned);
    assert!(
        store.close().is_err(),
        "close must report the poisoned group"
    );
    fs.crash();
    fs.power_on();
    let (store, rec) = open(&fs, &cfg);
    assert_eq!(
        rec.queues[&Q].iter().map(|r| r.msg).collect::<Vec<_>>(),
        vec![ok]
    );
    let (_, r) = publish(&store, b"after reopen");
    r.expect("a reopened group takes writes");
}
