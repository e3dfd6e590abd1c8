//! A checkpoint that lists a stream out of journal order is refused with
//! an error naming the file, where and what, never loaded (and never a
//! panic in the sparse index).

use std::path::Path;

use crate::checkpoint::{
    decode, encode, seal, CheckpointInfo, DeltaBuilder, ReplayFrom, CHECKPOINT_HEADER_BYTES,
};
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::record::Record;
use crate::stream_index::{Point, Span, StreamIndex};
use crate::QueueId;

const INFO: CheckpointInfo = CheckpointInfo {
    lsn: 9,
    replay: ReplayFrom {
        seg: 3,
        offset: 4096,
    },
};

fn at(seg: u32, offset: u32, len: u32) -> Loc {
    Loc { seg, offset, len }
}

/// A delta of these Appends (queue, offset, where), in this order.
fn delta(appends: &[(u64, u64, Loc)]) -> Vec<u8> {
    let mut d = DeltaBuilder::new(0);
    for &(q, offset, loc) in appends {
        let record = Record::Append {
            queue: QueueId(q),
            offset,
            payload: &[],
        };
        d.push(&record, loc);
    }
    d.encode(0, INFO, 1, 5)
}

/// The reason of a refusal, after checking it names `path`.
fn refused(result: Result<(CheckpointInfo, Index), StoreError>, path: &str) -> (u64, String) {
    match result {
        Err(StoreError::Corrupt {
            path: p,
            offset,
            reason,
        }) => {
            assert_eq!(p, Path::new(path));
            (offset, reason)
        }
        Err(e) => panic!("refused, but not as damage: {e}"),
        Ok((_, ix)) => panic!("accepted: {:?}", ix.streams().collect::<Vec<_>>()),
    }
}

/// The checkpoint fuzzer's find, fed the way the fuzz target feeds it
/// (`fuzz/fuzz_targets/checkpoint.rs`): the corpus file is libFuzzer's
/// raw input, to which the target appends a valid CRC32C before it
/// decodes. The raw file alone fails the checksum and never reaches the
/// stream ops, which is why a test of the file's bytes as they are did
/// not reproduce the panic. With the checksum it is a delta whose third
/// op appends to a stream at position 6 of a segment where the stream's
/// previous record ended at 202,116,108: before, `StreamIndex::append`
/// subtracted with overflow (a panic; then, saturating, a wrong index
/// and the delta refused only later for an unknown op).
#[test]
fn the_fuzzers_checkpoint_with_positions_out_of_order_is_refused() {
    let name = "fuzz/ckpt-00000000000000000001.ckpt";
    let corpus = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/corpus/checkpoint/stream-positions-out-of-order"
    );
    let mut bytes = std::fs::read(corpus).expect("the corpus file");
    let (_, why) = refused(decode(3, &bytes, Path::new(name)), name);
    assert_eq!(why, "checksum mismatch");
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let (offset, why) = refused(decode(3, &bytes, Path::new(name)), name);
    // Header, op count, two Appends of 29 bytes: the third op.
    assert_eq!(
        offset,
        (CHECKPOINT_HEADER_BYTES + 8 + 2 * 29) as u64,
        "{why}"
    );
    assert!(why.contains("positions go backwards"), "{why}");
    assert!(why.contains("position 6 of segment 101058054"), "{why}");
}

#[test]
fn a_delta_whose_stream_positions_go_backwards_is_refused() {
    // Journal order, another stream between: loads.
    let fine = delta(&[
        (5, 0, at(2, 100, 50)),
        (6, 0, at(2, 150, 50)),
        (5, 1, at(2, 200, 50)),
        (5, 2, at(3, 32, 50)),
    ]);
    let (_, ix) = decode(0, &fine, Path::new("d")).expect("a delta in journal order");
    ix.check();
    assert_eq!(ix.stream(QueueId(5)).unwrap().bounds(), Some((0, 3)));

    let first_op = (CHECKPOINT_HEADER_BYTES + 8) as u64;
    let backwards = delta(&[(5, 0, at(2, 100, 50)), (5, 1, at(2, 60, 50))]);
    let (offset, why) = refused(decode(0, &backwards, Path::new("d")), "d");
    assert_eq!(offset, first_op + 29);
    assert!(why.contains("stream 5, offset 1"), "{why}");
    assert!(why.contains("positions go backwards"), "{why}");

    // Overlapping the previous record is as wrong as going before it.
    let overlap = delta(&[(5, 0, at(2, 100, 50)), (5, 1, at(2, 149, 50))]);
    let (_, why) = refused(decode(0, &overlap, Path::new("d")), "d");
    assert!(why.contains("positions go backwards"), "{why}");

    let segments = delta(&[(5, 0, at(3, 100, 50)), (5, 1, at(2, 500, 50))]);
    let (_, why) = refused(decode(0, &segments, Path::new("d")), "d");
    assert!(why.contains("segments go backwards"), "{why}");

    let too_long = delta(&[(5, 0, at(2, u32::MAX - 10, 50))]);
    let (_, why) = refused(decode(0, &too_long, Path::new("d")), "d");
    assert!(why.contains("does not fit a segment"), "{why}");
}

/// A base whose one stream has `span` after a well-formed first span.
fn base_with(span: Span) -> Vec<u8> {
    let mut st = StreamIndex::default();
    st.push_span(Span {
        seg: 2,
        last: 9,
        end: 1_000,
        count: 10,
        bytes: 900,
        points: vec![Point {
            offset: 0,
            pos: 100,
        }],
    });
    st.push_span(span);
    let mut ix = Index::default();
    ix.load_stream(QueueId(5), st);
    encode(0, INFO, &ix)
}

#[test]
fn a_base_whose_stream_spans_are_out_of_order_is_refused() {
    let good = Span {
        seg: 3,
        last: 20,
        end: 2_000,
        count: 11,
        bytes: 990,
        points: vec![
            Point {
                offset: 10,
                pos: 32,
            },
            Point {
                offset: 15,
                pos: 600,
            },
        ],
    };
    let (_, ix) = decode(0, &base_with(good.clone()), Path::new("b")).expect("in order");
    ix.check();

    type Damage = fn(&mut Span);
    let cases: [(&str, Damage); 6] = [
        ("segments go backwards", |s| s.seg = 2),
        ("below the previous span's newest offset", |s| {
            s.points[0].offset = 8
        }),
        ("index points out of order", |s| s.points[1].pos = 20),
        ("index points out of order", |s| s.points[1].offset = 10),
        ("past its newest record", |s| s.end = 600),
        ("does not fit a segment", |s| s.count = 5_000),
    ];
    for (expected, damage) in cases {
        let mut span = good.clone();
        damage(&mut span);
        let (offset, why) = refused(decode(0, &base_with(span), Path::new("b")), "b");
        assert!(why.contains(expected), "{expected}: {why}");
        assert!(why.starts_with("stream 5: "), "{why}");
        assert!(offset > CHECKPOINT_HEADER_BYTES as u64, "{offset}");
    }
}

/// Two entries for one stream would count its spans live twice (a
/// segment never reclaimed).
#[test]
fn a_base_listing_a_stream_twice_is_refused() {
    let mut st = StreamIndex::default();
    st.append(0, at(2, 100, 50));
    let mut ix = Index::default();
    ix.load_stream(QueueId(5), st);
    let bytes = encode(0, INFO, &ix);
    // Header, empty metadata and runs, then the stream section.
    let section = CHECKPOINT_HEADER_BYTES + 8 + 8;
    let mut body = bytes[..bytes.len() - 4].to_vec();
    let entry = body[section + 8..].to_vec();
    body[section..section + 8].copy_from_slice(&2u64.to_le_bytes());
    body.extend_from_slice(&entry);
    let (offset, why) = refused(decode(0, &seal(body), Path::new("b")), "b");
    assert_eq!(why, "stream 5 listed twice");
    assert_eq!(offset, (section + 8 + entry.len()) as u64);
}
