//! Recovery's own helpers (the decision tables are tested in
//! `decision/tests.rs`).
use super::*;

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
