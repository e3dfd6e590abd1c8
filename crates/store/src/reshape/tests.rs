//! Reshape: the plan, the copy, and a crash at each step of the switch.
use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::storage::OsStorage;
use crate::store::{Store, Ticket};
use crate::{MsgId, QueueId, StoreConfig};
use berth_testdir::TestDir;

/// A data directory not made yet: the guard that removes it when the test
/// ends (passed or failed), and its path.
fn scratch(name: &str) -> (TestDir, PathBuf) {
    TestDir::unmade(&format!("reshape-{name}")).and_path()
}

fn config(dirs: &[PathBuf], groups: u32) -> StoreConfig {
    let mut c = StoreConfig::new(dirs[0].clone());
    c.data_dirs = dirs.to_vec();
    c.log_groups = groups;
    c.segment_size_bytes = 4096;
    c
}

/// 40 queues, 25 messages each, every fifth in a second queue too, the
/// first five of each queue acked; one metadata key per queue.
fn fill(dirs: &[PathBuf], groups: u32) -> u64 {
    let (store, _) = Store::open(config(dirs, groups)).unwrap();
    let mut tickets = Vec::new();
    for q in 1..=40u64 {
        let (done, t) = Ticket::new();
        store.put_meta(
            Bytes::from(format!("q{q}")),
            Bytes::from(vec![q as u8; 10]),
            Some(done),
        );
        tickets.push(t);
        for i in 0..25u64 {
            let msg = store.next_msg_id();
            let mut queues = vec![QueueId(q)];
            if i % 5 == 0 {
                queues.push(QueueId(q % 40 + 1));
            }
            let (done, t) = Ticket::new();
            store.publish(
                msg,
                &queues,
                Bytes::from(format!("{q}-{i}-{}", "x".repeat(100))),
                Some(done),
            );
            tickets.push(t);
        }
    }
    for t in tickets {
        t.wait().unwrap();
    }
    store.close().unwrap();
    let (store, rec) = Store::open(config(dirs, groups)).unwrap();
    for q in 1..=40u64 {
        let first: Vec<MsgId> = rec.queues[&QueueId(q)]
            .iter()
            .take(5)
            .map(|m| m.msg)
            .collect();
        let (done, t) = Ticket::new();
        store.remove(QueueId(q), &first, Some(done));
        t.wait().unwrap();
    }
    // The newest message acked everywhere: the high-water mark must survive.
    let last = store.next_msg_id();
    let (done, t) = Ticket::new();
    store.publish(last, &[QueueId(1)], Bytes::from_static(b"gone"), Some(done));
    t.wait().unwrap();
    let (done, t) = Ticket::new();
    store.remove(QueueId(1), &[last], Some(done));
    t.wait().unwrap();
    store.close().unwrap();
    last.0
}

/// Everything a store holds, payloads included, in per-queue order.
type Contents = (
    BTreeMap<QueueId, Vec<(MsgId, Bytes)>>,
    BTreeMap<Bytes, Bytes>,
    MsgId,
);

fn contents(dirs: &[PathBuf]) -> Contents {
    let (store, rec) = Store::open(config(dirs, 2)).unwrap();
    let mut out = BTreeMap::new();
    for (q, msgs) in &rec.queues {
        let ids: Vec<MsgId> = msgs.iter().map(|m| m.msg).collect();
        let bodies = store.read_many(*q, &ids);
        out.insert(
            *q,
            ids.into_iter()
                .zip(bodies.into_iter().map(Result::unwrap))
                .collect(),
        );
    }
    store.close().unwrap();
    (out, rec.metadata, rec.next_msg_id)
}

#[test]
fn same_shape_and_new_store_need_no_reshape() {
    let (_d, d) = scratch("same");
    assert_eq!(
        plan(&OsStorage, std::slice::from_ref(&d), Some(3)).unwrap(),
        None
    );
    fill(std::slice::from_ref(&d), 2);
    assert_eq!(
        plan(&OsStorage, std::slice::from_ref(&d), Some(2)).unwrap(),
        None
    );
    assert_eq!(
        plan(&OsStorage, std::slice::from_ref(&d), None).unwrap(),
        None
    );
    let p = plan(&OsStorage, std::slice::from_ref(&d), Some(6))
        .unwrap()
        .unwrap();
    assert_eq!((p.old_groups, p.new_groups), (2, 6));
    assert!(p.old_store_bytes > 0);
    assert!(
        p.describe()
            .contains("store.log_groups 2 on disk, 6 configured"),
        "{}",
        p.describe()
    );
}

#[test]
fn a_store_directory_left_out_is_refused_with_its_index() {
    let ((_a, a), (_b, b)) = (scratch("out-a"), scratch("out-b"));
    fill(&[a.clone(), b.clone()], 2);
    let e = plan(&OsStorage, std::slice::from_ref(&a), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("data directory 1 of the 2"), "{e}");
    // Reordered directories are a reshape, not an error.
    let p = plan(&OsStorage, &[b.clone(), a.clone()], None)
        .unwrap()
        .unwrap();
    assert_eq!(p.old_dirs, vec![a.clone(), b.clone()]);
}

#[test]
fn free_space_check_refuses_before_writing() {
    let (_d, d) = scratch("free");
    fill(std::slice::from_ref(&d), 2);
    let p = plan(&OsStorage, std::slice::from_ref(&d), Some(4))
        .unwrap()
        .unwrap();
    let before: Vec<String> = OsStorage.list(&d).unwrap();
    let e = check_free_space(&p, &|_| Ok(p.bytes_needed() - 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused before writing anything"), "{e}");
    assert_eq!(OsStorage.list(&d).unwrap(), before);
    check_free_space(&p, &|_| Ok(p.bytes_needed())).unwrap();
}

#[test]
fn reshape_2_to_6_groups_and_onto_two_dirs_and_back_keeps_everything() {
    let ((_a, a), (_b, b)) = (scratch("rt-a"), scratch("rt-b"));
    let hw = fill(std::slice::from_ref(&a), 2);
    let (want, meta, next) = contents(std::slice::from_ref(&a));
    assert!(next.0 > hw);
    for (dirs, groups) in [
        (vec![a.clone()], 6),
        (vec![a.clone(), b.clone()], 6),
        (vec![a.clone(), b.clone()], 2),
    ] {
        let p = plan(&OsStorage, &dirs, Some(groups)).unwrap().unwrap();
        let r = run(
            &p,
            &config(&dirs, groups),
            Arc::new(OsStorage),
            1000 + u64::from(groups),
        )
        .unwrap();
        assert_eq!(r.copy.queues, 40);
        assert_eq!(plan(&OsStorage, &dirs, Some(groups)).unwrap(), None);
        let (got, got_meta, got_next) = contents(&dirs);
        assert_eq!(got, want);
        assert_eq!(got_meta, meta);
        assert!(got_next >= next, "{got_next} < {next}");
        assert!(!dirs.iter().any(|d| d.join(STAGING_DIR).exists()));
        assert!(!a.join(COMMIT_NAME).exists());
    }
    assert!(a.join(format!("{OLD_DIR_PREFIX}1006/MANIFEST")).exists());
    assert!(a.join(format!("{OLD_DIR_PREFIX}1006-1/MANIFEST")).exists());
}

#[test]
fn crash_before_commit_keeps_the_old_store_and_discards_the_copy() {
    let (_d, d) = scratch("precommit");
    fill(std::slice::from_ref(&d), 2);
    let (want, ..) = contents(std::slice::from_ref(&d));
    let p = plan(&OsStorage, std::slice::from_ref(&d), Some(5))
        .unwrap()
        .unwrap();
    copy_and_verify(
        &p,
        &config(std::slice::from_ref(&d), 5),
        Arc::new(OsStorage),
    )
    .unwrap();
    // Crash here: no commit record.
    let r = finish_interrupted(&OsStorage, std::slice::from_ref(&d)).unwrap();
    assert_eq!(
        r,
        Interrupted::Discarded {
            staging: vec![d.join(STAGING_DIR)]
        }
    );
    assert!(!d.join(STAGING_DIR).exists());
    assert_eq!(contents(std::slice::from_ref(&d)).0, want);
    assert_eq!(
        plan(&OsStorage, std::slice::from_ref(&d), Some(5)).unwrap(),
        Some(p)
    );
    assert_eq!(
        finish_interrupted(&OsStorage, std::slice::from_ref(&d)).unwrap(),
        Interrupted::None
    );
}

#[test]
fn crash_after_commit_at_every_step_finishes_on_the_new_store() {
    // Crash points: after the commit record; after some old entries moved;
    // after phase 2; after some staging entries moved.
    for crash_at in 0..4 {
        let ((_a, a), (_b, b)) = (
            scratch(&format!("post-a{crash_at}")),
            scratch(&format!("post-b{crash_at}")),
        );
        fill(std::slice::from_ref(&a), 2);
        let (want, ..) = contents(std::slice::from_ref(&a));
        let dirs = vec![a.clone(), b.clone()];
        let p = plan(&OsStorage, &dirs, Some(3)).unwrap().unwrap();
        copy_and_verify(&p, &config(&dirs, 3), Arc::new(OsStorage)).unwrap();
        let mut c = Commit {
            phase: 1,
            old_aside: format!("{OLD_DIR_PREFIX}7"),
            old_dirs: p.old_dirs.clone(),
            new_dirs: p.new_dirs.clone(),
        };
        write_commit(&OsStorage, &c).unwrap();
        let aside = a.join(&c.old_aside);
        if crash_at >= 1 {
            std::fs::create_dir_all(&aside).unwrap();
            std::fs::rename(a.join("group-0000"), aside.join("group-0000")).unwrap();
        }
        if crash_at >= 2 {
            move_entries(&OsStorage, &a, &aside).unwrap();
            c.phase = 2;
            write_commit(&OsStorage, &c).unwrap();
        }
        if crash_at >= 3 {
            std::fs::rename(a.join(STAGING_DIR).join("group-0000"), a.join("group-0000")).unwrap();
        }
        let r = finish_interrupted(&OsStorage, &dirs).unwrap();
        assert_eq!(
            r,
            Interrupted::Finished {
                old_kept: vec![aside.clone()]
            },
            "crash point {crash_at}"
        );
        assert_eq!(
            plan(&OsStorage, &dirs, Some(3)).unwrap(),
            None,
            "crash point {crash_at}"
        );
        assert_eq!(contents(&dirs).0, want, "crash point {crash_at}");
        assert!(aside.join(MANIFEST_NAME).exists());
    }
}

#[test]
fn a_damaged_commit_record_is_refused_not_guessed() {
    let c = Commit {
        phase: 2,
        old_aside: format!("{OLD_DIR_PREFIX}9"),
        old_dirs: vec![PathBuf::from("/a")],
        new_dirs: vec![PathBuf::from("/a"), PathBuf::from("/b c")],
    };
    let bytes = c.encode();
    assert_eq!(Commit::decode(&bytes, Path::new("R")).unwrap(), c);
    let mut bad = bytes.clone();
    bad[25] ^= 1;
    let e = Commit::decode(&bad, Path::new("R"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("damaged"), "{e}");
}

/// Every record of every stream, by stream: what a reader from offset 0
/// gets, and the stream's bounds.
type Streams = BTreeMap<QueueId, (Option<(u64, u64)>, Vec<(u64, Bytes)>)>;

fn streams_of(dirs: &[PathBuf], groups: u32) -> Streams {
    let (store, rec) = Store::open(config(dirs, groups)).unwrap();
    let out = rec
        .streams
        .keys()
        .map(|q| {
            // A read goes through a few spans at most: read on from the
            // newest offset until nothing is left.
            let mut records: Vec<(u64, Bytes)> = Vec::new();
            loop {
                let from = records.last().map_or(0, |r| r.0 + 1);
                let batch = store.read_stream(*q, from, usize::MAX, usize::MAX).unwrap();
                if batch.is_empty() {
                    break;
                }
                records.extend(batch);
            }
            (*q, (store.stream_bounds(*q), records))
        })
        .collect();
    store.close().unwrap();
    out
}

fn append(store: &Store, q: u64, offsets: impl Iterator<Item = u64>) {
    let mut tickets = Vec::new();
    for o in offsets {
        let (done, t) = Ticket::new();
        let body = format!("stream {q} offset {o} {}", "s".repeat(150));
        store.append(QueueId(q), o, Bytes::from(body), Some(done));
        tickets.push(t);
    }
    for t in tickets {
        t.wait().unwrap();
    }
}

/// A reshape copies a stream record by record at its offsets (`copy.rs`):
/// a trimmed head, a gap a crash left and a stream that starts far from 0
/// come out the same, in any number of groups, and the copy goes on
/// taking appends after its newest offset.
#[test]
fn reshape_keeps_every_stream_record_at_its_offset() {
    let (_a, a) = scratch("streams");
    let dirs = std::slice::from_ref(&a);
    {
        let (store, _) = Store::open(config(dirs, 2)).unwrap();
        // Spread over many 4 KiB segments, with classic messages between.
        for round in 0..6u64 {
            append(&store, 101, round * 50..(round + 1) * 50);
            let (done, t) = Ticket::new();
            store.publish(
                store.next_msg_id(),
                &[QueueId(7)],
                Bytes::from(vec![round as u8; 500]),
                Some(done),
            );
            t.wait().unwrap();
        }
        let (done, t) = Ticket::new();
        store.trim(QueueId(101), 120, Some(done));
        t.wait().unwrap();
        // A gap: offset 20 never reached the disk.
        append(&store, 102, (0..50).filter(|o| *o != 20));
        let (done, t) = Ticket::new();
        store.trim(QueueId(103), 1_000, Some(done));
        t.wait().unwrap();
        append(&store, 103, 1_000..1_100);
        store.close().unwrap();
    }
    let want = streams_of(dirs, 2);
    assert_eq!(want[&QueueId(101)].0, Some((120, 300)));
    assert_eq!(want[&QueueId(101)].1.len(), 180);
    assert_eq!(want[&QueueId(101)].1.first().map(|r| r.0), Some(120));
    assert_eq!(want[&QueueId(102)].1.len(), 49);
    assert_eq!(want[&QueueId(103)].0, Some((1_000, 1_100)));

    for (groups, now) in [(5, 2_005), (1, 2_001)] {
        let p = plan(&OsStorage, dirs, Some(groups)).unwrap().unwrap();
        let r = run(&p, &config(dirs, groups), Arc::new(OsStorage), now).unwrap();
        assert_eq!(r.copy.queues, 4, "one classic queue and three streams");
        let got = streams_of(dirs, groups);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (q, (bounds, records)) in &want {
            let (got_bounds, got_records) = &got[q];
            let offsets = |r: &[(u64, Bytes)]| r.iter().map(|r| r.0).collect::<Vec<_>>();
            assert_eq!(
                (got_bounds, offsets(got_records)),
                (bounds, offsets(records)),
                "stream {q} after a reshape to {groups} groups"
            );
            assert!(got_records == records, "payloads of stream {q}");
        }
    }
    // The copy takes the next appends after the newest offsets, and keeps
    // them across a restart.
    let (store, _) = Store::open(config(dirs, 1)).unwrap();
    append(&store, 101, 300..310);
    store.close().unwrap();
    let got = streams_of(dirs, 1);
    assert_eq!(got[&QueueId(101)].0, Some((120, 310)));
    assert_eq!(
        got[&QueueId(101)].1.iter().map(|r| r.0).collect::<Vec<_>>(),
        (120..310).collect::<Vec<_>>()
    );
}
