//! A stream's sparse index: where its Append records are, kept per
//! segment as a span with one point every [`STREAM_INDEX_STRIDE_RECORDS`]
//! records (or [`STREAM_INDEX_STRIDE_BYTES`]), never one entry per record.
//! A read from any offset starts at the point at or before it and scans
//! the segment forward (`Store::read_stream`); a stream of any length
//! costs memory in proportion to its segments and points, not its
//! messages (docs/STREAMS.md, "Cost").
//!
//! Invariants:
//! - [`StreamIndex::append`] and [`StreamIndex::trim`] are pure functions
//!   of the record and its location, so replaying a journal (or loading a
//!   checkpoint that lists spans and points verbatim, then replaying the
//!   rest) rebuilds exactly the writer's state.
//! - Spans are in journal order; offsets grow along them (the broker takes
//!   a stream's offsets under its lock, with the write). An Append whose
//!   offset is not above the last one is counted (its segment stays live)
//!   but gets no point: it is never found by a read.
//! - Every span has at least one point, and its first point is its first
//!   record (a trim takes whole spans only), so a read from any kept
//!   offset has a point at or before it in its span.
//! - Positions grow along the journal: a span's records and points lie in
//!   ascending positions, later spans in later segments. The journal gives
//!   records in that order; a checkpoint lists spans and Append ops that a
//!   loader checks against it first ([`StreamIndex::misplaced`],
//!   [`StreamIndex::span_misplaced`]; `checkpoint/streams.rs`), and
//!   [`StreamIndex::check`] asserts it.
//! - A span's `count` and `bytes` are what `Index::seg_live` counts for the
//!   stream in that segment: all its records until the whole span goes.

use std::collections::VecDeque;

use crate::limits::{STREAM_INDEX_STRIDE_BYTES, STREAM_INDEX_STRIDE_RECORDS};
use crate::loc::Loc;

/// A place a read can start: the record of `offset` at byte `pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub offset: u64,
    pub pos: u32,
}

/// A stream's records in one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub seg: u32,
    /// Offset of the newest record.
    pub last: u64,
    /// Byte just past the newest record (a read of this span stops there).
    pub end: u32,
    /// Records and record bytes (the segment's live count for them).
    pub count: u64,
    pub bytes: u64,
    /// Ascending by offset and position; the first is the span's first record.
    pub points: Vec<Point>,
}

impl Span {
    fn first(&self) -> u64 {
        self.points.first().map_or(self.last, |p| p.offset)
    }
}

/// Where a read of a stream starts, and the spans it may go on through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// Segment, start position, end position of each span to read, in order.
    pub ranges: Vec<(u32, u32, u32)>,
}

/// One stream's sparse index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamIndex {
    /// Offsets below this were trimmed (0 if never).
    pub trimmed_below: u64,
    spans: VecDeque<Span>,
}

impl StreamIndex {
    /// An index with no span, trimmed below `below` (a checkpoint's).
    pub fn trimmed_at(below: u64) -> Self {
        Self {
            trimmed_below: below,
            spans: VecDeque::new(),
        }
    }

    /// Applies an Append of `offset` found at `loc`.
    pub fn append(&mut self, offset: u64, loc: Loc) {
        let end = loc.offset.saturating_add(loc.len);
        let grows = self.spans.back().is_none_or(|s| offset > s.last);
        match self.spans.back_mut() {
            Some(s) if s.seg == loc.seg => {
                s.count += 1;
                s.bytes += u64::from(loc.len);
                if !grows {
                    return;
                }
                let p = *s.points.last().expect("a span has a point");
                // The journal gives positions in order, and a checkpoint
                // that lists them out of order is refused before it gets
                // here ([`StreamIndex::misplaced`]); saturating all the
                // same, so a path that forgot to check gets a wrong point,
                // not a panic, in a release build.
                debug_assert!(
                    loc.offset >= s.end,
                    "append at {} before its span's end {}",
                    loc.offset,
                    s.end
                );
                if offset.saturating_sub(p.offset) >= STREAM_INDEX_STRIDE_RECORDS
                    || loc.offset.saturating_sub(p.pos) >= STREAM_INDEX_STRIDE_BYTES
                {
                    s.points.push(Point {
                        offset,
                        pos: loc.offset,
                    });
                }
                s.last = offset;
                s.end = end;
            }
            _ => {
                let last = if grows {
                    offset
                } else {
                    self.spans.back().map_or(offset, |s| s.last)
                };
                self.spans.push_back(Span {
                    seg: loc.seg,
                    last,
                    end,
                    count: 1,
                    bytes: u64::from(loc.len),
                    points: vec![Point {
                        offset: if grows { offset } else { last },
                        pos: loc.offset,
                    }],
                });
            }
        }
    }

    /// Why an Append of this stream at `loc` cannot come next in journal
    /// order (`None` if it can): a checkpoint's delta that lists one is
    /// damaged, and is refused before [`StreamIndex::append`] sees it.
    pub fn misplaced(&self, loc: Loc) -> Option<String> {
        let back = self.spans.back().filter(|s| s.seg >= loc.seg);
        if let Some(s) = back.filter(|s| s.seg > loc.seg) {
            return Some(format!(
                "an Append in segment {} after the stream's records in segment {}: segments go backwards",
                loc.seg, s.seg
            ));
        }
        if let Some(s) = back.filter(|s| loc.offset < s.end) {
            return Some(format!(
                "an Append at position {} of segment {} before the end ({}) of the stream's records there: positions go backwards",
                loc.offset, loc.seg, s.end
            ));
        }
        let held = back.map_or(0, |s| s.bytes);
        if loc.len == 0
            || loc.offset.checked_add(loc.len).is_none()
            || held + u64::from(loc.len) > u64::from(u32::MAX)
        {
            return Some(format!(
                "an Append of {} bytes at position {} of segment {} does not fit a segment",
                loc.len, loc.offset, loc.seg
            ));
        }
        None
    }

    /// Why `span` cannot follow `prev` (the stream's span before it, if
    /// any) in an index that appends built (`None` if it can): a
    /// checkpoint's base that lists such a span is damaged.
    pub fn span_misplaced(prev: Option<&Span>, span: &Span) -> Option<String> {
        let seg = span.seg;
        let (Some(first), Some(newest)) = (span.points.first(), span.points.last()) else {
            return Some(format!("a span in segment {seg} without an index point"));
        };
        if span.bytes > u64::from(u32::MAX) || span.count > span.bytes {
            return Some(format!(
                "a span in segment {seg} of {} records and {} bytes does not fit a segment",
                span.count, span.bytes
            ));
        }
        if span.count < span.points.len() as u64 {
            return Some(format!(
                "a span in segment {seg} has {} index points for {} records",
                span.points.len(),
                span.count
            ));
        }
        if !span
            .points
            .windows(2)
            .all(|w| w[0].offset < w[1].offset && w[0].pos < w[1].pos)
        {
            return Some(format!(
                "a span in segment {seg} has index points out of order"
            ));
        }
        if newest.offset > span.last || newest.pos >= span.end {
            return Some(format!(
                "a span in segment {seg} has an index point (offset {}, position {}) past its newest record (offset {}, end {})",
                newest.offset, newest.pos, span.last, span.end
            ));
        }
        match prev {
            Some(p) if p.seg >= seg => Some(format!(
                "a span in segment {seg} after one in segment {}: segments go backwards",
                p.seg
            )),
            Some(p) if first.offset < p.last => Some(format!(
                "a span in segment {seg} starts at offset {} below the previous span's newest offset {}",
                first.offset, p.last
            )),
            _ => None,
        }
    }

    /// Asserts what appends and trims keep true of every span (tests and
    /// the checkpoint fuzzer, through `Index::check`).
    pub fn check(&self) {
        let mut prev = None;
        for s in &self.spans {
            if let Some(why) = Self::span_misplaced(prev, s) {
                panic!("{why}");
            }
            prev = Some(s);
        }
    }

    /// Applies a Trim below `below`: returns the spans that left whole
    /// (their segments' live counts drop by them).
    pub fn trim(&mut self, below: u64) -> Vec<Span> {
        self.trimmed_below = self.trimmed_below.max(below);
        let mut gone = Vec::new();
        while self.spans.front().is_some_and(|s| s.last < below) {
            gone.push(self.spans.pop_front().expect("checked"));
        }
        // A span partly below the trim keeps its points (a read starts at
        // the trim point anyway): its first point stays its first record,
        // which the estimate of what it keeps needs.
        gone
    }

    /// Takes out the spans in segment `seg` (its file is gone).
    pub fn drop_segment(&mut self, seg: u32) -> Vec<Span> {
        let (gone, kept): (Vec<Span>, Vec<Span>) = self.spans.drain(..).partition(|s| s.seg == seg);
        self.spans = kept.into();
        gone
    }

    /// Every span (a purge gives them all back).
    pub fn spans(&self) -> impl ExactSizeIterator<Item = &Span> {
        self.spans.iter()
    }

    /// A span loaded from a checkpoint, after the ones already loaded.
    pub fn push_span(&mut self, span: Span) {
        self.spans.push_back(span);
    }

    /// Whether any record of this stream is in segment `seg`.
    pub fn in_segment(&self, seg: u32) -> bool {
        self.spans.iter().any(|s| s.seg == seg)
    }

    /// The first offset kept (trim point or first record), and the offset
    /// after the newest record; `None` when no record is kept.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let first = self.spans.front()?.first().max(self.trimmed_below);
        let last = self.spans.back()?.last;
        (last >= first).then_some((first, last + 1))
    }

    /// Records and bytes kept (whole spans: a span partly below the trim
    /// point counts whole until it goes).
    pub fn totals(&self) -> (u64, u64) {
        self.spans
            .iter()
            .fold((0, 0), |(c, b), s| (c + s.count, b + s.bytes))
    }

    /// Index points held (what this stream costs in memory, with its spans).
    pub fn point_count(&self) -> usize {
        self.spans.iter().map(|s| s.points.len()).sum()
    }

    /// Where to read from to find `from` (or the first offset after it):
    /// the point at or before it in the span that holds it, then up to
    /// `spans_max` spans in all.
    pub fn plan(&self, from: u64, spans_max: usize) -> ReadPlan {
        let from = from.max(self.trimmed_below);
        let i = self.spans.partition_point(|s| s.last < from);
        let mut ranges = Vec::new();
        for (k, s) in self.spans.iter().enumerate().skip(i).take(spans_max) {
            let start = if k == i {
                let j = s.points.partition_point(|p| p.offset <= from);
                s.points[j.saturating_sub(1)].pos
            } else {
                s.points[0].pos
            };
            ranges.push((s.seg, start, s.end));
        }
        ReadPlan { ranges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seg: u32, offset: u32, len: u32) -> Loc {
        Loc { seg, offset, len }
    }

    #[test]
    fn a_stream_of_many_records_keeps_one_point_per_stride() {
        let mut s = StreamIndex::default();
        let n = 100 * STREAM_INDEX_STRIDE_RECORDS;
        for o in 0..n {
            s.append(o, at(1, 32 + u32::try_from(o).unwrap() * 40, 40));
        }
        assert_eq!(s.point_count() as u64, n / STREAM_INDEX_STRIDE_RECORDS);
        assert_eq!(s.bounds(), Some((0, n)));
        assert_eq!(s.totals(), (n, n * 40));
        // A read of offset 200 starts at the point for 128.
        let plan = s.plan(200, 4);
        assert_eq!(plan.ranges, vec![(1, 32 + 128 * 40, 32 + n as u32 * 40)]);
    }

    #[test]
    fn large_records_get_a_point_every_stride_of_bytes() {
        let mut s = StreamIndex::default();
        for o in 0..10u32 {
            s.append(
                u64::from(o),
                at(1, 32 + o * STREAM_INDEX_STRIDE_BYTES, 1000),
            );
        }
        assert_eq!(s.point_count(), 10);
    }

    #[test]
    fn a_trim_drops_whole_spans_and_keeps_a_point_to_start_from() {
        let mut s = StreamIndex::default();
        for o in 0..300u64 {
            let seg = 1 + u32::try_from(o / 100).unwrap();
            s.append(o, at(seg, 32 + u32::try_from(o % 100).unwrap() * 10, 10));
        }
        assert_eq!(s.spans().len(), 3);
        let gone = s.trim(150);
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].seg, gone[0].count), (1, 100));
        assert_eq!(s.bounds(), Some((150, 300)));
        let plan = s.plan(0, 8);
        assert_eq!(plan.ranges[0], (2, 32, 32 + 100 * 10));
        assert_eq!(plan.ranges.len(), 2);
        assert!(s.in_segment(2) && !s.in_segment(1));
    }

    #[test]
    fn an_offset_out_of_order_is_counted_but_never_indexed() {
        let mut s = StreamIndex::default();
        s.append(5, at(1, 32, 10));
        s.append(3, at(1, 42, 10));
        assert_eq!(s.totals(), (2, 20));
        assert_eq!(s.bounds(), Some((5, 6)));
        assert_eq!(s.point_count(), 1);
    }
}
