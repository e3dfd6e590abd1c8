//! Streams in the store: appends kept by a sparse index, read from any
//! offset by scanning forward, trimmed in whole segments, and rebuilt the
//! same after a restart (from the checkpoint or by replay) and after a
//! crash; compaction never moves them.

mod common;

use berth_store::limits::STREAM_INDEX_STRIDE_RECORDS;
use berth_store::{MsgId, QueueId, Store};
use bytes::Bytes;
use common::{config, fresh, open, wait};

const STREAM: QueueId = QueueId(5);
const OTHER: QueueId = QueueId(6);

fn body(offset: u64) -> Bytes {
    Bytes::from(format!("entry {offset:06} {}", "x".repeat(200)))
}

/// Appends `offsets` to the stream, with a classic message to another
/// queue of the same group between every few, as real traffic interleaves.
fn fill(store: &Store, offsets: std::ops::Range<u64>) {
    for o in offsets {
        wait(|d| store.append(STREAM, o, body(o), Some(d))).expect("append");
        if o % 7 == 0 {
            let payload = Bytes::from(vec![1u8; 300]);
            wait(|d| store.publish(MsgId(1_000_000 + o), &[OTHER], payload, Some(d)))
                .expect("publish");
        }
    }
}

fn offsets_from(store: &Store, from: u64, n: usize) -> Vec<u64> {
    let got = store
        .read_stream(STREAM, from, n, usize::MAX)
        .expect("read");
    for (o, p) in &got {
        assert_eq!(p, &body(*o), "payload of offset {o}");
    }
    got.into_iter().map(|(o, _)| o).collect()
}

#[test]
fn a_stream_is_read_from_any_offset_through_a_sparse_index() {
    let cfg = config(1);
    let (_fs, store) = fresh(1, &cfg);
    let n = 2_000u64;
    fill(&store, 0..n);
    let st = &store.stats()[0];
    assert_eq!(
        st.live_messages,
        (0..n).filter(|o| o % 7 == 0).count() as u64
    );
    assert!(st.segments > 4, "{st:?}");
    assert!(
        st.stream_index_points <= n / STREAM_INDEX_STRIDE_RECORDS + st.segments,
        "{} points for {n} records in {} segments",
        st.stream_index_points,
        st.segments
    );
    for from in [0, 1, 127, 128, 129, 999, 1_500, n - 1] {
        assert_eq!(
            offsets_from(&store, from, 3),
            vec![from, from + 1, from + 2]
                .into_iter()
                .filter(|o| *o < n)
                .collect::<Vec<_>>(),
            "from {from}"
        );
    }
    // A long read crosses segments in order.
    assert_eq!(
        offsets_from(&store, 10, 1_000),
        (10..1_010).collect::<Vec<_>>()
    );
    assert!(offsets_from(&store, n, 10).is_empty());
    assert_eq!(store.stream_bounds(STREAM), Some((0, n)));
    // A byte bound ends a read early.
    let got = store.read_stream(STREAM, 0, 100, 1_000).expect("read");
    assert_eq!(got.len(), 5);
}

#[test]
fn a_trim_removes_the_head_and_its_segments_go() {
    let cfg = config(1);
    let (fs, store) = fresh(2, &cfg);
    fill(&store, 0..2_000);
    // The classic messages leave; only the stream keeps segments alive.
    let ids: Vec<MsgId> = (0..2_000u64)
        .filter(|o| o % 7 == 0)
        .map(|o| MsgId(1_000_000 + o))
        .collect();
    wait(|d| store.remove(OTHER, &ids, Some(d))).expect("remove");
    let before = store.stats()[0].segments;
    wait(|d| store.trim(STREAM, 1_500, Some(d))).expect("trim");
    assert_eq!(store.stream_bounds(STREAM), Some((1_500, 2_000)));
    assert_eq!(offsets_from(&store, 0, 2), vec![1_500, 1_501]);
    store.compact().expect("compact");
    store.checkpoint().expect("checkpoint");
    store.checkpoint().expect("checkpoint");
    let st = &store.stats()[0];
    assert!(
        st.segments_deleted > 0 && st.segments < before,
        "the trimmed head's segments are deleted: {before} before, {st:?}"
    );
    // Compaction left the stream's records where its index says.
    assert_eq!(offsets_from(&store, 1_600, 3), vec![1_600, 1_601, 1_602]);
    store.close().expect("close");
    let (store, rec) = open(&fs, &cfg);
    let rs = &rec.streams[&STREAM];
    assert_eq!((rs.first, rs.end, rs.messages), (1_500, 2_000, 500));
    assert_eq!(offsets_from(&store, 0, 2), vec![1_500, 1_501]);
}

#[test]
fn a_stream_comes_back_the_same_after_a_restart_and_a_crash() {
    let cfg = config(1);
    let (fs, store) = fresh(3, &cfg);
    fill(&store, 0..600);
    store.checkpoint().expect("checkpoint");
    // After the checkpoint: replayed, not loaded.
    fill(&store, 600..1_000);
    wait(|d| store.trim(STREAM, 100, Some(d))).expect("trim");
    let points = store.stats()[0].stream_index_points;
    store.close().expect("close");
    let (store, rec) = open(&fs, &cfg);
    let rs = &rec.streams[&STREAM];
    assert_eq!((rs.first, rs.end), (100, 1_000));
    assert_eq!(rs.marks[0], (100, 0));
    assert!(rs
        .marks
        .windows(2)
        .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    assert_eq!(store.stats()[0].stream_index_points, points);
    assert_eq!(offsets_from(&store, 999, 5), vec![999]);
    assert_eq!(offsets_from(&store, 0, 1), vec![100]);
    // A crash loses nothing that was completed (every append was waited for).
    fill(&store, 1_000..1_100);
    fs.crash();
    drop(store);
    fs.power_on();
    let (store, rec) = open(&fs, &cfg);
    assert_eq!(
        (rec.streams[&STREAM].first, rec.streams[&STREAM].end),
        (100, 1_100)
    );
    assert_eq!(
        offsets_from(&store, 1_050, 100),
        (1_050..1_100).collect::<Vec<_>>()
    );
    // A purge (queue.delete) removes the stream whole.
    wait(|d| store.purge(STREAM, Some(d))).expect("purge");
    assert_eq!(store.stream_bounds(STREAM), None);
    assert!(offsets_from(&store, 0, 1).is_empty());
}

/// A checkpoint delta that lists a stream's records at positions going
/// backwards (damage the fuzzer made up: `fuzz/corpus/checkpoint/
/// stream-positions-out-of-order`) is not used: recovery says it ignored
/// that file and takes the base and the journal after it instead, so
/// every appended record is read back at its offset.
#[test]
fn a_checkpoint_listing_stream_positions_backwards_is_ignored_and_nothing_is_lost() {
    let cfg = config(1);
    let (fs, store) = fresh(4, &cfg);
    fill(&store, 0..300);
    store.checkpoint().expect("checkpoint");
    // Only Appends since the base: the delta's ops are 29 bytes each.
    for o in 300..400 {
        wait(|d| store.append(STREAM, o, body(o), Some(d))).expect("append");
    }
    store.checkpoint().expect("checkpoint");
    fs.crash();
    drop(store);
    fs.power_on();
    let mut ckpts: Vec<String> = fs
        .names(&common::group_dir(0))
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    ckpts.sort();
    let newest = common::group_dir(0).join(ckpts.last().expect("checkpoints"));
    let mut bytes = fs.contents(&newest).expect("newest checkpoint");
    let body_end = bytes.len() - 4;
    // Header (72 bytes), op count, then `op u8 · queue u64 · offset u64 ·
    // seg u32 · pos u32 · len u32`: the second Append takes the first's
    // position.
    const FIRST: usize = 72 + 8;
    const OP: usize = 29;
    assert_eq!((bytes[FIRST], bytes[FIRST + OP]), (6, 6), "two Append ops");
    let pos = FIRST + 1 + 8 + 8 + 4;
    let first_pos = bytes[pos..pos + 4].to_vec();
    bytes[pos + OP..pos + OP + 4].copy_from_slice(&first_pos);
    let crc = crc32c::crc32c(&bytes[..body_end]);
    bytes[body_end..].copy_from_slice(&crc.to_le_bytes());
    fs.put_durable(&newest, &bytes).expect("write");

    let (store, rec) = open(&fs, &cfg);
    assert_eq!(rec.stats.checkpoints_ignored, vec![newest]);
    assert_eq!(store.stream_bounds(STREAM), Some((0, 400)));
    assert_eq!(offsets_from(&store, 0, 400), (0..400).collect::<Vec<_>>());
}
