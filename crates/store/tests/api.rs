//! Behaviour of the public API on the fault-free in-memory storage.

mod common;

use std::time::Duration;

use berth_store::fault::FaultStorage;
use berth_store::{MsgId, QueueId, StoreError};
use bytes::Bytes;
use common::{config, fresh, open, wait};

#[test]
fn published_message_reads_back_and_survives_restart() {
    let fs = FaultStorage::new(1);
    let cfg = config(2);
    let (store, rec) = open(&fs, &cfg);
    assert!(rec.queues.is_empty());
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"hello"), Some(d))).unwrap();
    assert_eq!(
        store.read(QueueId(1), m).unwrap(),
        Bytes::from_static(b"hello")
    );
    assert!(matches!(
        store.read(QueueId(2), m),
        Err(StoreError::NotFound { .. })
    ));
    drop(store);
    fs.crash(); // nothing unsynced may matter after a clean close
    fs.power_on();
    let (store, rec) = open(&fs, &cfg);
    assert_eq!(rec.queues[&QueueId(1)].len(), 1);
    assert_eq!(rec.queues[&QueueId(1)][0].msg, m);
    assert_eq!(rec.queues[&QueueId(1)][0].payload_len, 5);
    assert_eq!(
        store.read(QueueId(1), m).unwrap(),
        Bytes::from_static(b"hello")
    );
    assert!(store.next_msg_id().0 > m.0);
}

#[test]
fn acked_message_is_gone_after_restart_and_ids_stay_unique() {
    let cfg = config(3);
    let (fs, store) = fresh(2, &cfg);
    let mut last = MsgId(0);
    for i in 0..50u64 {
        let m = store.next_msg_id();
        last = m;
        wait(|d| store.publish(m, &[QueueId(i % 5)], Bytes::from(vec![7u8; 100]), Some(d)))
            .unwrap();
        wait(|d| store.remove(QueueId(i % 5), &[m], Some(d))).unwrap();
    }
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    drop(store);
    let (store, rec) = open(&fs, &cfg);
    assert!(rec.queues.is_empty(), "{:?}", rec.queues);
    assert!(
        store.next_msg_id().0 > last.0,
        "ids must not be reused after all were acked"
    );
}

#[test]
fn multi_queue_publish_spans_groups_and_is_acked_per_queue() {
    let cfg = config(4);
    let (fs, store) = fresh(3, &cfg);
    let queues: Vec<QueueId> = (0..8).map(QueueId).collect();
    let groups: std::collections::BTreeSet<u32> =
        queues.iter().map(|q| store.group_of(*q)).collect();
    assert!(groups.len() > 1, "test needs queues in several groups");
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &queues, Bytes::from_static(b"fan-out"), Some(d))).unwrap();
    let before: u64 = store.stats().iter().map(|s| s.records).sum();
    assert_eq!(before, groups.len() as u64, "stored once per group");
    wait(|d| store.remove(QueueId(0), &[m], Some(d))).unwrap();
    assert!(store.read(QueueId(0), m).is_err());
    assert_eq!(
        store.read(QueueId(1), m).unwrap(),
        Bytes::from_static(b"fan-out")
    );
    drop(store);
    let (_store, rec) = open(&fs, &cfg);
    assert!(!rec.queues.contains_key(&QueueId(0)));
    for q in 1..8 {
        assert_eq!(
            rec.queues[&QueueId(q)]
                .iter()
                .map(|r| r.msg)
                .collect::<Vec<_>>(),
            vec![m]
        );
    }
}

#[test]
fn metadata_last_write_wins_and_deletes_stick() {
    let cfg = config(2);
    let (fs, store) = fresh(4, &cfg);
    for v in ["a", "b", "c"] {
        wait(|d| store.put_meta(Bytes::from_static(b"queue/x"), Bytes::from(v), Some(d))).unwrap();
    }
    wait(|d| {
        store.put_meta(
            Bytes::from_static(b"queue/y"),
            Bytes::from_static(b"1"),
            Some(d),
        )
    })
    .unwrap();
    wait(|d| store.delete_meta(Bytes::from_static(b"queue/y"), Some(d))).unwrap();
    drop(store);
    let (_store, rec) = open(&fs, &cfg);
    assert_eq!(rec.metadata.len(), 1);
    assert_eq!(
        rec.metadata[&Bytes::from_static(b"queue/x")],
        Bytes::from_static(b"c")
    );
}

#[test]
fn purge_removes_every_message_of_the_queue_only() {
    let cfg = config(1);
    let (fs, store) = fresh(5, &cfg);
    for _ in 0..10 {
        let m = store.next_msg_id();
        wait(|d| {
            store.publish(
                m,
                &[QueueId(1), QueueId(2)],
                Bytes::from_static(b"x"),
                Some(d),
            )
        })
        .unwrap();
    }
    wait(|d| store.purge(QueueId(1), Some(d))).unwrap();
    drop(store);
    let (_store, rec) = open(&fs, &cfg);
    assert!(!rec.queues.contains_key(&QueueId(1)));
    assert_eq!(rec.queues[&QueueId(2)].len(), 10);
}

#[test]
fn recovered_queue_order_is_publish_order() {
    let cfg = config(2);
    let (fs, store) = fresh(6, &cfg);
    let mut ids = Vec::new();
    for i in 0..200u32 {
        let m = store.next_msg_id();
        ids.push(m);
        wait(|d| {
            store.publish(
                m,
                &[QueueId(9)],
                Bytes::from(i.to_le_bytes().to_vec()),
                Some(d),
            )
        })
        .unwrap();
    }
    store.checkpoint().unwrap();
    for &m in &ids[..50] {
        wait(|d| store.remove(QueueId(9), &[m], Some(d))).unwrap();
    }
    drop(store);
    let (store, rec) = open(&fs, &cfg);
    let got: Vec<MsgId> = rec.queues[&QueueId(9)].iter().map(|r| r.msg).collect();
    assert_eq!(got, ids[50..]);
    assert_eq!(
        store.read(QueueId(9), ids[199]).unwrap(),
        Bytes::from(199u32.to_le_bytes().to_vec())
    );
}

#[test]
fn dead_segments_are_deleted_and_mostly_dead_ones_compacted() {
    let mut cfg = config(1);
    cfg.segment_size_bytes = 8 * 1024;
    let (fs, store) = fresh(7, &cfg);
    let payload = Bytes::from(vec![1u8; 1000]);
    let mut ids = Vec::new();
    for _ in 0..100 {
        let m = store.next_msg_id();
        ids.push(m);
        wait(|d| store.publish(m, &[QueueId(1)], payload.clone(), Some(d))).unwrap();
    }
    let segs_full = store.stats()[0].segments;
    assert!(segs_full >= 12, "{segs_full}");
    // Ack all but every 10th: every segment is mostly dead, none empty.
    for (i, &m) in ids.iter().enumerate() {
        if i % 10 != 0 {
            wait(|d| store.remove(QueueId(1), &[m], Some(d))).unwrap();
        }
    }
    store.compact().unwrap();
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    let st = &store.stats()[0];
    assert!(st.bytes_compacted > 0);
    assert!(st.segments_deleted >= 10, "{st:?}");
    assert!(st.segments < segs_full / 2, "{st:?}");
    for &m in ids.iter().step_by(10) {
        assert_eq!(store.read(QueueId(1), m).unwrap(), payload);
    }
    drop(store);
    let (store, rec) = open(&fs, &cfg);
    let got: Vec<MsgId> = rec.queues[&QueueId(1)].iter().map(|r| r.msg).collect();
    assert_eq!(got, ids.iter().copied().step_by(10).collect::<Vec<_>>());
    for &m in &got {
        assert_eq!(store.read(QueueId(1), m).unwrap(), payload);
    }
}

#[test]
fn failed_fsync_poisons_the_group_and_fails_pending_and_later_writes() {
    let cfg = config(1);
    let (fs, store) = fresh(9, &cfg);
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"ok"), Some(d))).unwrap();
    fs.fail_syncs_after(Some(0));
    let m2 = store.next_msg_id();
    let e = wait(|d| store.publish(m2, &[QueueId(1)], Bytes::from_static(b"lost"), Some(d)))
        .unwrap_err();
    assert!(matches!(e, StoreError::Poisoned { .. }), "{e}");
    fs.fail_syncs_after(None);
    let m3 = store.next_msg_id();
    let e = wait(|d| store.publish(m3, &[QueueId(1)], Bytes::from_static(b"later"), Some(d)))
        .unwrap_err();
    assert!(matches!(e, StoreError::Poisoned { .. }), "{e}");
    assert!(store.stats()[0].poisoned);
    assert!(
        store.close().is_err(),
        "close must report the poisoned group"
    );
    fs.crash();
    fs.power_on();
    let (_store, rec) = open(&fs, &cfg);
    assert_eq!(
        rec.queues[&QueueId(1)]
            .iter()
            .map(|r| r.msg)
            .collect::<Vec<_>>(),
        vec![m]
    );
}

#[test]
fn oversized_payload_and_empty_queue_list_are_refused() {
    let mut cfg = config(1);
    cfg.payload_bytes_max = 10;
    let (_fs, store) = fresh(10, &cfg);
    let m = store.next_msg_id();
    assert!(matches!(
        wait(|d| store.publish(m, &[QueueId(1)], Bytes::from(vec![0; 11]), Some(d))),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        wait(|d| store.publish(m, &[], Bytes::new(), Some(d))),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn real_files_roundtrip() {
    let dir = berth_testdir::TestDir::unmade("store-test");
    let mut cfg = berth_store::StoreConfig::new(dir.path());
    cfg.log_groups = 2;
    let (store, _) = berth_store::Store::open(cfg.clone()).unwrap();
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(3)], Bytes::from_static(b"disk"), Some(d))).unwrap();
    drop(store);
    let (store, rec) = berth_store::Store::open(cfg).unwrap();
    assert_eq!(rec.queues[&QueueId(3)][0].msg, m);
    assert_eq!(
        store.read(QueueId(3), m).unwrap(),
        Bytes::from_static(b"disk")
    );
    drop(store);
}

#[test]
fn interval_mode_completes_before_sync_and_syncs_in_the_background() {
    let mut cfg = config(1);
    cfg.sync = berth_store::SyncMode::Interval;
    cfg.sync_interval_ms = 20;
    let (fs, store) = fresh(11, &cfg);
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    let syncs_before = store.stats()[0].syncs;
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        store.stats()[0].syncs > syncs_before,
        "background sync did not run"
    );
    // Now durable: survives a power loss.
    fs.crash();
    drop(store);
    fs.power_on();
    let (_s, rec) = open(&fs, &cfg);
    assert_eq!(rec.queues[&QueueId(1)][0].msg, m);
}

#[test]
fn flush_forces_durability_in_never_mode() {
    let mut cfg = config(2);
    cfg.sync = berth_store::SyncMode::Never;
    let (fs, store) = fresh(12, &cfg);
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    wait(|d| store.flush(d)).unwrap();
    fs.crash();
    drop(store);
    fs.power_on();
    let (_s, rec) = open(&fs, &cfg);
    assert_eq!(rec.queues[&QueueId(1)][0].msg, m);
}

#[test]
fn idle_active_segment_is_rolled_so_its_space_can_be_freed() {
    let mut cfg = config(1);
    cfg.segment_idle_roll_ms = 20;
    cfg.checkpoint_interval_ms = 20;
    // The publish and the remove must share the one segment the idle roll
    // seals: with preparation on, an early roll into the prepared segment
    // could put them in two.
    cfg.segment_prepare = false;
    let (_fs, store) = fresh(13, &cfg);
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    wait(|d| store.remove(QueueId(1), &[m], Some(d))).unwrap();
    // Idle: the segment is sealed, two background checkpoints pass it, and
    // it is deleted without any further write.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.stats()[0].segments_deleted == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "idle segment never freed: {:?}",
            store.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(store.stats()[0].segments, 0);
}

#[test]
fn index_ram_per_message_is_small() {
    let mut cfg = config(1);
    cfg.segment_size_bytes = 1 << 30;
    let (_fs, store) = fresh(14, &cfg);
    let n = 100_000u64;
    for _ in 0..n - 1 {
        let m = store.next_msg_id();
        store.publish(
            m,
            &[QueueId(1)],
            Bytes::from_static(b"x"),
            Some(Box::new(|r| r.unwrap())),
        );
    }
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    let st = &store.stats()[0];
    assert_eq!(st.live_messages, n);
    let per_msg = st.index_bytes as f64 / n as f64;
    eprintln!("index bytes per queued message: {per_msg:.1}");
    // Hash table at its current load factor: 33 bytes/slot, 50-87.5% full,
    // plus 8-16 bytes in the queue's list.
    assert!(per_msg <= 96.0, "{per_msg}");
}

#[test]
fn groups_spread_over_data_dirs_and_a_misordered_dir_list_is_refused() {
    let mut cfg = config(4);
    cfg.data_dirs = vec!["/disk-a".into(), "/disk-b".into()];
    let (fs, store) = fresh(15, &cfg);
    let m = store.next_msg_id();
    let all: Vec<QueueId> = (0..16).map(QueueId).collect();
    wait(|d| store.publish(m, &all, Bytes::from_static(b"x"), Some(d))).unwrap();
    drop(store);
    assert_eq!(
        fs.names(std::path::Path::new("/disk-a")),
        ["MANIFEST", "group-0000", "group-0002"]
    );
    assert_eq!(
        fs.names(std::path::Path::new("/disk-b")),
        ["MANIFEST", "group-0001", "group-0003"]
    );
    let mut swapped = cfg.clone();
    swapped.data_dirs.reverse();
    assert!(matches!(
        berth_store::Store::open_with(swapped, std::sync::Arc::new(fs.clone())),
        Err(StoreError::Config(_))
    ));
    // The group count is the manifest's, whatever the configuration says.
    let mut more = cfg.clone();
    more.log_groups = 7;
    let (store, rec) = open(&fs, &more);
    assert_eq!(store.group_count(), 4);
    assert_eq!(rec.queues.len(), 16);
}

/// Space amplification stays bounded under steady publish/ack churn:
/// segment bytes on disk never exceed 2 × live bytes (compaction
/// threshold) + the journal since the older kept checkpoint (3 ×
/// checkpoint_journal_bytes: two intervals, and the one during which the
/// next checkpoint is being written) + two segments of slack.
#[test]
fn space_amplification_stays_bounded_under_churn() {
    let mut cfg = config(1);
    cfg.segment_size_bytes = 8 * 1024;
    cfg.checkpoint_journal_bytes = 32 * 1024;
    cfg.compaction_pause_ms = 0;
    let (fs, store) = fresh(16, &cfg);
    let payload = Bytes::from(vec![3u8; 500]);
    let mut live = std::collections::VecDeque::new();
    let mut rng = 0x1234_5678_u64;
    let mut worst = 0u64;
    for i in 0..3000u32 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload.clone(), Some(d))).unwrap();
        live.push_back(m);
        // Mostly FIFO, sometimes a straggler stays behind for a long time.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if live.len() > 20 {
            let idx = if rng.is_multiple_of(10) {
                live.len() - 1
            } else {
                0
            };
            let old = if rng.is_multiple_of(50) {
                live.pop_back()
            } else {
                live.remove(idx)
            };
            if let Some(old) = old {
                wait(|d| store.remove(QueueId(1), &[old], Some(d))).unwrap();
            }
        }
        if i % 50 == 0 {
            let dir = common::group_dir(0);
            let disk: u64 = fs
                .names(&dir)
                .iter()
                .filter(|n| n.ends_with(".seg"))
                // Compaction runs on the writer thread between its batches,
                // concurrently with this loop: a segment listed may be
                // reclaimed before it is read, and then holds no bytes.
                .map(|n| match fs.contents(&dir.join(n)) {
                    Ok(b) => b.len() as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                    Err(e) => panic!("reading segment {n}: {e}"),
                })
                .sum();
            worst = worst.max(disk);
        }
    }
    let live_bytes = 21 * (500 + 40);
    let bound = 2 * live_bytes + 3 * cfg.checkpoint_journal_bytes + 2 * cfg.segment_size_bytes;
    eprintln!("worst segment bytes {worst}, bound {bound}, live {live_bytes}");
    assert!(
        worst <= bound,
        "segments hold {worst} bytes, bound {bound}: {:?}",
        store.stats()
    );
}

#[test]
fn read_many_reads_neighbours_together_and_checks_each_record() {
    let cfg = config(1); // one group: the two queues' records interleave
    let (fs, store) = fresh(7, &cfg);
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..120u32 {
        let m = store.next_msg_id();
        let (q, list) = if i % 3 == 0 {
            (QueueId(2), &mut theirs)
        } else {
            (QueueId(1), &mut mine)
        };
        let body = Bytes::from(format!(
            "payload-{i:04}-{}",
            "x".repeat((i % 7) as usize * 300)
        ));
        wait(|d| store.publish(m, &[q], body.clone(), Some(d))).unwrap();
        list.push((m, body));
    }
    // Asked out of order, with another queue's message and an unknown id.
    let mut ask: Vec<MsgId> = mine.iter().rev().map(|(m, _)| *m).collect();
    ask.push(theirs[0].0);
    ask.push(MsgId(999_999));
    let got = store.read_many(QueueId(1), &ask);
    assert_eq!(got.len(), ask.len());
    for (i, (m, body)) in mine.iter().rev().enumerate() {
        assert_eq!(got[i].as_ref().unwrap(), body, "message {m:?}");
    }
    assert!(matches!(
        got[ask.len() - 2],
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        got[ask.len() - 1],
        Err(StoreError::NotFound { .. })
    ));

    // A flipped bit fails that record's CRC only; its neighbours still read.
    let (victim, body) = &mine[10];
    let seg = common::group_dir(0).join(format!("{:010}.seg", 0));
    let segs = fs.names(&common::group_dir(0));
    let seg = segs
        .iter()
        .map(|n| common::group_dir(0).join(n))
        .find(|p| {
            fs.contents(p)
                .is_ok_and(|c| c.windows(body.len()).any(|w| w == &body[..]))
        })
        .unwrap_or(seg);
    let bytes = fs.contents(&seg).unwrap();
    let at = bytes
        .windows(body.len())
        .position(|w| w == &body[..])
        .unwrap();
    fs.flip_bit(&seg, at as u64 + 3, 2).unwrap();
    let ids: Vec<MsgId> = mine[8..13].iter().map(|(m, _)| *m).collect();
    let got = store.read_many(QueueId(1), &ids);
    for (k, (m, b)) in mine[8..13].iter().enumerate() {
        if m == victim {
            assert!(
                matches!(got[k], Err(StoreError::Corrupt { .. })),
                "{:?}",
                got[k]
            );
        } else {
            assert_eq!(got[k].as_ref().unwrap(), b);
        }
    }
}

/// A Remove too large for one record (mass expiry, a huge `multiple` ack)
/// is written as several records, and the group keeps working.
#[test]
fn remove_of_millions_of_ids_is_split_into_several_records_not_fatal() {
    let cfg = config(1);
    let (fs, store) = fresh(17, &cfg);
    let keep = store.next_msg_id();
    let gone = store.next_msg_id();
    for m in [keep, gone] {
        wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    }
    // More ids than one record body (128 MiB) can hold.
    let n = (berth_store::limits::RECORD_BODY_BYTES_MAX as u64) / 8 + 1_000;
    let mut ids: Vec<MsgId> = (1_000_000..1_000_000 + n).map(MsgId).collect();
    ids.push(gone);
    let r = wait(|d| store.remove(QueueId(1), &ids, Some(d)));
    assert!(r.is_ok(), "remove of {} ids: {r:?}", ids.len());
    drop(ids);
    assert!(store.stats()[0].records >= 4, "{:?}", store.stats());
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"y"), Some(d))).unwrap();
    drop(store);
    fs.crash();
    fs.power_on();
    let (_store, rec) = open(&fs, &cfg);
    let got: Vec<MsgId> = rec.queues[&QueueId(1)].iter().map(|r| r.msg).collect();
    assert_eq!(got, vec![keep, m]);
}

/// A publish whose queue list and payload together exceed one record is
/// refused (the publisher gets a nack), and the group keeps working.
#[test]
fn publish_too_large_for_one_record_is_refused_not_fatal() {
    let cfg = config(1);
    let (_fs, store) = fresh(18, &cfg);
    let payload = Bytes::from(vec![5u8; cfg.payload_bytes_max as usize]);
    let queues: Vec<QueueId> = (0..10_000).map(QueueId).collect();
    let m = store.next_msg_id();
    let r = wait(|d| store.publish(m, &queues, payload, Some(d)));
    assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &queues, Bytes::from_static(b"ok"), Some(d))).unwrap();
    assert!(!store.stats()[0].poisoned);
    store.close().unwrap();
}

/// If the writer thread dies (a bug), its group is poisoned: the request
/// being written and every later one fail with `Poisoned`, and shutdown
/// reports it.
#[test]
fn dead_writer_poisons_its_group_fails_every_waiter_and_close_reports_it() {
    let mut cfg = config(1);
    // The injected panic is the next sync's, whoever calls it: not the
    // segment preparation helper's.
    cfg.segment_prepare = false;
    let (fs, store) = fresh(19, &cfg);
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"ok"), Some(d))).unwrap();
    fs.panic_on_next_sync();
    let m2 = store.next_msg_id();
    let e = wait(|d| store.publish(m2, &[QueueId(1)], Bytes::from_static(b"x"), Some(d)));
    assert!(matches!(e, Err(StoreError::Poisoned { .. })), "{e:?}");
    let m3 = store.next_msg_id();
    let e = wait(|d| store.publish(m3, &[QueueId(1)], Bytes::from_static(b"y"), Some(d)));
    assert!(matches!(e, Err(StoreError::Poisoned { .. })), "{e:?}");
    assert!(store.stats()[0].poisoned);
    let e = store.close();
    assert!(e.is_err(), "close must report the dead writer");
}

/// A live record that fails its checksum is reported and left where it is;
/// background compaction moves on to the other segments instead of
/// retrying that one forever.
#[test]
fn corrupt_live_record_does_not_stop_background_compaction() {
    let mut cfg = config(1);
    cfg.segment_size_bytes = 8 * 1024;
    cfg.compaction_pause_ms = 1;
    // The damaged record must be the first of segment 1: an early roll
    // into a prepared segment could leave segment 1 holding less.
    cfg.segment_prepare = false;
    let (fs, store) = fresh(20, &cfg);
    let payload = Bytes::from(vec![1u8; 1000]);
    let mut ids = Vec::new();
    for _ in 0..100 {
        let m = store.next_msg_id();
        ids.push(m);
        wait(|d| store.publish(m, &[QueueId(1)], payload.clone(), Some(d))).unwrap();
    }
    let segs_full = store.stats()[0].segments;
    // The first record of the first segment (a message that stays live) is
    // damaged on disk.
    let first = common::group_dir(0).join(format!("{:010}.seg", 1));
    fs.flip_bit(&first, 100, 3).unwrap();
    for (i, &m) in ids.iter().enumerate() {
        if i % 10 != 0 {
            wait(|d| store.remove(QueueId(1), &[m], Some(d))).unwrap();
        }
    }
    // Background compaction runs until nothing it can move is left.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = u64::MAX;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now = store.stats()[0].bytes_compacted;
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    let st = &store.stats()[0];
    assert!(st.segments_deleted >= 10, "{st:?}");
    assert!(st.segments < segs_full / 2, "{st:?}");
    assert_eq!(
        st.unreadable_records, 1,
        "reported once, not retried: {st:?}"
    );
    assert!(matches!(
        store.read(QueueId(1), ids[0]),
        Err(StoreError::Corrupt { .. })
    ));
    for &m in ids.iter().step_by(10).skip(1) {
        assert_eq!(store.read(QueueId(1), m).unwrap(), payload);
    }
}

/// Group commit with an injected clock on which every fdatasync takes
/// 2 ms: concurrent committers are gathered, the pause is capped by
/// `commit_delay_us_max` (below the 2 ms fsync it would otherwise match),
/// and a lone committer never waits — before any burst, and after one.
#[test]
fn gathering_happens_under_concurrency_is_capped_and_never_for_a_lone_committer() {
    use berth_store::clock::ManualClock;
    let fs = FaultStorage::new(21);
    let clock = std::sync::Arc::new(ManualClock::new());
    fs.set_simulated_sync_latency(std::sync::Arc::clone(&clock), Duration::from_millis(2));
    // Real latency too, so that committers do meet during an fsync.
    fs.set_sync_latency(Duration::from_micros(300));
    let mut cfg = config(1);
    cfg.commit_delay_us_max = 1_000;
    // Only the writer's fdatasyncs may advance the injected clock.
    cfg.segment_prepare = false;
    let (store, _) = berth_store::Store::open_with_clock(
        cfg.clone(),
        std::sync::Arc::new(fs.clone()),
        std::sync::Arc::clone(&clock) as std::sync::Arc<dyn berth_store::clock::Clock>,
    )
    .unwrap();
    let lone = |store: &berth_store::Store, n: usize| {
        for _ in 0..n {
            let m = store.next_msg_id();
            wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
        }
    };
    lone(&store, 30);
    assert_eq!(store.stats()[0].gather_waits, 0, "a lone committer waited");

    let store = std::sync::Arc::new(store);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                for _ in 0..30 {
                    let m = store.next_msg_id();
                    wait(|d| store.publish(m, &[QueueId(t)], Bytes::from_static(b"x"), Some(d)))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = store.stats()[0].clone();
    assert!(
        st.gather_waits > 0,
        "concurrent committers were never gathered: {st:?}"
    );
    assert_eq!(
        st.gather_us_max, cfg.commit_delay_us_max,
        "the pause is about one fsync (2 ms), capped at commit_delay_us_max: {st:?}"
    );
    assert!(
        st.batches < 30 + 8 * 30,
        "group commit should batch: {st:?}"
    );

    // The burst is over; one committer carries on alone.
    clock.advance(Duration::from_secs(1));
    lone(&store, 10);
    let waits = store.stats()[0].gather_waits - st.gather_waits;
    assert_eq!(
        waits, 0,
        "a lone committer waited {waits} times after a burst"
    );
}

/// A checkpoint never copies the index on the writer's path (a pause in
/// proportion to the index, under the lock readers need): its helper
/// thread rebuilds the index from the previous checkpoint and the journal
/// since. What it writes must be exactly the live state: restarts from
/// those checkpoints recover every live message and nothing else.
#[test]
fn checkpoints_are_rebuilt_from_the_journal_not_cloned_on_the_writer_path() {
    let mut cfg = config(2);
    cfg.segment_size_bytes = 8 * 1024;
    cfg.checkpoint_journal_bytes = 16 * 1024;
    cfg.compaction_pause_ms = 0;
    let (fs, store) = fresh(22, &cfg);
    let mut live: std::collections::BTreeMap<MsgId, Vec<QueueId>> = Default::default();
    let mut rng = 0x9E37_79B9_u64;
    for i in 0..3_000u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let m = store.next_msg_id();
        let qs = vec![QueueId(rng % 5), QueueId(5 + rng % 3)];
        wait(|d| store.publish(m, &qs, Bytes::from(vec![1u8; 200]), Some(d))).unwrap();
        live.insert(m, qs);
        if !rng.is_multiple_of(3) {
            let (&old, qs) = live.iter_mut().next().unwrap();
            let q = qs.remove(0);
            wait(|d| store.remove(q, &[old], Some(d))).unwrap();
            if qs.is_empty() {
                live.remove(&old);
            }
        }
        if i % 700 == 0 {
            wait(|d| store.purge(QueueId(rng % 5), Some(d))).unwrap();
            let purged = QueueId(rng % 5);
            live.retain(|_, qs| {
                qs.retain(|q| *q != purged);
                !qs.is_empty()
            });
        }
    }
    store.checkpoint().unwrap();
    let st = store.stats();
    assert!(st.iter().all(|g| g.checkpoints >= 3), "{st:?}");
    assert!(st.iter().any(|g| g.segments_deleted > 0), "{st:?}");
    let snapshots: u64 = st.iter().map(|g| g.checkpoint_snapshots).sum();
    assert_eq!(
        snapshots, 0,
        "checkpoints cloned the index on the writer path: {st:?}"
    );
    // Restart from the checkpoints alone (the last one covers everything).
    drop(store);
    let (_store, rec) = open(&fs, &cfg);
    let mut expected: std::collections::BTreeMap<QueueId, Vec<MsgId>> = Default::default();
    for (m, qs) in &live {
        for q in qs {
            expected.entry(*q).or_default().push(*m);
        }
    }
    let got: std::collections::BTreeMap<QueueId, Vec<MsgId>> = rec
        .queues
        .iter()
        .map(|(q, ms)| (*q, ms.iter().map(|m| m.msg).collect()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        rec.stats.records_replayed, 0,
        "the last checkpoint covers all"
    );
}

#[test]
fn a_completed_write_is_within_the_groups_durable_lsn() {
    // The journal seam's positions: explicit, monotonic, and reached by
    // the time a write under `sync = always` completes.
    let cfg = config(1);
    let (_fs, store) = fresh(41, &cfg);
    assert_eq!(store.durable_lsn(0), 0, "nothing synced yet");
    for i in 1..=5u64 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
        // One record per publish, each alone in its batch.
        assert_eq!(store.durable_lsn(0), i);
    }
    assert_eq!(store.stats()[0].durable_lsn, 5);
    store.close().unwrap();
}

#[test]
fn an_idle_writer_gives_its_batch_buffer_back() {
    let mut cfg = config(1);
    cfg.segment_idle_roll_ms = 20;
    let (_fs, store) = fresh(15, &cfg);
    let m = store.next_msg_id();
    let body = Bytes::from(vec![7u8; 1024 * 1024]);
    wait(|d| store.publish(m, &[QueueId(1)], body, Some(d))).unwrap();
    let busy = store.stats()[0].write_buffer_bytes;
    assert!(
        busy >= 1024 * 1024,
        "a 1 MiB record left a {busy}-byte buffer"
    );
    // Idle: the buffer goes back without any further write.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.stats()[0].write_buffer_bytes != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer kept its {}-byte buffer while idle",
            store.stats()[0].write_buffer_bytes
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // And the group still writes.
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], Bytes::from_static(b"x"), Some(d))).unwrap();
    assert_eq!(store.read(QueueId(1), m).unwrap(), Bytes::from_static(b"x"));
}

#[test]
fn a_drained_index_is_checkpointed_as_a_copy_not_as_a_delta_of_its_removals() {
    let mut cfg = config(1);
    cfg.checkpoint_journal_bytes = 1 << 40;
    cfg.checkpoint_interval_ms = 3_600_000;
    let (fs, store) = fresh(16, &cfg);
    // A first checkpoint with messages in it, so the next could be a delta.
    let msgs: Vec<MsgId> = (0..2_000).map(|_| store.next_msg_id()).collect();
    for &m in &msgs {
        store.publish(
            m,
            &[QueueId(1)],
            Bytes::from(vec![1u8; 512]),
            Some(Box::new(|r| r.unwrap())),
        );
    }
    wait(|d| store.flush(d)).unwrap();
    store.checkpoint().unwrap();
    let before = store.stats()[0].checkpoint_snapshots;
    // Drained: the journal since holds 2,000 removals, the index nothing.
    for chunk in msgs.chunks(100) {
        wait(|d| store.remove(QueueId(1), chunk, Some(d))).unwrap();
    }
    store.checkpoint().unwrap();
    let st = &store.stats()[0];
    assert_eq!(st.live_messages, 0);
    assert_eq!(
        st.checkpoint_snapshots,
        before + 1,
        "the checkpoint of an emptied index replayed the journal's removals: {st:?}"
    );
    // And a restart from it finds the queue empty.
    drop(store);
    let (_store, rec) = open(&fs, &cfg);
    assert!(
        rec.queues.get(&QueueId(1)).is_none_or(|q| q.is_empty()),
        "{:?}",
        rec.queues
    );
}
