//! Streams in the store: appends that the index keeps sparsely, trims of
//! a stream's head, and reads of a stream from any offset that scan its
//! segments forward from the nearest index point (docs/STREAMS.md, "How
//! it is stored").
//!
//! Invariants:
//! - A read returns only records that check out under the group's salt,
//!   are Append records of the stream asked for, and hold an offset at or
//!   after the one asked for and below the trim point's complement; in
//!   offset order, never more than asked for.
//! - A read holds the group's lock only to plan (copying the spans it
//!   will read and their files); the preads run without it, so a stream
//!   read never stalls the group's writer. A segment deleted meanwhile is
//!   still read through its open file.

use std::sync::Arc;

use bytes::Bytes;

use super::{fail, Store};
use crate::error::StoreError;
use crate::limits::STREAM_READ_BLOCK_BYTES;
use crate::record::{self, Decoded, Record};
use crate::storage::StorageFile;
use crate::writer::{Done, Op};
use crate::QueueId;

/// Spans one read may pass through (a read ends early at a span's end
/// when it has enough; this bounds the plan's size).
const READ_SPANS_MAX: usize = 8;

/// One span of a planned read: its segment's file and number, and the
/// byte range to scan.
struct SpanRead {
    file: Arc<dyn StorageFile>,
    seg: u32,
    start: u32,
    end: u32,
}

pub use crate::report::RecoveredStream;

impl Store {
    /// Appends a stream's message at `offset` of stream `queue`: one
    /// record the index keeps no entry for (a point every stride). The
    /// caller gives each stream's offsets in increasing order. `done` as
    /// for [`Store::publish`].
    pub fn append(&self, queue: QueueId, offset: u64, payload: Bytes, done: Option<Done>) {
        if queue.0 == u64::MAX {
            fail(done, StoreError::Invalid("append to queue u64::MAX".into()));
            return;
        }
        if payload.len() > self.payload_bytes_max as usize {
            fail(
                done,
                StoreError::Invalid(format!(
                    "payload of {} bytes exceeds payload_bytes_max = {}",
                    payload.len(),
                    self.payload_bytes_max
                )),
            );
            return;
        }
        let op = Op::Append {
            queue,
            offset,
            payload,
        };
        self.send(self.group_of(queue), op, done);
    }

    /// Removes stream `queue`'s records below offset `below` (retention).
    /// Their segments go once nothing else keeps them.
    pub fn trim(&self, queue: QueueId, below: u64, done: Option<Done>) {
        self.send(self.group_of(queue), Op::Trim { queue, below }, done);
    }

    /// The first offset kept and the offset after the newest record of
    /// stream `queue` (written records only), if it keeps any.
    pub fn stream_bounds(&self, queue: QueueId) -> Option<(u64, u64)> {
        let g = &self.groups[self.group_of(queue) as usize];
        let inner = g.shared.inner.lock();
        inner.index.stream(queue)?.bounds()
    }

    /// Reads stream `queue`'s records from offset `from` on (the first
    /// at or after it): at most `count_max` of them, and no more once
    /// `bytes_max` payload bytes are read. Each as `(offset, payload)`, in
    /// offset order. Empty when nothing written is at or after `from`.
    pub fn read_stream(
        &self,
        queue: QueueId,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, StoreError> {
        let g = &self.groups[self.group_of(queue) as usize];
        let (ranges, trimmed_below): (Vec<SpanRead>, u64) = {
            let inner = g.shared.inner.lock();
            let Some(st) = inner.index.stream(queue) else {
                return Ok(Vec::new());
            };
            let plan = st.plan(from, READ_SPANS_MAX);
            let mut ranges = Vec::with_capacity(plan.ranges.len());
            for (seg, start, end) in plan.ranges {
                let file = inner.files.get(&seg).ok_or_else(|| StoreError::Corrupt {
                    path: crate::segment::segment_path(&g.shared.dir, seg),
                    offset: u64::from(start),
                    reason: format!("stream {queue}'s index names a segment that is gone"),
                })?;
                ranges.push(SpanRead {
                    file: Arc::clone(file),
                    seg,
                    start,
                    end,
                });
            }
            (ranges, st.trimmed_below)
        };
        let from = from.max(trimmed_below);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for SpanRead {
            file,
            seg,
            start,
            end,
        } in ranges
        {
            let path = crate::segment::segment_path(&g.shared.dir, seg);
            let mut pos = u64::from(start);
            let end = u64::from(end);
            while pos < end {
                let want = (end - pos).min(STREAM_READ_BLOCK_BYTES as u64);
                let mut buf = vec![0u8; usize::try_from(want).unwrap_or(usize::MAX)];
                file.read_exact_at(&mut buf, pos)
                    .map_err(|e| StoreError::io("read", &path, e))?;
                let buf = Bytes::from(buf);
                let mut at = 0usize;
                loop {
                    match record::decode(g.shared.salt, &buf[at..]) {
                        Decoded::Record { record, len, .. } => {
                            if let Record::Append {
                                queue: q,
                                offset,
                                payload,
                            } = record
                            {
                                if q == queue && offset >= from {
                                    bytes += payload.len();
                                    out.push((offset, buf.slice_ref(payload)));
                                    if out.len() >= count_max || bytes >= bytes_max {
                                        return Ok(out);
                                    }
                                }
                            }
                            at += len;
                        }
                        Decoded::Incomplete { needed } if at == 0 => {
                            // One record larger than a block: read it whole.
                            let mut big = vec![0u8; needed];
                            file.read_exact_at(&mut big, pos)
                                .map_err(|e| StoreError::io("read", &path, e))?;
                            let big = Bytes::from(big);
                            if let Decoded::Record {
                                record:
                                    Record::Append {
                                        queue: q,
                                        offset,
                                        payload,
                                    },
                                ..
                            } = record::decode(g.shared.salt, &big)
                            {
                                if q == queue && offset >= from {
                                    bytes += payload.len();
                                    out.push((offset, big.slice_ref(payload)));
                                    if out.len() >= count_max || bytes >= bytes_max {
                                        return Ok(out);
                                    }
                                }
                            }
                            at = needed;
                            break;
                        }
                        Decoded::Incomplete { .. } => break,
                        other => {
                            return Err(StoreError::Corrupt {
                                path,
                                offset: pos + at as u64,
                                reason: format!(
                                    "stream {queue}'s record does not verify: {other:?}"
                                ),
                            })
                        }
                    }
                    if pos + at as u64 >= end {
                        break;
                    }
                }
                pos += at as u64;
            }
        }
        Ok(out)
    }
}

/// What recovery's index holds for each stream, for the caller to rebuild
/// its view without reading the stream.
pub(super) fn recovered_streams(index: &crate::index::Index) -> Vec<(QueueId, RecoveredStream)> {
    index
        .streams()
        .filter_map(|(q, st)| {
            let (first, end) = st.bounds()?;
            let mut marks = Vec::new();
            let mut before = 0u64;
            let mut messages = 0u64;
            let mut bytes = 0u64;
            for span in st.spans() {
                let span_first = span.points[0].offset;
                let width = (span.last + 1 - span_first).max(1);
                // The part of a head span below the trim point is not kept.
                let cut = first.saturating_sub(span_first).min(width);
                let kept_count = span.count.saturating_sub(cut);
                let kept_bytes = span.bytes - span.bytes * cut / width;
                for p in &span.points {
                    if p.offset < first {
                        continue;
                    }
                    let into = span.bytes * (p.offset - span_first) / width;
                    marks.push((
                        p.offset,
                        before + into - (span.bytes - kept_bytes).min(into),
                    ));
                }
                before += kept_bytes;
                messages += kept_count;
                bytes += kept_bytes;
            }
            if marks.first().is_none_or(|m| m.0 != first) {
                marks.insert(0, (first, 0));
            }
            Some((
                q,
                RecoveredStream {
                    first,
                    end,
                    messages,
                    bytes,
                    marks,
                },
            ))
        })
        .collect()
}
