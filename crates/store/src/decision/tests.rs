//! The decision tables, case by case: every observation has exactly one
//! action, and no row is dead text.
use super::*;

const FRAMES: [Frame; 4] = [Frame::Intact, Frame::Corrupt, Frame::Short, Frame::Zeros];
const BODIES: [Body; 2] = [Body::Parses, Body::Unparseable];
const ORDERS: [Order; 4] = [Order::Next, Order::Gap, Order::Behind, Order::Unnumbered];
const HEADERS: [Header; 4] = [Header::Ok, Header::Torn, Header::Foreign, Header::Missing];
const CHECKPOINTS: [CheckpointCase; 6] = [
    CheckpointCase::Valid,
    CheckpointCase::Damaged,
    CheckpointCase::OtherVersion,
    CheckpointCase::Unfinished,
    CheckpointCase::NoneJournalWhole,
    CheckpointCase::NoneJournalReclaimed,
];
const LAYOUTS: [LayoutCase; 3] = [
    LayoutCase::GroupDirPresent,
    LayoutCase::GroupDirMissing,
    LayoutCase::GroupCountOutOfRange,
];

fn record_cases() -> Vec<RecordCase> {
    let mut out = Vec::new();
    for frame in FRAMES {
        for body in BODIES {
            for order in ORDERS {
                for after_damage in [false, true] {
                    for valid_later in [false, true] {
                        for last_segment in [false, true] {
                            out.push(RecordCase {
                                frame,
                                body,
                                order,
                                after_damage,
                                valid_later,
                                last_segment,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

fn segment_cases() -> Vec<SegmentCase> {
    let mut out = Vec::new();
    for header in HEADERS {
        for last_segment in [false, true] {
            for valid_records in [false, true] {
                for before_replay in [false, true] {
                    out.push(SegmentCase {
                        header,
                        last_segment,
                        valid_records,
                        before_replay,
                    });
                }
            }
        }
    }
    out
}

#[test]
fn every_case_maps_to_exactly_one_action() {
    let records = record_cases();
    assert_eq!(records.len(), 4 * 2 * 4 * 2 * 2 * 2);
    for c in &records {
        let matching = RECORD_TABLE.iter().filter(|r| row_matches(r, c)).count();
        assert_eq!(matching, 1, "{c:?} matches {matching} rows");
    }
    let segments = segment_cases();
    assert_eq!(segments.len(), 4 * 2 * 2 * 2);
    for c in &segments {
        let matching = SEGMENT_TABLE
            .iter()
            .filter(|r| segment_row_matches(r, c))
            .count();
        assert_eq!(matching, 1, "{c:?} matches {matching} rows");
    }
    for c in CHECKPOINTS {
        let matching = CHECKPOINT_TABLE.iter().filter(|r| r.case == c).count();
        assert_eq!(matching, 1, "{c:?} matches {matching} rows");
    }
    for c in LAYOUTS {
        let matching = LAYOUT_TABLE.iter().filter(|r| r.case == c).count();
        assert_eq!(matching, 1, "{c:?} matches {matching} rows");
    }
}

#[test]
fn every_row_is_reachable() {
    // A row no case reaches is dead text that misleads the reader.
    let records = record_cases();
    for (i, row) in RECORD_TABLE.iter().enumerate() {
        let reached = records.iter().any(|c| row_matches(row, c));
        assert!(reached, "record row {i} ({}) unreachable", row.why);
    }
    let segments = segment_cases();
    for (i, row) in SEGMENT_TABLE.iter().enumerate() {
        let reached = segments.iter().any(|c| segment_row_matches(row, c));
        assert!(reached, "segment row {i} ({}) unreachable", row.why);
    }
    for (i, row) in CHECKPOINT_TABLE.iter().enumerate() {
        assert!(
            CHECKPOINTS.contains(&row.case),
            "checkpoint row {i} ({}) unreachable",
            row.why
        );
    }
    for (i, row) in LAYOUT_TABLE.iter().enumerate() {
        assert!(
            LAYOUTS.contains(&row.case),
            "layout row {i} ({}) unreachable",
            row.why
        );
    }
}

#[test]
fn inspection_reports_what_recovery_would_not_do_silently() {
    // Only what recovery uses as it is goes unmentioned; what it refuses,
    // sets aside or skips is a problem; what a crash or reclamation leaves
    // is a note.
    assert_eq!(Action::Apply.reported_as(), Reported::Silent);
    assert_eq!(Action::Note.reported_as(), Reported::Note);
    assert_eq!(Action::Truncate.reported_as(), Reported::Note);
    for a in [Action::Skip, Action::Quarantine, Action::Fail] {
        assert_eq!(a.reported_as(), Reported::Problem, "{a:?}");
    }
}
