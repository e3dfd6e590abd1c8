//! A stream's in-memory view of its log: which journal message holds each
//! offset, the logical segments retention works on, and the newest
//! messages kept resident until the journal can read them back.
//!
//! Invariants:
//! - Offsets are dense and start at `first`: offset `o` is `ids[o - first]`
//!   (0 marks a gap: an offset whose write was lost before a crash; it is
//!   skipped on delivery). `end()` is the next offset to be given.
//! - Journal ids grow with offsets (both are taken under the queue's lock),
//!   so the journal's recovery order (by id) is offset order.
//! - Segments tile `first..end()` in order; every segment but the last is
//!   closed; only whole segments leave, from the head.
//! - Timestamps never decrease along the log (a clock that steps back is
//!   held at the last timestamp), so a timestamp seek is a binary search.
//! - `tail` holds the messages of the offsets `end() - tail.len() ..
//!   end()`, bounded by `STREAM_TAIL_MESSAGES_MAX` beyond what the journal
//!   has not yet written.
//!
//! Cost: 8 bytes of memory per message (its journal id) here, beside the
//! store's own per-message index entry (docs/STREAMS.md, "Cost").

use std::collections::VecDeque;
use std::sync::Arc;

use crate::message::Message;

use super::retention::SegmentFacts;

/// A logical segment: a run of offsets that retention removes together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub first: u64,
    pub count: u64,
    /// Stored entry bytes.
    pub bytes: u64,
    /// Timestamp of its newest message (Unix milliseconds).
    pub last_timestamp_ms: u64,
}

/// A message kept in memory, with its timestamp.
#[derive(Debug, Clone)]
pub struct Resident {
    pub msg: Arc<Message>,
    pub timestamp_ms: u64,
}

/// What a stream shows operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub messages: u64,
    pub bytes: u64,
    pub first_offset: u64,
    /// The offset the next message gets.
    pub next_offset: u64,
    /// Offsets below this are durable (what consumers may read).
    pub committed_next: u64,
    pub segments: u64,
}

#[derive(Debug, Default)]
pub struct StreamLog {
    first: u64,
    ids: VecDeque<u64>,
    segments: VecDeque<Segment>,
    bytes: u64,
    last_timestamp_ms: u64,
    tail: VecDeque<Resident>,
}

impl StreamLog {
    /// An empty log whose first offset will be `first`.
    pub fn starting_at(first: u64) -> Self {
        Self {
            first,
            ..Self::default()
        }
    }

    pub fn first(&self) -> u64 {
        self.first
    }

    /// The offset the next message gets.
    pub fn end(&self) -> u64 {
        self.first + self.ids.len() as u64
    }

    /// Appends a message stored as journal message `id` (`bytes` stored
    /// bytes); returns its offset and timestamp. A new segment starts when
    /// the active one would pass `segment_bytes_max`.
    pub fn append(
        &mut self,
        id: u64,
        bytes: u64,
        timestamp_ms: u64,
        resident: Option<Arc<Message>>,
        segment_bytes_max: u64,
    ) -> (u64, u64) {
        let ts = timestamp_ms.max(self.last_timestamp_ms);
        let offset = self.push(id, bytes, ts, segment_bytes_max);
        if let Some(msg) = resident {
            self.tail.push_back(Resident {
                msg,
                timestamp_ms: ts,
            });
        }
        (offset, ts)
    }

    /// [`StreamLog::append`] of a recovered message, at `offset` (gaps
    /// before it are marked).
    pub fn restore(
        &mut self,
        offset: u64,
        id: u64,
        bytes: u64,
        timestamp_ms: u64,
        segment_bytes_max: u64,
    ) {
        if self.ids.is_empty() && self.segments.is_empty() {
            self.first = offset;
        }
        while self.end() < offset {
            self.push(0, 0, self.last_timestamp_ms, segment_bytes_max);
        }
        let ts = timestamp_ms.max(self.last_timestamp_ms);
        self.push(id, bytes, ts, segment_bytes_max);
    }

    fn push(&mut self, id: u64, bytes: u64, ts: u64, segment_bytes_max: u64) -> u64 {
        let offset = self.end();
        let cut = match self.segments.back() {
            None => true,
            Some(s) => s.bytes > 0 && s.bytes.saturating_add(bytes) > segment_bytes_max,
        };
        if cut {
            self.segments.push_back(Segment {
                first: offset,
                count: 0,
                bytes: 0,
                last_timestamp_ms: ts,
            });
        }
        let s = self.segments.back_mut().expect("a segment exists");
        s.count += 1;
        s.bytes += bytes;
        s.last_timestamp_ms = ts;
        self.ids.push_back(id);
        self.bytes += bytes;
        self.last_timestamp_ms = ts;
        offset
    }

    /// The journal id of `offset` (`None` outside the log or at a gap).
    pub fn id_at(&self, offset: u64) -> Option<u64> {
        let i = offset.checked_sub(self.first)?;
        self.ids
            .get(usize::try_from(i).ok()?)
            .copied()
            .filter(|id| *id != 0)
    }

    /// The message of `offset` if it is resident.
    pub fn resident(&self, offset: u64) -> Option<&Resident> {
        let tail_first = self.end() - self.tail.len() as u64;
        let i = offset.checked_sub(tail_first)?;
        self.tail.get(usize::try_from(i).ok()?)
    }

    pub fn resident_count(&self) -> usize {
        self.tail.len()
    }

    /// The offset of the oldest resident message (`end()` if none).
    pub fn resident_first(&self) -> u64 {
        self.end() - self.tail.len() as u64
    }

    /// The timestamp the next message gets at wall-clock `now_ms`: never
    /// less than the last one (see the invariants).
    pub fn next_timestamp(&self, now_ms: u64) -> u64 {
        now_ms.max(self.last_timestamp_ms)
    }

    /// Lets the oldest `n` resident messages go (read back from the
    /// journal from now on).
    pub fn release_resident(&mut self, n: usize) {
        self.tail.drain(..n.min(self.tail.len()));
    }

    /// Removes the `n` oldest segments; returns the journal ids they held.
    pub fn drop_head_segments(&mut self, n: usize) -> Vec<u64> {
        let mut gone = Vec::new();
        for _ in 0..n.min(self.segments.len().saturating_sub(1)) {
            let s = self.segments.pop_front().expect("counted above");
            self.bytes -= s.bytes;
            for _ in 0..s.count {
                let id = self.ids.pop_front().expect("segments tile the ids");
                if id != 0 {
                    gone.push(id);
                }
            }
            self.first += s.count;
        }
        let resident_max = self.ids.len();
        if self.tail.len() > resident_max {
            let extra = self.tail.len() - resident_max;
            self.tail.drain(..extra);
        }
        gone
    }

    /// Each segment as retention sees it.
    pub fn segment_facts(&self) -> Vec<SegmentFacts> {
        self.segments
            .iter()
            .map(|s| SegmentFacts {
                bytes: s.bytes,
                last_timestamp_ms: s.last_timestamp_ms,
            })
            .collect()
    }

    /// The segments, oldest first.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter()
    }

    /// Sets the newest timestamp of segment `i` (recovery reads it back).
    pub fn set_segment_timestamp(&mut self, i: usize, ts: u64) {
        if let Some(s) = self.segments.get_mut(i) {
            s.last_timestamp_ms = ts;
        }
        self.last_timestamp_ms = self.last_timestamp_ms.max(ts);
    }

    pub fn stats(&self) -> StreamStats {
        StreamStats {
            messages: self.ids.len() as u64,
            bytes: self.bytes,
            first_offset: self.first,
            next_offset: self.end(),
            committed_next: self.end(),
            segments: self.segments.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_dense_and_segments_tile_them() {
        let mut l = StreamLog::default();
        for id in 1..=10u64 {
            let (off, _) = l.append(id * 3, 40, 100 + id, None, 100);
            assert_eq!(off, id - 1);
        }
        // 40 + 40 fit in 100, a third would not: segments of 2.
        assert_eq!(l.stats().segments, 5);
        assert_eq!(l.id_at(4), Some(15));
        let gone = l.drop_head_segments(2);
        assert_eq!(gone, vec![3, 6, 9, 12]);
        assert_eq!((l.first(), l.end()), (4, 10));
        assert_eq!(l.id_at(3), None);
        assert_eq!(l.stats().bytes, 6 * 40);
        // The active segment never goes.
        l.drop_head_segments(100);
        assert_eq!(l.stats().segments, 1);
        assert_eq!(l.first(), 8);
    }

    #[test]
    fn timestamps_never_go_back() {
        let mut l = StreamLog::default();
        assert_eq!(l.append(1, 1, 500, None, 100).1, 500);
        assert_eq!(l.append(2, 1, 400, None, 100).1, 500);
    }

    #[test]
    fn restore_marks_gaps_and_keeps_offsets() {
        let mut l = StreamLog::default();
        l.restore(7, 10, 5, 1, 100);
        l.restore(9, 12, 5, 2, 100);
        assert_eq!((l.first(), l.end()), (7, 10));
        assert_eq!(l.id_at(7), Some(10));
        assert_eq!(l.id_at(8), None);
        assert_eq!(l.id_at(9), Some(12));
    }
}
