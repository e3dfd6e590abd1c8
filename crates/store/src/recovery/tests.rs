//! Recovery's decision table, case by case.
use super::*;

const FRAMES: [Frame; 3] = [Frame::Intact, Frame::Corrupt, Frame::Short];
const BODIES: [Body; 2] = [Body::Parses, Body::Unparseable];
const ORDERS: [Order; 4] = [Order::Next, Order::Gap, Order::Behind, Order::Unnumbered];

#[test]
fn every_case_maps_to_exactly_one_action() {
    let mut n = 0;
    for frame in FRAMES {
        for body in BODIES {
            for order in ORDERS {
                for after_damage in [false, true] {
                    for valid_later in [false, true] {
                        for last_segment in [false, true] {
                            let c = RecordCase {
                                frame,
                                body,
                                order,
                                after_damage,
                                valid_later,
                                last_segment,
                            };
                            let matching =
                                RECORD_TABLE.iter().filter(|r| row_matches(r, &c)).count();
                            assert_eq!(matching, 1, "{c:?} matches {matching} rows");
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(n, 3 * 2 * 4 * 2 * 2 * 2);
    for header in [Header::Ok, Header::Torn, Header::Foreign] {
        for last_segment in [false, true] {
            for valid_records in [false, true] {
                let c = SegmentCase {
                    header,
                    last_segment,
                    valid_records,
                };
                let matching = SEGMENT_TABLE
                    .iter()
                    .filter(|r| {
                        r.header == header
                            && r.last_segment.is_none_or(|v| v == last_segment)
                            && r.valid_records.is_none_or(|v| v == valid_records)
                    })
                    .count();
                assert_eq!(matching, 1, "{c:?} matches {matching} rows");
            }
        }
    }
}

#[test]
fn hole_records_cover_any_range_within_the_body_limit() {
    let whole = RECORD_HEADER_BYTES + RECORD_BODY_BYTES_MAX as usize;
    for len in [
        RECORD_HEADER_BYTES,
        100,
        whole - 1,
        whole,
        whole + 1,
        whole + RECORD_HEADER_BYTES - 1,
        whole + RECORD_HEADER_BYTES,
        3 * whole + 7,
    ] {
        let holes = hole_records(len);
        let total: usize = holes
            .iter()
            .map(|&b| RECORD_HEADER_BYTES + b as usize)
            .sum();
        assert_eq!(total, len, "{len}: {holes:?}");
        assert!(
            holes.iter().all(|&b| b <= RECORD_BODY_BYTES_MAX),
            "{holes:?}"
        );
    }
}

#[test]
fn every_row_is_reachable() {
    // A row no case reaches is dead text that misleads the reader.
    for (i, row) in RECORD_TABLE.iter().enumerate() {
        let reached = FRAMES.iter().any(|&frame| {
            BODIES.iter().any(|&body| {
                ORDERS.iter().any(|&order| {
                    [false, true].iter().any(|&after_damage| {
                        [false, true].iter().any(|&valid_later| {
                            [false, true].iter().any(|&last_segment| {
                                row_matches(
                                    row,
                                    &RecordCase {
                                        frame,
                                        body,
                                        order,
                                        after_damage,
                                        valid_later,
                                        last_segment,
                                    },
                                )
                            })
                        })
                    })
                })
            })
        });
        assert!(reached, "row {i} ({}) unreachable", row.why);
    }
}
