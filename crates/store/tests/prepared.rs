//! Segments prepared off the write path (zeros to the segment size,
//! fdatasynced, renamed in at the roll): a confirmed write into one changes
//! no file size, and every state a crash can leave — a prepared file never
//! used, one half written, one renamed in before its header, a newest
//! segment ending in zeros — recovers without loss and without a report,
//! while zeros at the end of a sealed segment stay damage.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_store::fault::FaultStorage;
use berth_store::inspect::{inspect_group, GroupReport, Layout};
use berth_store::segment::PREPARED_SEGMENT_NAME;
use berth_store::storage::{OsStorage, Storage};
use berth_store::{MsgId, QueueId, Store, StoreConfig};
use bytes::Bytes;
use common::{config, group_dir, open, wait};

const SEGMENT_BYTES: u64 = 64 * 1024;

fn payload(m: MsgId) -> Bytes {
    Bytes::from(vec![u8::try_from(m.0 % 251).unwrap(); 100])
}

fn seg(n: u32) -> PathBuf {
    group_dir(0).join(format!("{n:010}.seg"))
}

fn prepared_path() -> PathBuf {
    group_dir(0).join(PREPARED_SEGMENT_NAME)
}

fn publish(store: &Store, n: usize) -> Vec<MsgId> {
    (0..n)
        .map(|_| {
            let m = store.next_msg_id();
            wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
            m
        })
        .collect()
}

fn msgs(rec: &berth_store::Recovered) -> Vec<MsgId> {
    rec.queues
        .get(&QueueId(1))
        .map(|v| v.iter().map(|m| m.msg).collect())
        .unwrap_or_default()
}

/// Waits until `len_of` says the prepared file is whole, then a little
/// longer for its fdatasync: the next roll takes it.
fn wait_prepared(len_of: impl Fn() -> Option<u64>, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while len_of() != Some(bytes) {
        assert!(
            Instant::now() < deadline,
            "the next segment was never prepared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
}

/// [`wait_prepared`] for a group directory on the real file system.
fn wait_prepared_on_disk(gdir: &Path, bytes: u64) {
    wait_prepared(
        || {
            std::fs::metadata(gdir.join(PREPARED_SEGMENT_NAME))
                .ok()
                .map(|m| m.len())
        },
        bytes,
    );
}

/// Creates `path` holding `bytes`, file and entry durable: what a crash
/// left there.
fn put_new(fs: &FaultStorage, path: &Path, bytes: &[u8]) {
    let f = fs.create(path).unwrap();
    f.write_all_at(bytes, 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(&group_dir(0)).unwrap();
}

fn inspect(fs: &FaultStorage) -> GroupReport {
    let layout = Layout::open(fs, &[PathBuf::from("/data")]).unwrap();
    inspect_group(fs, &layout, 0, &|_| {}).unwrap()
}

/// A store whose first segment is a prepared one, `n` confirmed
/// publishes in it, then a power loss.
fn publish_into_prepared_then_crash(fs: &FaultStorage, n: usize) -> Vec<MsgId> {
    let (store, _) = open(fs, &config(1));
    wait_prepared(
        || fs.contents(&prepared_path()).ok().map(|b| b.len() as u64),
        SEGMENT_BYTES,
    );
    let ids = publish(&store, n);
    fs.crash();
    drop(store);
    fs.power_on();
    ids
}

#[test]
fn a_confirmed_write_into_a_prepared_segment_leaves_its_size_alone() {
    let dir = std::env::temp_dir().join(format!("berth-prepared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = StoreConfig::new(&dir);
    cfg.log_groups = 1;
    cfg.segment_size_bytes = 1 << 20;
    let (store, _) = Store::open_with(cfg.clone(), Arc::new(OsStorage)).unwrap();
    let gdir = dir.join("group-0000");
    wait_prepared_on_disk(&gdir, cfg.segment_size_bytes);
    let first = publish(&store, 1);
    let seg1 = gdir.join("0000000001.seg");
    let size = || std::fs::metadata(&seg1).unwrap().len();
    let before = size();
    assert_eq!(
        before, cfg.segment_size_bytes,
        "the first segment is the prepared one"
    );
    // No size change, so fdatasync has no inode to write.
    let more = publish(&store, 50);
    assert_eq!(
        size(),
        before,
        "a confirmed write changed the segment's size"
    );
    drop(store);
    // A clean close leaves the segment as a grown one ends, and no
    // prepared file behind.
    assert!(size() < before, "closed segment still holds its zeros");
    assert!(!gdir.join(PREPARED_SEGMENT_NAME).exists());
    let (_s, rec) = Store::open_with(cfg, Arc::new(OsStorage)).unwrap();
    assert_eq!(msgs(&rec), [first, more].concat());
    drop(_s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zeros_ending_the_newest_segment_are_cut_off_without_a_report() {
    let fs = FaultStorage::new(11);
    let ids = publish_into_prepared_then_crash(&fs, 10);
    assert_eq!(
        fs.contents(&seg(1)).unwrap().len() as u64,
        SEGMENT_BYTES,
        "the crash left the prepared segment whole, zeros after its records"
    );
    let rep = inspect(&fs);
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert!(
        rep.notes.is_empty(),
        "a prepared segment's rest is no torn tail: {:?}",
        rep.notes
    );
    let (store, rec) = Store::open_with(config(1), Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
    assert_eq!(rec.stats.truncated_bytes, 0, "nothing was torn");
    assert!((fs.contents(&seg(1)).unwrap().len() as u64) < SEGMENT_BYTES);
    let later = publish(&store, 3);
    drop(store);
    let (_s, rec) = Store::open_with(config(1), Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), [ids, later].concat());
}

#[test]
fn a_prepared_file_left_by_a_crash_is_removed_and_never_read() {
    for (what, bytes) in [
        ("prepared, never used", vec![0u8; SEGMENT_BYTES as usize]),
        ("crash in the middle of preparing", vec![0u8; 5000]),
        (
            "torn while preparing",
            [vec![0u8; 4096], vec![0xa5; 300]].concat(),
        ),
    ] {
        let fs = FaultStorage::new(12);
        let mut cfg = config(1);
        cfg.segment_prepare = false;
        let (store, _) = open(&fs, &cfg);
        let ids = publish(&store, 5);
        fs.crash();
        drop(store);
        fs.power_on();
        put_new(&fs, &prepared_path(), &bytes);
        let rep = inspect(&fs);
        assert!(rep.problems.is_empty(), "{what}: {:?}", rep.problems);
        let (store, rec) = Store::open_with(cfg.clone(), Arc::new(fs.clone())).unwrap();
        assert_eq!(msgs(&rec), ids, "{what}");
        assert!(rec.damage.is_empty(), "{what}: {:?}", rec.damage);
        assert!(
            !fs.names(&group_dir(0))
                .iter()
                .any(|n| n == PREPARED_SEGMENT_NAME),
            "{what}: recovery left the prepared file"
        );
        drop(store);
    }
}

#[test]
fn a_crash_after_the_rename_before_the_header_loses_nothing() {
    // The roll renamed the prepared file in as segment 2 and synced the
    // directory; its header (written with its first records) never was.
    let fs = FaultStorage::new(13);
    let ids = publish_into_prepared_then_crash(&fs, 10);
    // Sealing cut segment 1 at its records (their payloads end non-zero)
    // and fdatasynced it before the rename.
    let mut one = fs.contents(&seg(1)).unwrap();
    one.truncate(one.iter().rposition(|&b| b != 0).unwrap() + 1);
    fs.put_durable(&seg(1), &one).unwrap();
    put_new(&fs, &seg(2), &vec![0u8; SEGMENT_BYTES as usize]);
    let rep = inspect(&fs);
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let (store, rec) = Store::open_with(config(1), Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
    let later = publish(&store, 3);
    drop(store);
    let (_s, rec) = Store::open_with(config(1), Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), [ids, later].concat());
}

#[test]
fn rolls_through_prepared_segments_seal_them_at_their_records() {
    // Many rolls with preparation racing the writer (some segments
    // prepared, some grown), a crash, and every sealed segment ends at
    // its last record.
    let fs = FaultStorage::new(14);
    fs.set_tear_on_crash(true);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    let (store, _) = open(&fs, &cfg);
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.extend(publish(&store, 5));
        std::thread::sleep(Duration::from_millis(5));
    }
    fs.crash();
    drop(store);
    fs.power_on();
    let segs: Vec<String> = fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect();
    assert!(segs.len() > 3, "{segs:?}");
    for n in &segs[..segs.len() - 1] {
        let bytes = fs.contents(&group_dir(0).join(n)).unwrap();
        assert!(
            !bytes.ends_with(&[0u8; 64]),
            "sealed segment {n} ends in zeros ({} bytes)",
            bytes.len()
        );
    }
    let rep = inspect(&fs);
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let (_s, rec) = Store::open_with(cfg, Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
}

#[test]
fn zeros_at_the_end_of_a_sealed_segment_stay_damage() {
    let fs = FaultStorage::new(15);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    cfg.segment_prepare = false;
    let (store, _) = open(&fs, &cfg);
    publish(&store, 60);
    fs.crash();
    drop(store);
    fs.power_on();
    let mut bytes = fs.contents(&seg(1)).unwrap();
    bytes.resize(4096 + 512, 0);
    fs.put_durable(&seg(1), &bytes).unwrap();
    let rep = inspect(&fs);
    assert!(
        !rep.problems.is_empty(),
        "zeros in a sealed segment reported as nothing"
    );
    let (_s, rec) = Store::open_with(cfg, Arc::new(fs.clone())).unwrap();
    assert_eq!(rec.damage.len(), 1, "{:?}", rec.damage);
}

#[test]
fn a_newest_segment_ending_in_zeros_is_no_torn_tail() {
    // The image alone (records, then zeros to the segment size), whoever
    // wrote it: the zeros end the segment, they are not damage.
    let fs = FaultStorage::new(16);
    let mut cfg = config(1);
    cfg.segment_prepare = false;
    let (store, _) = open(&fs, &cfg);
    let ids = publish(&store, 10);
    fs.crash();
    drop(store);
    fs.power_on();
    let mut bytes = fs.contents(&seg(1)).unwrap();
    let written = bytes.len();
    bytes.resize(SEGMENT_BYTES as usize, 0);
    fs.put_durable(&seg(1), &bytes).unwrap();
    let rep = inspect(&fs);
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert!(rep.notes.is_empty(), "{:?}", rep.notes);
    let (_s, rec) = Store::open_with(cfg, Arc::new(fs.clone())).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert_eq!(rec.stats.truncated_bytes, 0);
    assert_eq!(
        fs.contents(&seg(1)).unwrap().len(),
        written,
        "zeros cut off"
    );
}

#[test]
fn a_torn_write_inside_the_zeros_is_a_torn_tail() {
    // Records written into a prepared segment and never synced (completed
    // after write(2) under a long sync interval), then a power loss that
    // keeps a random prefix of them with garbage after it, before the
    // zeros: recovery keeps a prefix of the messages and reports no damage.
    for seed in 0..16 {
        let fs = FaultStorage::new(seed);
        fs.set_tear_on_crash(true);
        let mut cfg = config(1);
        cfg.sync = berth_store::SyncMode::Interval;
        cfg.sync_interval_ms = 600_000;
        let (store, _) = open(&fs, &cfg);
        wait_prepared(
            || fs.contents(&prepared_path()).ok().map(|b| b.len() as u64),
            SEGMENT_BYTES,
        );
        let ids = publish(&store, 10);
        fs.crash();
        drop(store);
        fs.power_on();
        let rep = inspect(&fs);
        assert!(rep.problems.is_empty(), "seed {seed}: {:?}", rep.problems);
        let (_s, rec) = Store::open_with(cfg, Arc::new(fs.clone()))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let got = msgs(&rec);
        assert_eq!(got, ids[..got.len()], "seed {seed}: not a prefix");
        assert!(rec.damage.is_empty(), "seed {seed}: {:?}", rec.damage);
    }
}

/// The first segment after start is created before its prepared file can
/// be ready (the helper starts with the writer); once the file is ready,
/// the next batch rolls into it instead of growing the first segment to
/// its end, so a lone committer's fdatasyncs write no inode from then on.
#[test]
fn the_first_segment_rolls_early_into_the_prepared_one_once_it_is_ready() {
    let (_dir, path) = berth_testdir::TestDir::new("prepared-early-roll").and_path();
    let mut cfg = StoreConfig::new(&path);
    cfg.log_groups = 1;
    // Big enough that the helper is still writing zeros when the first
    // publish lands.
    cfg.segment_size_bytes = 32 << 20;
    let (store, _) = Store::open_with(cfg.clone(), Arc::new(OsStorage)).unwrap();
    let first = publish(&store, 1);
    let gdir = path.join("group-0000");
    let size = |n: u32| {
        std::fs::metadata(gdir.join(format!("{n:010}.seg")))
            .ok()
            .map(|m| m.len())
    };
    assert!(
        size(1).unwrap() < cfg.segment_size_bytes,
        "the helper finished before the first publish: the premise failed"
    );
    wait_prepared_on_disk(&gdir, cfg.segment_size_bytes);
    let more = publish(&store, 20);
    assert_eq!(
        size(2),
        Some(cfg.segment_size_bytes),
        "the writes after the preparation went on growing segment 1"
    );
    drop(store);
    let (_s, rec) = Store::open_with(cfg, Arc::new(OsStorage)).unwrap();
    assert_eq!(msgs(&rec), [first, more].concat());
}

/// Preparation pays for small fdatasyncs (the inode write it saves is a
/// large share of each) and costs disk bandwidth for large ones (the
/// segment is written twice): a writer whose fdatasyncs carry ~100 KB
/// each stops preparing, and starts again once they are small.
#[test]
fn bulk_fdatasyncs_stop_the_preparation_and_small_ones_start_it_again() {
    let fs = FaultStorage::new(31);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 1 << 20;
    let (store, _) = open(&fs, &cfg);
    let big = Bytes::from(vec![7u8; 100 * 1024]);
    // 10 MB, enough for the bytes-weighted average (over 4 MiB).
    for _ in 0..100 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], big.clone(), Some(d))).unwrap();
    }
    // Any preparation started before the syncs grew was taken by a roll.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        fs.contents(&prepared_path()).is_err(),
        "the next segment is prepared under fdatasyncs of ~100 KB"
    );
    // Small fdatasyncs of 4 KB, for a few MB.
    let small = Bytes::from(vec![8u8; 4096]);
    for _ in 0..1000 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], small.clone(), Some(d))).unwrap();
    }
    wait_prepared(
        || fs.contents(&prepared_path()).ok().map(|b| b.len() as u64),
        cfg.segment_size_bytes,
    );
}
