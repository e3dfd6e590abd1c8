use super::*;
use crate::record::Record;
use std::borrow::Cow;

#[test]
fn checkpoint_roundtrips_and_rejects_any_flip() {
    let mut ix = Index::default();
    ix.apply(
        &Record::MetaPut {
            key: b"k",
            value: b"v",
        },
        Loc {
            seg: 1,
            offset: 32,
            len: 30,
        },
    );
    ix.apply(
        &Record::Publish {
            msg: MsgId(5),
            queues: Cow::Borrowed(&[QueueId(1), QueueId(2)]),
            payload: b"x",
        },
        Loc {
            seg: 1,
            offset: 62,
            len: 49,
        },
    );
    let info = CheckpointInfo {
        lsn: 2,
        replay: ReplayFrom {
            seg: 1,
            offset: 111,
        },
    };
    let bytes = encode(0, info, &ix);
    assert_eq!(&bytes[..8], b"BERTHCKP");
    let (i2, ix2) = decode(0, &bytes, Path::new("c")).unwrap();
    assert_eq!(i2, info);
    assert_eq!(ix2.meta, ix.meta);
    assert_eq!(
        ix2.iter_live().collect::<Vec<_>>(),
        ix.iter_live().collect::<Vec<_>>()
    );
    assert_eq!(ix2.msg_id_hw, 5);
    for at in 0..bytes.len() {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        assert!(
            decode(0, &b, Path::new("c")).is_err(),
            "flip at {at} accepted"
        );
    }
}

/// The version-1 encoding (one entry per message), as berth wrote it
/// before chains: pins that such files still load.
fn encode_v1(group: u32, info: CheckpointInfo, index: &Index) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_FORMAT_VERSION_V1.to_le_bytes());
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&info.lsn.to_le_bytes());
    out.extend_from_slice(&u64::from(info.replay.seg).to_le_bytes());
    out.extend_from_slice(&info.replay.offset.to_le_bytes());
    out.extend_from_slice(&index.msg_id_hw.to_le_bytes());
    out.extend_from_slice(&(index.meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&(index.live_messages() as u64).to_le_bytes());
    for (k, v) in &index.meta {
        put_len(&mut out, k.len());
        put_len(&mut out, v.len());
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    let mut live: Vec<_> = index.iter_live().collect();
    live.sort_by_key(|m| m.msg);
    for m in live {
        out.extend_from_slice(&m.msg.0.to_le_bytes());
        out.extend_from_slice(&m.loc.seg.to_le_bytes());
        out.extend_from_slice(&m.loc.offset.to_le_bytes());
        out.extend_from_slice(&m.loc.len.to_le_bytes());
        put_len(&mut out, m.queues.len());
        for q in &m.queues {
            out.extend_from_slice(&q.0.to_le_bytes());
        }
    }
    seal(out)
}

/// A version-1 checkpoint of messages 1 and 2 (one queue each) with
/// `patch` applied to its bytes and its checksum made valid again.
fn patched_checkpoint(patch: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut ix = Index::default();
    for (msg, offset) in [(1, 32), (2, 96)] {
        let loc = Loc {
            seg: 1,
            offset,
            len: 64,
        };
        ix.insert(MsgId(msg), &[QueueId(7)], loc);
    }
    let info = CheckpointInfo {
        lsn: 2,
        replay: ReplayFrom {
            seg: 1,
            offset: 160,
        },
    };
    let mut bytes = encode_v1(0, info, &ix);
    bytes.truncate(bytes.len() - 4);
    patch(&mut bytes);
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// Found by the fuzzer (fuzz/fuzz_targets/checkpoint.rs): a message
/// listed twice left the index's live counts out of step with its
/// entries (a segment that never gets reclaimed, an assert in
/// `Index::check`).
#[test]
fn a_message_listed_twice_is_refused() {
    // Entries are `msg u64 | seg u32 | offset u32 | len u32 | n u32 | queue u64`.
    const ENTRY: usize = 8 + 4 + 4 + 4 + 4 + 8;
    let bytes = patched_checkpoint(|b| {
        let second = CHECKPOINT_V1_HEADER_BYTES + ENTRY;
        let first_id = b[CHECKPOINT_V1_HEADER_BYTES..CHECKPOINT_V1_HEADER_BYTES + 8].to_vec();
        b[second..second + 8].copy_from_slice(&first_id);
    });
    let Err(e) = decode(0, &bytes, Path::new("c")) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("twice"), "{e}");
}

/// Queue id `u64::MAX` is the index's marker for "several queues": a
/// checkpoint naming it as a queue is refused, not loaded into an index
/// that would panic on the message's first ack.
#[test]
fn the_reserved_queue_id_is_refused() {
    let bytes = patched_checkpoint(|b| {
        let queue = CHECKPOINT_V1_HEADER_BYTES + 8 + 4 + 4 + 4 + 4;
        b[queue..queue + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    });
    let Err(e) = decode(0, &bytes, Path::new("c")) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("reserved"), "{e}");
}

#[test]
fn a_message_without_queues_is_refused() {
    let bytes = patched_checkpoint(|b| {
        // The second entry claims no queue and loses its queue id.
        let n = CHECKPOINT_V1_HEADER_BYTES + 2 * (8 + 4 + 4 + 4 + 4 + 8) - 12;
        b[n..n + 4].copy_from_slice(&0u32.to_le_bytes());
        b.truncate(n + 4);
    });
    let Err(e) = decode(0, &bytes, Path::new("c")) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("no queue"), "{e}");
}

/// The index of the golden examples: metadata `k` = `vv`, message 5
/// in segment 3 at offset 59 (49 bytes) held by queues 1 and 2.
fn golden_index() -> (CheckpointInfo, Index) {
    let mut ix = Index::default();
    ix.apply(
        &Record::MetaPut {
            key: b"k",
            value: b"vv",
        },
        Loc {
            seg: 3,
            offset: 32,
            len: 27,
        },
    );
    ix.apply(
        &Record::Publish {
            msg: MsgId(5),
            queues: Cow::Borrowed(&[QueueId(1), QueueId(2)]),
            payload: b"x",
        },
        Loc {
            seg: 3,
            offset: 59,
            len: 49,
        },
    );
    let info = CheckpointInfo {
        lsn: 9,
        replay: ReplayFrom {
            seg: 3,
            offset: 108,
        },
    };
    (info, ix)
}

/// Version 1, as written before chains (FORMAT.md's old example):
/// still read, to the same index.
#[test]
fn golden_bytes_checkpoint_v1_still_reads() {
    let (info, ix) = golden_index();
    #[rustfmt::skip]
    let expected: &[u8] = &[
        b'B', b'E', b'R', b'T', b'H', b'C', b'K', b'P', // magic
        1, 0, 0, 0,                   // format_version
        2, 0, 0, 0,                   // group
        9, 0, 0, 0, 0, 0, 0, 0,       // lsn
        3, 0, 0, 0, 0, 0, 0, 0,       // replay_seg
        108, 0, 0, 0, 0, 0, 0, 0,     // replay_offset
        5, 0, 0, 0, 0, 0, 0, 0,       // msg_id_hw
        1, 0, 0, 0, 0, 0, 0, 0,       // meta_count
        1, 0, 0, 0, 0, 0, 0, 0,       // msg_count
        1, 0, 0, 0,  2, 0, 0, 0,      // key_len, value_len
        b'k', b'v', b'v',             // key, value
        5, 0, 0, 0, 0, 0, 0, 0,       // msg
        3, 0, 0, 0,                   // seg
        59, 0, 0, 0,                  // offset
        49, 0, 0, 0,                  // rec_len
        2, 0, 0, 0,                   // queue_count
        1, 0, 0, 0, 0, 0, 0, 0,       // queue
        2, 0, 0, 0, 0, 0, 0, 0,       // queue
        0x83, 0x54, 0x51, 0xd0,       // crc32c over all of the above
    ];
    assert_eq!(encode_v1(2, info, &ix), expected);
    let (i2, ix2) = decode(2, expected, Path::new("c")).unwrap();
    assert_eq!(i2, info);
    assert_eq!(ix2.meta, ix.meta);
    assert_eq!(
        ix2.iter_live().collect::<Vec<_>>(),
        ix.iter_live().collect::<Vec<_>>()
    );
    assert_eq!(ix2.msg_id_hw, 5);
}

/// Magic and format version of the golden bases.
fn golden_head(version: u8) -> Vec<u8> {
    [&b"BERTHCKP"[..], &[version, 0, 0, 0]].concat()
}

/// The golden bases' bytes after the format version, up to the end
/// of version 2's body ([`golden_index`]); version 3 adds its stream
/// section after them.
#[rustfmt::skip]
const GOLDEN_BODY_V2: &[u8] = &[
    2, 0, 0, 0,               // group
    9, 0, 0, 0, 0, 0, 0, 0,       // lsn
    3, 0, 0, 0, 0, 0, 0, 0,       // replay_seg
    108, 0, 0, 0, 0, 0, 0, 0,     // replay_offset
    5, 0, 0, 0, 0, 0, 0, 0,       // msg_id_hw
    1, 0, 0, 0,  0, 0, 0, 0,      // kind (base), reserved
    0, 0, 0, 0, 0, 0, 0, 0,       // parent_no
    0, 0, 0, 0, 0, 0, 0, 0,       // parent_lsn
    1, 0, 0, 0, 0, 0, 0, 0,       // meta_count
    1, 0, 0, 0,  2, 0, 0, 0,      // key_len, value_len
    b'k', b'v', b'v',         // key, value
    1, 0, 0, 0, 0, 0, 0, 0,       // run_count
    2, 0, 0, 0,  1, 0, 0, 0,      // queue_count, msg_count
    1, 0, 0, 0, 0, 0, 0, 0,       // queue
    2, 0, 0, 0, 0, 0, 0, 0,       // queue
    5, 0, 0, 0, 0, 0, 0, 0,       // msg
    3, 0, 0, 0,  59, 0, 0, 0,     // seg, offset
    49, 0, 0, 0,              // rec_len
];

/// Version 3 base (FORMAT.md's example): version 2's index plus one
/// stream. Its checksum was computed independently of the crate (a
/// bitwise CRC32C in Python).
#[test]
fn golden_bytes_checkpoint() {
    let (info, mut ix) = golden_index();
    ix.apply(
        &Record::Append {
            queue: QueueId(4),
            offset: 7,
            payload: &[],
        },
        Loc {
            seg: 3,
            offset: 160,
            len: 40,
        },
    );
    #[rustfmt::skip]
    let tail: &[u8] = &[
        1, 0, 0, 0, 0, 0, 0, 0,       // stream_count
        4, 0, 0, 0, 0, 0, 0, 0,       // queue
        0, 0, 0, 0, 0, 0, 0, 0,       // trimmed_below
        1, 0, 0, 0,                   // span_count
        3, 0, 0, 0,                   // seg
        7, 0, 0, 0, 0, 0, 0, 0,       // last
        200, 0, 0, 0,                 // end
        1, 0, 0, 0, 0, 0, 0, 0,       // count
        40, 0, 0, 0, 0, 0, 0, 0,      // bytes
        1, 0, 0, 0,                   // point_count
        7, 0, 0, 0, 0, 0, 0, 0,       // point: offset
        160, 0, 0, 0,                 // point: pos
        0xd4, 0x54, 0x97, 0xae,       // crc32c over all of the above
    ];
    let expected = &[&golden_head(3)[..], GOLDEN_BODY_V2, tail].concat()[..];
    assert_eq!(expected.len(), 223);
    let bytes = encode(2, info, &ix);
    assert_eq!(&bytes[..], expected);
    let (i2, ix2) = decode(2, &bytes, Path::new("c")).unwrap();
    assert_eq!(i2, info);
    assert_eq!(ix2.meta, ix.meta);
    assert_eq!(ix2.stream(QueueId(4)), ix.stream(QueueId(4)));
    assert_eq!(ix2.seg_live(3), ix.seg_live(3));
    ix2.check();
}

/// Version 2 base (written before streams' sections): still read. Its
/// checksum was computed independently of the crate (a bitwise CRC32C
/// in Python).
#[test]
fn golden_bytes_checkpoint_v2_still_reads() {
    let (info, ix) = golden_index();
    #[rustfmt::skip]
    let crc: &[u8] = &[
        0x1e, 0x19, 0x96, 0xf2,       // crc32c over all of the above
    ];
    let expected = &[&golden_head(2)[..], GOLDEN_BODY_V2, crc].concat()[..];
    assert_eq!(expected.len(), 147);
    let (i2, ix2) = decode(2, expected, Path::new("c")).unwrap();
    assert_eq!(i2, info);
    assert_eq!(ix2.meta, ix.meta);
    assert_eq!(
        ix2.iter_live().collect::<Vec<_>>(),
        ix.iter_live().collect::<Vec<_>>()
    );
}

/// A base plus deltas loads to the index the records give, whatever
/// the records; and a delta names its parent.
#[test]
fn a_chain_loads_to_the_index_its_records_give() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("BERTH_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xC4A1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Index::default();
    let info = |lsn| CheckpointInfo {
        lsn,
        replay: ReplayFrom { seg: 1, offset: 32 },
    };
    let mut chain = vec![encode(0, info(0), &model)];
    let mut lsn = 0;
    let mut next_offset = [0u64; 5];
    for link in 1..30u64 {
        let mut delta = DeltaBuilder::new(0);
        for _ in 0..200 {
            lsn += 1;
            let q = QueueId(rng.random_range(0..5));
            let m = MsgId(rng.random_range(1..400));
            // In journal order, as a delta's records always are: a
            // new segment every 300 records.
            let at = Loc {
                seg: 1 + u32::try_from(lsn / 300).unwrap(),
                offset: 32 + u32::try_from(lsn % 300).unwrap() * 64,
                len: 64,
            };
            let qs = [q, QueueId(rng.random_range(0..5))];
            let r = match rng.random_range(0..13) {
                10 | 11 => {
                    let o = &mut next_offset[q.0 as usize];
                    *o += rng.random_range(1..3);
                    Record::Append {
                        queue: q,
                        offset: *o,
                        payload: b"",
                    }
                }
                12 => Record::Trim {
                    queue: q,
                    below: next_offset[q.0 as usize].saturating_sub(rng.random_range(0..20)),
                },
                0..=3 => Record::Publish {
                    msg: m,
                    queues: Cow::Borrowed(&qs[..rng.random_range(1..=2)]),
                    payload: b"",
                },
                4 => Record::Relocate {
                    msg: m,
                    queues: Cow::Borrowed(&qs[..1]),
                    payload: b"",
                },
                5..=7 => Record::Remove {
                    queue: q,
                    msgs: Cow::Owned(vec![m, MsgId(m.0 + 1)]),
                },
                8 => Record::Purge { queue: q },
                _ => Record::MetaPut {
                    key: b"k",
                    value: b"v",
                },
            };
            model.apply(&r, at);
            delta.push(&r, at);
        }
        chain.push(delta.encode(0, info(lsn), link - 1, lsn - 200));
    }
    let mut index = Index::default();
    for (i, bytes) in chain.into_iter().enumerate() {
        let p = parse(0, bytes, Path::new("c")).unwrap();
        if i == 0 {
            assert_eq!(p.kind, Kind::Base);
            index = p.load_base().unwrap();
        } else {
            assert!(matches!(p.kind, Kind::Delta { parent_no, .. } if parent_no == i as u64 - 1));
            p.apply_delta(&mut index).unwrap();
        }
        index.check();
    }
    let sorted = |ix: &Index| {
        let mut v: Vec<_> = ix.iter_live().collect();
        v.sort_by_key(|m| m.msg);
        v
    };
    assert_eq!(sorted(&index), sorted(&model), "seed {seed}");
    assert_eq!(index.meta, model.meta);
    let streams = |ix: &Index| {
        ix.streams()
            .map(|(q, s)| (q, s.clone()))
            .collect::<Vec<_>>()
    };
    assert!(model.stream_points() > 0, "the chain holds streams");
    assert_eq!(streams(&index), streams(&model), "seed {seed}");
    let rebased = decode(0, &encode(0, info(lsn), &index), Path::new("c"))
        .unwrap()
        .1;
    assert_eq!(sorted(&rebased), sorted(&model), "seed {seed}");
    assert_eq!(streams(&rebased), streams(&model), "seed {seed}");
    rebased.check();
}

#[test]
fn names_roundtrip() {
    assert_eq!(parse_checkpoint_name(&checkpoint_name(77)), Some(77));
    assert_eq!(parse_checkpoint_name("ckpt.tmp"), None);
}

/// Found by the fuzzer in CI (fuzz/corpus/checkpoint/queue-list-live-counts,
/// fed as the target feeds it: with its CRC32C appended). Its second run
/// lists a queue and no messages; loading it made the queue's list with
/// nothing live, which `Index::check` caught ("queue list live counts").
/// The encoder writes no empty run, so the decoder refuses one.
#[test]
fn the_fuzzers_checkpoint_with_an_empty_run_is_refused() {
    let corpus = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/corpus/checkpoint/queue-list-live-counts"
    );
    let mut bytes = std::fs::read(corpus).expect("the corpus file");
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let Err(e) = decode(3, &bytes, Path::new("c")) else {
        panic!("accepted");
    };
    assert!(e.to_string().contains("a run with no messages"), "{e}");
}
