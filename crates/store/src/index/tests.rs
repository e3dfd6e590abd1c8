use super::*;
use std::borrow::Cow;

#[test]
fn a_drained_index_gives_its_table_back() {
    let mut ix = Index::default();
    let q = [QueueId(1)];
    let n = 200_000u32;
    for i in 0..n {
        ix.insert(MsgId(u64::from(i)), &q, loc(1, i));
    }
    let full = ix.heap_bytes();
    let ids: Vec<u64> = (0..u64::from(n) - 1000).collect();
    ix.remove_ids(QueueId(1), &ids);
    ix.check();
    assert_eq!(ix.live_messages(), 1000);
    let drained = ix.heap_bytes();
    assert!(
        drained * 20 < full,
        "index of 200,000 messages: {full} bytes; with 1,000 left: {drained} bytes"
    );
}

/// A run inserts in table-slot order, not id order: a message listed
/// twice in one run, or already loaded by an earlier run, is still
/// refused, and a run's messages all load.
#[test]
fn load_run_refuses_a_message_listed_twice_and_loads_the_rest() {
    let run = |ids: &[u64]| -> Vec<(MsgId, Loc)> {
        ids.iter().map(|&i| (MsgId(i), loc(1, i as u32))).collect()
    };
    let mut ix = Index::default();
    let ids: Vec<u64> = (1..=3_000).map(|i| i * 7).collect();
    ix.load_run(&[QueueId(1)], run(&ids).into_iter()).unwrap();
    assert_eq!(ix.live_messages(), 3_000);
    assert!(ids.iter().all(|&i| ix.contains(MsgId(i))));
    ix.check();
    assert_eq!(
        ix.load_run(&[QueueId(2)], run(&[5, 6, 700]).into_iter()),
        Err(MsgId(700)),
        "already loaded by the first run"
    );
    let mut ix = Index::default();
    assert_eq!(
        ix.load_run(&[QueueId(1)], run(&[1, 2, 3, 2]).into_iter()),
        Err(MsgId(2)),
        "twice in one run"
    );
}

/// `live_by_queue` lists exactly what the index holds, per queue, in
/// id order, with each message's payload size: checked against the
/// index's own list of live messages after publishes to one and to
/// several queues, removals, relocations (which list an id again, out
/// of order) and a purge.
#[test]
fn live_by_queue_is_every_live_message_per_queue_in_id_order() {
    let mut ix = Index::default();
    let mut rand = xorshift(0x2545_F491_4F6C_DD1D);
    for i in 1..=5_000u64 {
        let qs: Vec<QueueId> = match rand(4) {
            0 => vec![QueueId(1), QueueId(2)],
            1 => vec![QueueId(3), QueueId(1), QueueId(4)],
            q => vec![QueueId(q)],
        };
        let at = loc(1 + (i / 1000) as u32, i as u32);
        ix.insert(
            MsgId(i),
            &qs,
            Loc {
                len: 100 + (i % 7) as u32,
                ..at
            },
        );
        match rand(5) {
            0 => ix.remove_ids(QueueId(rand(5)), &[rand(i) + 1]),
            1 => {
                // Compaction moves an older message: listed again.
                let m = rand(i) + 1;
                if let Some(e) = ix.msgs.get(&m).copied() {
                    let qs: Vec<QueueId> = if e.holder == MULTI {
                        ix.multi[&m].clone()
                    } else {
                        vec![ix.holder_queue(&e)]
                    };
                    relocate(&mut ix, m, &qs, loc(9, i as u32));
                }
            }
            _ => {}
        }
        if i == 4_000 {
            ix.apply(&Record::Purge { queue: QueueId(4) }, loc(0, 0));
        }
    }
    ix.check();
    let got = assert_listing_is_live(&mut ix);
    assert_eq!(
        got.len(),
        4,
        "queues 1, 2, 3 and what 4 got after its purge"
    );
    ix.check();
}

/// A checkpoint's runs list their payload sizes, and recovery's listing
/// uses them only while they hold: it is the index's own list of live
/// messages whether nothing happened after the load, only publishes
/// (listed after the run's ids, merged in order), or removals,
/// relocations and purges (which put a queue back on lookups).
#[test]
fn live_by_queue_after_a_checkpoint_load_is_every_live_message() {
    for ops in ["none", "publishes", "everything"] {
        let mut ix = Index::default();
        let mut rand = xorshift(0x9E37_79B9_7F4A_7C15);
        let sized = |i: u64| Loc {
            len: 300 + (i % 11) as u32,
            ..loc(1 + (i / 1000) as u32, i as u32)
        };
        // As a checkpoint lists them: one run per queue, ids ascending,
        // then the messages of several queues (ids below the runs').
        for q in 1..=3u64 {
            let ids = (1..=2_000u64).map(|i| 10_000 * q + i * 3);
            ix.load_run(&[QueueId(q)], ids.map(|i| (MsgId(i), sized(i))))
                .unwrap();
        }
        ix.load_run(
            &[QueueId(1), QueueId(2)],
            (1..=500u64).map(|i| (MsgId(i), sized(i))),
        )
        .unwrap();
        // Not ascending (no writer lists a run so): no sizes kept.
        ix.load_run(
            &[QueueId(5)],
            [70_002u64, 70_001]
                .into_iter()
                .map(|i| (MsgId(i), sized(i))),
        )
        .unwrap();
        ix.check();
        for q in 1..=3u64 {
            assert_eq!(ix.by_queue[&q].loaded.len(), 2_000, "queue {q}'s sizes");
        }
        assert!(ix.by_queue[&5].loaded.is_empty(), "a run out of order");
        let mut next = 100_000u64;
        for _ in 0..600 {
            if ops == "none" {
                break;
            }
            next += 1 + rand(3);
            let qs: Vec<QueueId> = match rand(4) {
                0 => vec![QueueId(1), QueueId(2)],
                q => vec![QueueId(q)],
            };
            let publish = Record::Publish {
                msg: MsgId(next),
                queues: qs.as_slice().into(),
                payload: &[],
            };
            ix.apply(&publish, sized(next));
            if ops == "publishes" {
                continue;
            }
            let q = QueueId(1 + rand(2));
            match rand(6) {
                0 => ix.remove_ids(q, &[10_000 * q.0 + 3 * (1 + rand(2_000))]),
                1 => ix.remove_ids(q, &[1 + rand(500)]),
                2 => {
                    let m = 10_000 * q.0 + 3 * (1 + rand(2_000));
                    if ix.contains(MsgId(m)) {
                        relocate(&mut ix, m, &[q], loc(9, m as u32));
                    }
                }
                _ => {}
            }
        }
        if ops == "everything" {
            ix.apply(&Record::Purge { queue: QueueId(3) }, loc(0, 0));
            assert!(ix.by_queue[&1].loaded.is_empty(), "queue 1 lost messages");
        } else {
            assert_eq!(ix.by_queue[&1].loaded.len(), 2_000, "queue 1 lost none");
        }
        ix.check();
        let got = assert_listing_is_live(&mut ix);
        assert!(
            got[&QueueId(1)].len() >= 2_000 - 600,
            "{ops}: queue 1 listed"
        );
        assert!(
            ix.by_queue.values().all(|l| l.loaded.is_empty()),
            "{ops}: the listing leaves no sizes behind"
        );
        ix.check();
    }
}

/// A xorshift generator: `rand(n)` is in `0..n`.
fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// Compaction's copy of `msg`, held by `queues`, to `at`: it is listed
/// again, out of order.
fn relocate(ix: &mut Index, msg: u64, queues: &[QueueId], at: Loc) {
    let moved = Record::Relocate {
        msg: MsgId(msg),
        queues: queues.into(),
        payload: &[],
    };
    ix.apply(&moved, at);
}

/// Asserts `live_by_queue` is what `iter_live` holds, per queue in id
/// order with payload sizes; returns the listing.
fn assert_listing_is_live(ix: &mut Index) -> BTreeMap<QueueId, Vec<RecoveredMessage>> {
    let mut want: BTreeMap<QueueId, Vec<RecoveredMessage>> = BTreeMap::new();
    for m in ix.iter_live() {
        for q in &m.queues {
            want.entry(*q).or_default().push(RecoveredMessage {
                msg: m.msg,
                payload_len: payload_len(m.loc.len, m.queues.len()),
            });
        }
    }
    for v in want.values_mut() {
        v.sort_unstable_by_key(|m| m.msg);
    }
    let got: BTreeMap<QueueId, Vec<RecoveredMessage>> = ix.live_by_queue(3).into_iter().collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (q, w) in &want {
        let g = &got[q];
        let first = g.iter().zip(w).position(|(a, b)| a != b);
        assert!(
            g.len() == w.len() && first.is_none(),
            "queue {q:?}: {} listed, {} live; first difference at {first:?}",
            g.len(),
            w.len()
        );
    }
    got
}

fn loc(seg: u32, offset: u32) -> Loc {
    Loc {
        seg,
        offset,
        len: 100,
    }
}

#[test]
fn message_lives_until_every_queue_removed_it() {
    let mut ix = Index::default();
    let qs = [QueueId(1), QueueId(2)];
    ix.apply(
        &Record::Publish {
            msg: MsgId(7),
            queues: Cow::Borrowed(&qs),
            payload: b"",
        },
        loc(1, 32),
    );
    assert_eq!(ix.seg_live(1).count, 1);
    ix.apply(
        &Record::Remove {
            queue: QueueId(1),
            msgs: Cow::Borrowed(&[MsgId(7)]),
        },
        loc(1, 200),
    );
    assert_eq!(ix.locate(QueueId(2), MsgId(7)), Some(loc(1, 32)));
    assert_eq!(ix.locate(QueueId(1), MsgId(7)), None);
    ix.check();
    ix.apply(&Record::Purge { queue: QueueId(2) }, loc(1, 300));
    assert_eq!(ix.live_messages(), 0);
    assert_eq!(ix.seg_live(1).count, 0);
    ix.check();
}

#[test]
fn queue_lists_stay_exact_under_random_operations() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("BERTH_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x1D3);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ix = Index::default();
    for step in 0..20_000u32 {
        let queue = QueueId(rng.random_range(0..6));
        let msg = MsgId(rng.random_range(0..300));
        let at = loc(rng.random_range(1..4), step);
        match rng.random_range(0..10) {
            0..=3 => {
                let mut qs = vec![queue];
                if rng.random_bool(0.4) {
                    qs.push(QueueId(rng.random_range(0..6)));
                }
                ix.apply(
                    &Record::Publish {
                        msg,
                        queues: Cow::Owned(qs),
                        payload: b"",
                    },
                    at,
                );
            }
            4..=7 => ix.apply(
                &Record::Remove {
                    queue,
                    msgs: Cow::Owned(vec![msg]),
                },
                at,
            ),
            8 => {
                let qs = ix.queues_of(msg);
                if !qs.is_empty() {
                    ix.apply(
                        &Record::Relocate {
                            msg,
                            queues: Cow::Owned(qs),
                            payload: b"",
                        },
                        at,
                    );
                }
            }
            _ => ix.apply(&Record::Purge { queue }, at),
        }
        if step % 97 == 0 {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ix.check()));
            assert!(result.is_ok(), "seed {seed} (BERTH_TEST_SEED), step {step}");
        }
    }
    ix.check();
}

/// A purge costs what the purged queue holds, not what the index holds:
/// the broker purges every paging queue at startup, and a deleted queue
/// is purged too, so a scan per purge made those quadratic.
#[test]
fn purge_visits_the_queue_not_the_whole_index() {
    let mut ix = Index::default();
    let big = 1_000_000u64;
    for m in 0..big {
        ix.apply(
            &Record::Publish {
                msg: MsgId(m),
                queues: Cow::Borrowed(&[QueueId(1)]),
                payload: b"",
            },
            loc(1, 32),
        );
    }
    for q in 0..1_000u64 {
        ix.apply(
            &Record::Publish {
                msg: MsgId(big + q),
                queues: Cow::Borrowed(&[QueueId(1_000 + q)]),
                payload: b"",
            },
            loc(2, 32),
        );
    }
    let started = std::time::Instant::now();
    for q in 0..1_000u64 {
        ix.apply(
            &Record::Purge {
                queue: QueueId(1_000 + q),
            },
            loc(2, 64),
        );
    }
    let took = started.elapsed();
    assert_eq!(ix.live_messages() as u64, big);
    assert_eq!(ix.seg_live(2).count, 0);
    // A scan of the million entries per purge takes seconds at least.
    assert!(
        took < std::time::Duration::from_millis(500),
        "1000 purges of one-message queues took {took:?} beside a million messages"
    );
}

/// Queues come and go over a broker's life (every transient reply
/// queue has an id of its own): the holder slots of emptied queues are
/// reused, so the slot table is as long as the queues holding messages
/// at once, not as the queues ever seen.
#[test]
fn holder_slots_of_emptied_queues_are_reused() {
    let mut ix = Index::default();
    for q in 0..10_000u64 {
        ix.apply(
            &Record::Publish {
                msg: MsgId(q),
                queues: Cow::Borrowed(&[QueueId(q), QueueId(1 << 40)]),
                payload: b"",
            },
            loc(1, 32),
        );
        let (gone, kept) = if q % 2 == 0 {
            (
                Record::Remove {
                    queue: QueueId(q),
                    msgs: Cow::Borrowed(&[MsgId(q)]),
                },
                QueueId(1 << 40),
            )
        } else {
            (Record::Purge { queue: QueueId(q) }, QueueId(1 << 40))
        };
        ix.apply(&gone, loc(1, 64));
        assert_eq!(ix.locate(kept, MsgId(q)), Some(loc(1, 32)));
        assert_eq!(ix.locate(QueueId(q), MsgId(q)), None);
    }
    ix.check();
    assert_eq!(ix.live_messages(), 10_000);
    assert!(
        ix.holders.len() <= 2,
        "{} holder slots for 1 listed queue",
        ix.holders.len()
    );
    ix.apply(
        &Record::Purge {
            queue: QueueId(1 << 40),
        },
        loc(1, 96),
    );
    ix.check();
    assert_eq!(ix.live_messages(), 0);
}

#[test]
fn relocate_moves_the_live_count() {
    let mut ix = Index::default();
    ix.apply(
        &Record::Publish {
            msg: MsgId(1),
            queues: Cow::Borrowed(&[QueueId(1)]),
            payload: b"",
        },
        loc(1, 32),
    );
    ix.apply(
        &Record::Relocate {
            msg: MsgId(1),
            queues: Cow::Borrowed(&[QueueId(1)]),
            payload: b"",
        },
        loc(3, 32),
    );
    assert_eq!(ix.seg_live(1).count, 0);
    assert_eq!(ix.seg_live(3).count, 1);
    ix.check();
}
