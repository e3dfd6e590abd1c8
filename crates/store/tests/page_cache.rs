//! Sealed segments leave the page cache once cold
//! (`StoreConfig::segment_cache_bytes`): each group drops a sealed
//! segment once that many bytes of its journal were written after it and
//! no checkpoint still reads it, after its fdatasync, once; the newest
//! bytes stay; 0 turns it off.

mod common;

use std::path::PathBuf;

use berth_store::fault::{CacheDrop, FaultStorage};
use berth_store::{MsgId, QueueId, Store, StoreConfig};
use bytes::Bytes;
use common::{config, group_dir, open, wait};

const SEGMENT_BYTES: u64 = 64 * 1024;
const WINDOW_BYTES: u64 = 4 * SEGMENT_BYTES;

fn cfg() -> StoreConfig {
    let mut c = config(1);
    c.segment_size_bytes = SEGMENT_BYTES;
    c.segment_cache_bytes = WINDOW_BYTES;
    c.checkpoint_journal_bytes = SEGMENT_BYTES;
    // Every segment grows to its records: sizes are what was written.
    c.segment_prepare = false;
    c
}

/// `n` confirmed publishes of 1 KiB each.
fn publish(store: &Store, n: usize) {
    for _ in 0..n {
        let m = store.next_msg_id();
        let body = Bytes::from(vec![u8::try_from(m.0 % 251).unwrap(); 1024]);
        wait(|d| store.publish(m, &[QueueId(1)], body, Some(d))).unwrap();
    }
}

/// Waits until the writer took one more turn of its loop: whatever the
/// turn before dropped is dropped by then.
fn one_more_turn(store: &Store) {
    wait(|d| store.flush(d)).unwrap();
}

/// The group's segments, oldest first: path, bytes, and the bytes written
/// after it (in newer segments).
fn segments(fs: &FaultStorage) -> Vec<(PathBuf, u64, u64)> {
    let mut segs: Vec<(PathBuf, u64)> = fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .map(|n| {
            let p = group_dir(0).join(n);
            let len = fs.contents(&p).unwrap().len() as u64;
            (p, len)
        })
        .collect();
    segs.sort();
    let mut after = 0;
    let mut out: Vec<(PathBuf, u64, u64)> = segs
        .into_iter()
        .rev()
        .map(|(p, len)| {
            let row = (p, len, after);
            after += len;
            row
        })
        .collect();
    out.reverse();
    out
}

fn drops(fs: &FaultStorage, p: &std::path::Path) -> Vec<CacheDrop> {
    fs.cache_drops(p).unwrap()
}

#[test]
fn sealed_segments_past_the_window_are_dropped_once_after_their_sync_and_the_window_stays() {
    let fs = FaultStorage::new(1);
    let (store, _) = open(&fs, &cfg());
    // ~2 MiB: about 30 segments, checkpoints every segment meanwhile.
    publish(&store, 2000);
    store.checkpoint().unwrap();
    one_more_turn(&store);
    let segs = segments(&fs);
    assert!(segs.len() > 20, "{} segments", segs.len());
    let mut dropped = 0;
    for (path, len, after) in &segs {
        let got = drops(&fs, path);
        if *after >= WINDOW_BYTES {
            // Every segment wholly before the checkpoint's position and a
            // window behind the newest byte: dropped, whole, once, clean.
            assert_eq!(
                got,
                vec![CacheDrop {
                    offset: 0,
                    len: *len,
                    clean: true
                }],
                "{} ({len} bytes, {after} written after it)",
                path.display()
            );
            dropped += 1;
        } else {
            assert!(
                got.is_empty(),
                "{} is within the newest {WINDOW_BYTES} bytes ({after} written after it) \
                 but was dropped: {got:?}",
                path.display()
            );
        }
    }
    assert!(dropped >= segs.len() - 5, "{dropped} of {}", segs.len());
    assert_eq!(store.stats()[0].segments_uncached, dropped as u64);
    // Reads of a dropped segment return what was written.
    drop(store);
    let (store, rec) = open(&fs, &cfg());
    let ids: Vec<MsgId> = rec.queues[&QueueId(1)].iter().map(|m| m.msg).collect();
    assert_eq!(ids.len(), 2000);
    let body = store.read(QueueId(1), ids[0]).unwrap();
    assert_eq!(body.len(), 1024);
    // Segments on disk at open are left alone; new ones are dropped again.
    let before: usize = segs.iter().map(|(p, ..)| drops(&fs, p).len()).sum();
    publish(&store, 10);
    store.checkpoint().unwrap();
    one_more_turn(&store);
    let after_reopen: usize = segs.iter().map(|(p, ..)| drops(&fs, p).len()).sum();
    assert_eq!(
        before, after_reopen,
        "a segment from before the open was advised again"
    );
}

#[test]
fn a_segment_the_next_checkpoint_reads_stays_in_the_cache() {
    let fs = FaultStorage::new(2);
    let mut c = cfg();
    // No checkpoint but the ones asked for: the first one's position
    // stays where it was, and everything after it is journal the next
    // checkpoint reads.
    c.checkpoint_journal_bytes = 1 << 40;
    c.checkpoint_interval_ms = 3_600_000;
    let (store, _) = open(&fs, &c);
    publish(&store, 100);
    store.checkpoint().unwrap();
    publish(&store, 1500);
    one_more_turn(&store);
    let segs = segments(&fs);
    let early: Vec<_> = segs
        .iter()
        .filter(|(p, ..)| !drops(&fs, p).is_empty())
        .map(|(p, ..)| p.clone())
        .collect();
    // Only segments wholly before the checkpoint's position (the first
    // one or two) may go; the rest is the next checkpoint's to read.
    assert!(
        early.len() <= 2,
        "dropped before a checkpoint passed them: {early:?}"
    );
    store.checkpoint().unwrap();
    one_more_turn(&store);
    let far: Vec<_> = segments(&fs)
        .into_iter()
        .filter(|(_, _, after)| *after >= WINDOW_BYTES)
        .collect();
    assert!(far.len() > 10, "{} segments", far.len());
    for (p, ..) in &far {
        assert_eq!(
            drops(&fs, p).len(),
            1,
            "{} not dropped after the checkpoint",
            p.display()
        );
    }
}

#[test]
fn a_window_of_zero_leaves_the_page_cache_alone() {
    let fs = FaultStorage::new(3);
    let mut c = cfg();
    c.segment_cache_bytes = 0;
    let (store, _) = open(&fs, &c);
    publish(&store, 1000);
    store.checkpoint().unwrap();
    one_more_turn(&store);
    let segs = segments(&fs);
    assert!(segs.len() > 10);
    for (p, ..) in &segs {
        assert!(drops(&fs, p).is_empty(), "{} dropped", p.display());
    }
    assert_eq!(store.stats()[0].segments_uncached, 0);
}
