//! A stream's in-memory view of its log: its offsets, the logical
//! segments retention works on (each with its newest timestamp: the
//! stream's time index), and the newest messages kept resident until the
//! journal can read them back. Nothing here is per message: the journal
//! finds an offset's message through its own sparse index
//! (`Journal::stream_read`), so a stream of any length costs memory in
//! proportion to its segments (docs/STREAMS.md, "Cost").
//!
//! Invariants:
//! - Offsets are given densely from `end()`; the log holds `first ..
//!   end()`. After a crash an offset may have no message (a write lost
//!   before it was confirmed): a read skips it.
//! - The journal's message order is offset order (offsets are taken under
//!   the queue's lock, with the write).
//! - Segments tile `first..end()` in order (segment `i` holds `segments[i]
//!   .first .. segments[i + 1].first`); every segment but the last is
//!   closed; only whole segments leave, from the head.
//! - Timestamps never decrease along the log (a clock that steps back is
//!   held at the last timestamp), so a timestamp seek is a binary search.
//! - `tail` holds the messages of the offsets `end() - tail.len() ..
//!   end()`, bounded by `STREAM_TAIL_MESSAGES_MAX` beyond what the journal
//!   has not yet written.

use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::durable::StoredStream;
use crate::message::Message;

use super::retention::SegmentFacts;

/// A logical segment: a run of offsets that retention removes together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub first: u64,
    /// Messages in it.
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
    end: u64,
    segments: VecDeque<Segment>,
    messages: u64,
    bytes: u64,
    last_timestamp_ms: u64,
    tail: VecDeque<Resident>,
}

impl StreamLog {
    /// An empty log whose first offset will be `first`.
    pub fn starting_at(first: u64) -> Self {
        Self {
            first,
            end: first,
            ..Self::default()
        }
    }

    pub fn first(&self) -> u64 {
        self.first
    }

    /// The offset the next message gets.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Appends a message of `bytes` stored bytes; returns its offset and
    /// timestamp. A new segment starts when the active one would pass
    /// `segment_bytes_max`.
    pub fn append(
        &mut self,
        bytes: u64,
        timestamp_ms: u64,
        resident: Option<Arc<Message>>,
        segment_bytes_max: u64,
    ) -> (u64, u64) {
        let ts = timestamp_ms.max(self.last_timestamp_ms);
        let offset = self.push(bytes, ts, segment_bytes_max);
        if let Some(msg) = resident {
            self.tail.push_back(Resident {
                msg,
                timestamp_ms: ts,
            });
        }
        (offset, ts)
    }

    /// The log of a stream the journal gave back: segments cut at its
    /// marks so each holds about `segment_bytes_max` (their newest
    /// timestamps are set after, [`StreamLog::set_segment_timestamp`]).
    pub fn restored(s: &StoredStream, segment_bytes_max: u64) -> Self {
        let mut log = Self::starting_at(s.first);
        if s.end <= s.first {
            return log;
        }
        log.end = s.end;
        log.messages = s.messages;
        log.bytes = s.bytes;
        let mut cuts: Vec<(u64, u64)> = vec![(s.first, 0)];
        for &(offset, before) in &s.marks {
            let (_, seg_start) = *cuts.last().expect("one");
            if offset > s.first && offset < s.end && before - seg_start >= segment_bytes_max {
                cuts.push((offset, before));
            }
        }
        for (i, &(first, before)) in cuts.iter().enumerate() {
            let (next, next_before) = cuts.get(i + 1).copied().unwrap_or((s.end, s.bytes));
            log.segments.push_back(Segment {
                first,
                count: next - first,
                bytes: next_before.saturating_sub(before),
                last_timestamp_ms: 0,
            });
        }
        log
    }

    fn push(&mut self, bytes: u64, ts: u64, segment_bytes_max: u64) -> u64 {
        let offset = self.end;
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
        self.end += 1;
        self.messages += 1;
        self.bytes += bytes;
        self.last_timestamp_ms = ts;
        offset
    }

    /// Moves the end to `offset` if it is beyond it: the offsets between
    /// have no message (writes lost before a crash).
    pub fn skip_to(&mut self, offset: u64) {
        if offset > self.end {
            debug_assert!(self.tail.is_empty(), "a gap only before resident messages");
            self.end = offset;
        }
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

    /// Removes the `n` oldest segments (never the active one); returns the
    /// new first offset if any went (the journal trims below it).
    pub fn drop_head_segments(&mut self, n: usize) -> Option<u64> {
        let n = n.min(self.segments.len().saturating_sub(1));
        if n == 0 {
            return None;
        }
        for _ in 0..n {
            let s = self.segments.pop_front().expect("counted above");
            self.bytes -= s.bytes.min(self.bytes);
            self.messages -= s.count.min(self.messages);
        }
        self.first = self.segments.front().expect("the active one stays").first;
        let resident_max = usize::try_from(self.end - self.first).unwrap_or(usize::MAX);
        if self.tail.len() > resident_max {
            let extra = self.tail.len() - resident_max;
            self.tail.drain(..extra);
        }
        Some(self.first)
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

    /// The segments, oldest first, each with the offset after it.
    pub fn segments(&self) -> impl Iterator<Item = (Segment, u64)> + '_ {
        self.segments.iter().enumerate().map(|(i, s)| {
            let next = self.segments.get(i + 1).map_or(self.end, |n| n.first);
            (*s, next)
        })
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
            messages: self.messages,
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
        for i in 0..10u64 {
            let (off, _) = l.append(40, 100 + i, None, 100);
            assert_eq!(off, i);
        }
        // 40 + 40 fit in 100, a third would not: segments of 2.
        assert_eq!(l.stats().segments, 5);
        assert_eq!(l.drop_head_segments(2), Some(4));
        assert_eq!((l.first(), l.end()), (4, 10));
        assert_eq!(l.stats().bytes, 6 * 40);
        assert_eq!(l.stats().messages, 6);
        // The active segment never goes.
        assert_eq!(l.drop_head_segments(100), Some(8));
        assert_eq!(l.stats().segments, 1);
        assert_eq!(l.drop_head_segments(100), None);
    }

    #[test]
    fn timestamps_never_go_back() {
        let mut l = StreamLog::default();
        assert_eq!(l.append(1, 500, None, 100).1, 500);
        assert_eq!(l.append(1, 400, None, 100).1, 500);
    }

    #[test]
    fn a_restored_log_is_cut_into_segments_at_the_marks() {
        let stored = StoredStream {
            first: 100,
            end: 1100,
            messages: 1000,
            bytes: 100_000,
            marks: (0..10).map(|i| (100 + i * 100, i * 10_000)).collect(),
        };
        let l = StreamLog::restored(&stored, 25_000);
        let cuts: Vec<u64> = l.segments().map(|(s, _)| s.first).collect();
        assert_eq!(cuts, vec![100, 400, 700, 1000]);
        assert_eq!(l.stats().bytes, 100_000);
        assert_eq!((l.first(), l.end()), (100, 1100));
        let (last, after) = l.segments().last().unwrap();
        assert_eq!((last.count, last.bytes, after), (100, 10_000, 1100));
    }

    /// What issue 18 asks: nothing in memory per message. A log of many
    /// messages is as large as one of a few, segment for segment.
    #[test]
    fn a_log_holds_nothing_per_message() {
        let mut l = StreamLog::default();
        for _ in 0..100_000 {
            l.append(100, 1, None, 1 << 30);
        }
        assert_eq!(l.stats().segments, 1);
        assert_eq!(l.stats().messages, 100_000);
        assert_eq!(std::mem::size_of::<StreamLog>(), std::mem::size_of_val(&l));
        assert!(l.segments.capacity() < 8);
    }
}
