//! The streams' part of a checkpoint: a base's stream section (each
//! stream's sparse index, spans and points verbatim) and a delta's Append
//! ops, each checked against the order the journal gives before it
//! reaches a [`StreamIndex`].
//!
//! Invariants:
//! - What a checkpoint lists about a stream loads only if appends in
//!   journal order could have built it: spans in ascending segments, a
//!   span's points ascending by offset and position and within its newest
//!   record, an Append after its stream's records in its segment
//!   ([`StreamIndex::span_misplaced`], [`StreamIndex::misplaced`]).
//!   Anything else is damage: the checkpoint is refused as `Corrupt`
//!   naming its file, the offset of the span or op and what was wrong,
//!   and recovery takes the chain before it or replays the journal
//!   (`group_reader.rs`, `choose_checkpoint`), as for any damaged checkpoint.
//! - Each stream is listed once in a base.

use super::{put_len, Parsed, Reader};
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::record::Record;
use crate::stream_index::{Point, Span, StreamIndex};
use crate::QueueId;

/// Bytes of one index point in a span: `offset u64 · pos u32`.
const POINT_BYTES: usize = 8 + 4;

/// Version 3's stream section of a base: `stream_count u64`, then per
/// stream `queue u64 · trimmed_below u64 · span_count u32` and its spans,
/// each `seg u32 · last u64 · end u32 · count u64 · bytes u64 ·
/// point_count u32 · (offset u64 · pos u32) × point_count`.
pub(super) fn encode(out: &mut Vec<u8>, index: &Index) {
    let streams: Vec<_> = index.streams().collect();
    out.extend_from_slice(&(streams.len() as u64).to_le_bytes());
    for (q, st) in streams {
        out.extend_from_slice(&q.0.to_le_bytes());
        out.extend_from_slice(&st.trimmed_below.to_le_bytes());
        put_len(out, st.spans().len());
        for span in st.spans() {
            out.extend_from_slice(&span.seg.to_le_bytes());
            out.extend_from_slice(&span.last.to_le_bytes());
            out.extend_from_slice(&span.end.to_le_bytes());
            out.extend_from_slice(&span.count.to_le_bytes());
            out.extend_from_slice(&span.bytes.to_le_bytes());
            put_len(out, span.points.len());
            for p in &span.points {
                out.extend_from_slice(&p.offset.to_le_bytes());
                out.extend_from_slice(&p.pos.to_le_bytes());
            }
        }
    }
}

impl Parsed {
    /// The stream section of a version 3 base ([`encode`]).
    pub(super) fn load_streams(
        &self,
        r: &mut Reader<'_>,
        index: &mut Index,
    ) -> Result<(), StoreError> {
        let bad = |r: &Reader<'_>| self.corrupt(r.at, "truncated or inconsistent stream section");
        let count = r.u64().ok_or_else(|| bad(r))?;
        for _ in 0..count {
            let at = r.at;
            let queue = QueueId(r.u64().ok_or_else(|| bad(r))?);
            if index.stream(queue).is_some() {
                return Err(self.corrupt(at, &format!("stream {} listed twice", queue.0)));
            }
            let mut st = StreamIndex::trimmed_at(r.u64().ok_or_else(|| bad(r))?);
            let spans = r.u32().ok_or_else(|| bad(r))?;
            for _ in 0..spans {
                let at = r.at;
                let seg = r.u32().ok_or_else(|| bad(r))?;
                let last = r.u64().ok_or_else(|| bad(r))?;
                let end = r.u32().ok_or_else(|| bad(r))?;
                let count = r.u64().ok_or_else(|| bad(r))?;
                let bytes = r.u64().ok_or_else(|| bad(r))?;
                let n = r.u32().ok_or_else(|| bad(r))? as usize;
                // Checked against what is left before anything is reserved.
                if n == 0 || n.checked_mul(POINT_BYTES).is_none_or(|b| b > r.left()) {
                    return Err(bad(r));
                }
                let mut points = Vec::with_capacity(n);
                for _ in 0..n {
                    points.push(Point {
                        offset: r.u64().ok_or_else(|| bad(r))?,
                        pos: r.u32().ok_or_else(|| bad(r))?,
                    });
                }
                let span = Span {
                    seg,
                    last,
                    end,
                    count,
                    bytes,
                    points,
                };
                if let Some(why) = StreamIndex::span_misplaced(st.spans().last(), &span) {
                    return Err(self.corrupt(at, &format!("stream {}: {why}", queue.0)));
                }
                st.push_span(span);
            }
            index.load_stream(queue, st);
        }
        Ok(())
    }

    /// A delta's Append op (at byte `at` of the file), applied to `index`
    /// once it is checked to come after what the stream already holds.
    pub(super) fn apply_append(
        &self,
        at: usize,
        index: &mut Index,
        queue: QueueId,
        offset: u64,
        loc: Loc,
    ) -> Result<(), StoreError> {
        let why = match index.stream(queue) {
            Some(st) => st.misplaced(loc),
            None => StreamIndex::default().misplaced(loc),
        };
        if let Some(why) = why {
            return Err(self.corrupt(at, &format!("stream {}, offset {offset}: {why}", queue.0)));
        }
        index.apply(
            &Record::Append {
                queue,
                offset,
                payload: &[],
            },
            loc,
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests;
