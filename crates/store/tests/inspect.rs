//! The read-only inspection behind `berth store scan|verify`, on stores
//! written by the real store code (fault storage), intact and damaged.

mod common;

use std::path::PathBuf;

use berth_store::fault::FaultStorage;
use berth_store::inspect::{inspect_group, GroupReport, Layout};
use berth_store::QueueId;
use bytes::Bytes;
use common::{config, group_dir, open, wait};

const GROUPS: u32 = 2;

/// 300 messages of 1000 bytes over 3 queues (about 5 segments of 64 KiB
/// per group), every third acked, a checkpoint midway; the store still
/// open, and the number of live messages.
fn fill(fs: &FaultStorage) -> (berth_store::Store, u64) {
    let cfg = config(GROUPS);
    let (store, _) = open(fs, &cfg);
    let mut live = 0;
    for i in 0..300u64 {
        let m = store.next_msg_id();
        let q = QueueId(i % 3);
        wait(|d| store.publish(m, &[q], Bytes::from(vec![i as u8; 1000]), Some(d))).unwrap();
        if i % 3 == 0 {
            wait(|d| store.remove(q, &[m], Some(d))).unwrap();
        } else {
            live += 1;
        }
        if i == 150 {
            store.checkpoint().unwrap();
        }
    }
    (store, live)
}

/// [`fill`], then a clean close (which checkpoints).
fn build(fs: &FaultStorage) -> u64 {
    let (store, live) = fill(fs);
    store.close().unwrap();
    live
}

/// [`fill`], then the power fails instead of a clean close: the journal
/// after the midway checkpoint is what recovery replays.
fn build_crashed(fs: &FaultStorage) {
    let (store, _) = fill(fs);
    fs.crash();
    drop(store);
    fs.power_on();
}

fn inspect_all(fs: &FaultStorage) -> Vec<GroupReport> {
    let layout = Layout::open(fs, &[PathBuf::from("/data")]).unwrap();
    assert_eq!(layout.manifest.group_count, GROUPS);
    (0..GROUPS)
        .map(|g| inspect_group(fs, &layout, g, &|_| {}).unwrap())
        .collect()
}

fn problems(reps: &[GroupReport]) -> Vec<String> {
    reps.iter()
        .flat_map(|r| &r.problems)
        .map(|p| format!("{}@{}: {}", p.file.display(), p.offset, p.what))
        .collect()
}

fn segments_of(fs: &FaultStorage, g: u32) -> Vec<String> {
    let mut v: Vec<String> = fs
        .names(&group_dir(g))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn intact_store_has_no_problems_and_counts_every_live_message() {
    let fs = FaultStorage::new(1);
    let live = build(&fs);
    let reps = inspect_all(&fs);
    assert!(problems(&reps).is_empty(), "{:?}", problems(&reps));
    let total: u64 = reps.iter().map(|r| r.live_messages).sum();
    assert_eq!(total, live);
    let published: u64 = reps.iter().map(|r| r.sizes.count).sum();
    // Fully dead segments are reclaimed, so only the surviving journal's
    // publishes are counted; every live message's is among them.
    assert!(published >= live, "{published} publishes for {live} live");
    for r in &reps {
        for (q, qr) in &r.queues {
            assert_eq!(qr.bytes, qr.messages * 1000, "{q:?}");
            assert!(qr.oldest.is_some());
        }
        let seg_live: u64 = r.segments.iter().map(|s| s.live_messages).sum();
        assert_eq!(seg_live, r.live_messages);
        assert!(r.checkpoint_used.is_some(), "close writes a checkpoint");
    }
}

#[test]
fn a_flipped_bit_in_a_sealed_segment_is_reported_with_file_and_offset() {
    let fs = FaultStorage::new(2);
    build(&fs);
    let segs = segments_of(&fs, 0);
    assert!(segs.len() >= 2, "{segs:?}");
    let path = group_dir(0).join(&segs[0]);
    // Inside the first record's body (header is 32 bytes, record header 20).
    fs.flip_bit(&path, 32 + 20 + 30, 3).unwrap();
    let reps = inspect_all(&fs);
    let p = problems(&reps);
    assert!(
        p.iter()
            .any(|s| s.starts_with(&format!("{}@32: damaged record", path.display()))),
        "{p:?}"
    );
}

#[test]
fn a_missing_or_truncated_segment_is_reported() {
    let fs = FaultStorage::new(3);
    build(&fs);
    let segs = segments_of(&fs, 1);
    assert!(segs.len() >= 3, "{segs:?}");
    // Truncate a sealed segment in the middle of a record.
    let cut = group_dir(1).join(&segs[1]);
    let bytes = fs.contents(&cut).unwrap();
    fs.put_durable(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let p = problems(&inspect_all(&fs));
    assert!(
        p.iter()
            .any(|s| s.starts_with(&cut.display().to_string()) && s.contains("cut short")),
        "{p:?}"
    );
    // A removed one, in another copy. It must hold live messages: a
    // segment before the checkpoint's replay start holding none is what
    // reclamation leaves and no problem (see the test below), and which
    // segments those are depends on when the writer rolled.
    let fs2 = FaultStorage::new(4);
    build(&fs2);
    let before = inspect_all(&fs2);
    let gone = before
        .iter()
        .flat_map(|r| {
            let newest = r.segments.iter().map(|s| s.seq).max();
            r.segments
                .iter()
                .filter(move |s| s.live_messages > 0 && Some(s.seq) != newest)
        })
        .map(|s| s.path.clone())
        .next()
        .expect("some sealed segment holds live messages");
    use berth_store::storage::Storage;
    fs2.remove(&gone).unwrap();
    let p = problems(&inspect_all(&fs2));
    assert!(
        p.iter().any(|s| s.starts_with(&gone.display().to_string())
            && (s.contains("segment missing") || s.contains("in this missing segment"))),
        "{p:?}"
    );
}

#[test]
fn a_segment_reclaimed_before_the_checkpoint_is_no_problem() {
    // Compaction may delete a mostly dead segment between two it keeps
    // (`berth store compact` then `verify` reported "segment missing" and
    // an lsn jump for it). A segment before the replay start holding no
    // live message is what reclamation leaves, not damage.
    let fs = FaultStorage::new(6);
    let cfg = config(1);
    let (store, _) = open(&fs, &cfg);
    let mut kept = 0u64;
    for i in 0..400u64 {
        let m = store.next_msg_id();
        let q = QueueId(i % 2);
        wait(|d| store.publish(m, &[q], Bytes::from(vec![i as u8; 1000]), Some(d))).unwrap();
        // Queue 0 keeps the first 50 of its messages and the last 50.
        if q.0 == 0 && !(50..150).contains(&(i / 2)) {
            kept += 1;
        } else {
            wait(|d| store.remove(q, &[m], Some(d))).unwrap();
        }
    }
    store.close().unwrap();
    let before = segments_of(&fs, 0);
    // Remove the middle segments that hold no live message, as reclamation
    // would, keeping the first and the newest ones.
    let layout = Layout::open(&fs, &[PathBuf::from("/data")]).unwrap();
    let rep = inspect_group(&fs, &layout, 0, &|_| {}).unwrap();
    let dead: Vec<u32> = rep
        .segments
        .iter()
        .filter(|s| s.live_messages == 0)
        .map(|s| s.seq)
        .filter(|&s| s > rep.segments[0].seq && s < rep.segments.last().unwrap().seq)
        .collect();
    assert!(!dead.is_empty(), "no dead middle segment among {before:?}");
    use berth_store::storage::Storage;
    for s in &dead {
        fs.remove(&group_dir(0).join(format!("{s:010}.seg")))
            .unwrap();
    }
    let rep = inspect_group(&fs, &layout, 0, &|_| {}).unwrap();
    let p: Vec<String> = rep.problems.iter().map(|p| p.what.clone()).collect();
    assert!(p.is_empty(), "{p:?}");
    assert_eq!(rep.live_messages, kept);
    assert!(
        rep.notes.iter().any(|n| n.what.contains("reclaimed")),
        "{:?}",
        rep.notes
    );
}

#[test]
fn a_damaged_checkpoint_is_reported() {
    let fs = FaultStorage::new(5);
    build(&fs);
    let ck = fs
        .names(&group_dir(0))
        .into_iter()
        .find(|n| n.ends_with(".ckpt"))
        .unwrap();
    let path = group_dir(0).join(ck);
    fs.flip_bit(&path, 70, 0).unwrap();
    let p = problems(&inspect_all(&fs));
    assert!(
        p.iter()
            .any(|s| s.starts_with(&path.display().to_string()) && s.contains("checksum")),
        "{p:?}"
    );
}

#[test]
fn layout_refuses_another_stores_directory_and_a_missing_one() {
    let fs = FaultStorage::new(6);
    build(&fs);
    let e = Layout::open(&fs, &[PathBuf::from("/nowhere")]).unwrap_err();
    assert!(e.to_string().contains("no berth store"), "{e}");
}

#[test]
fn a_range_recovery_quarantined_is_a_note_not_a_problem() {
    let fs = FaultStorage::new(7);
    let mut cfg = config(1);
    // The fourth record must be in segment 1 at the offset computed below:
    // an early roll into a prepared segment could put it in segment 2.
    cfg.segment_prepare = false;
    let (store, _) = open(&fs, &cfg);
    for _ in 0..10 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], Bytes::from(vec![5u8; 100]), Some(d))).unwrap();
    }
    // Power lost with the journal after the (absent) checkpoint: restart
    // replays it, and finds the damage below.
    fs.crash();
    drop(store);
    fs.power_on();
    let seg = group_dir(0).join(&segments_of(&fs, 0)[0]);
    let record_bytes = 20 + 12 + 8 + 100;
    fs.flip_bit(&seg, 32 + 3 * record_bytes + 25, 3).unwrap();
    let layout = Layout::open(&fs, &[PathBuf::from("/data")]).unwrap();
    let before = inspect_group(&fs, &layout, 0, &|_| {}).unwrap();
    assert_eq!(before.problems.len(), 1, "{:?}", before.problems);
    // Recovery quarantines the record and writes a Hole over it; the
    // records after it keep their numbers, so the journal skips one.
    let (store, rec) = open(&fs, &cfg);
    assert_eq!(rec.damage.len(), 1, "{:?}", rec.damage);
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    store.close().unwrap();
    let after = inspect_group(&fs, &layout, 0, &|_| {}).unwrap();
    assert!(after.problems.is_empty(), "{:?}", after.problems);
    assert!(
        after.notes.iter().any(|n| n.what.contains("set aside")),
        "{:?}",
        after.notes
    );
    assert_eq!(after.live_messages, 9);
}

/// The first whole record of segment `path` (after its 32-byte header).
fn first_record(fs: &FaultStorage, path: &std::path::Path) -> Vec<u8> {
    let bytes = fs.contents(path).unwrap();
    let body_len = u32::from_le_bytes(bytes[32 + 4..32 + 8].try_into().unwrap()) as usize;
    bytes[32..32 + 20 + body_len].to_vec()
}

/// Appends `tail` to the newest segment of group 0.
fn append_to_newest(fs: &FaultStorage, tail: &[u8]) {
    let newest = group_dir(0).join(segments_of(fs, 0).last().unwrap());
    let mut bytes = fs.contents(&newest).unwrap();
    bytes.extend_from_slice(tail);
    fs.put_durable(&newest, &bytes).unwrap();
}

#[test]
fn inspection_reports_a_problem_exactly_when_recovery_fails_sets_aside_or_skips() {
    // One reader, one decision table: in the journal recovery replays,
    // `verify` finds a problem where recovery refuses, quarantines or falls
    // back past a checkpoint, and only there; what recovery truncates as a
    // crash's torn tail is a note. (Before the replay start only
    // inspection reads: damage there shows when the message is read.)
    type Damage = fn(&FaultStorage);
    let scenarios: [(&str, Damage); 6] = [
        ("intact", |_| {}),
        (
            "a torn tail with a bad checksum in the newest segment",
            |fs| {
                let mut r = first_record(fs, &group_dir(0).join(&segments_of(fs, 0)[0]));
                let last = r.len() - 1;
                r[last] ^= 0x40;
                append_to_newest(fs, &r);
            },
        ),
        ("a flipped bit in the newest segment", |fs| {
            let path = group_dir(0).join(segments_of(fs, 0).last().unwrap());
            fs.flip_bit(&path, 32 + 20 + 30, 3).unwrap();
        }),
        ("a record out of order", |fs| {
            let r = first_record(fs, &group_dir(0).join(&segments_of(fs, 0)[0]));
            append_to_newest(fs, &r);
        }),
        ("a segment after the checkpoint removed", |fs| {
            use berth_store::storage::Storage;
            let segs = segments_of(fs, 0);
            let path = group_dir(0).join(&segs[segs.len() - 2]);
            fs.remove(&path).unwrap();
        }),
        ("a damaged checkpoint", |fs| {
            let ck = fs
                .names(&group_dir(0))
                .into_iter()
                .find(|n| n.ends_with(".ckpt"))
                .unwrap();
            fs.flip_bit(&group_dir(0).join(ck), 70, 0).unwrap();
        }),
    ];
    for (seed, (what, damage)) in (20u64..).zip(scenarios) {
        let fs = FaultStorage::new(seed);
        build_crashed(&fs);
        damage(&fs);
        let reps = inspect_all(&fs);
        let problems = problems(&reps);
        let cfg = config(GROUPS);
        let recovery = berth_store::Store::open_with(cfg, std::sync::Arc::new(fs.clone()));
        let recovery_clean = match &recovery {
            Ok((_, rec)) => rec.damage.is_empty() && rec.stats.checkpoints_ignored.is_empty(),
            Err(_) => false,
        };
        assert_eq!(
            problems.is_empty(),
            recovery_clean,
            "{what}: inspection found {problems:?}, recovery {:?}",
            recovery.as_ref().map(|(_, r)| (&r.damage, &r.stats))
        );
        if let Ok((_, rec)) = &recovery {
            let notes: Vec<&str> = reps
                .iter()
                .flat_map(|r| &r.notes)
                .map(|n| n.what.as_str())
                .collect();
            let tail_note = notes.iter().any(|n| n.contains("not a whole record yet"));
            assert_eq!(
                tail_note,
                rec.stats.truncated_bytes > 0,
                "{what}: notes {notes:?}, {} bytes truncated",
                rec.stats.truncated_bytes
            );
        }
    }
}
