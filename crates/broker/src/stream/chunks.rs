//! The messages a stream's readers read back from the journal, kept in
//! chunks that every reader at those offsets shares: ten readers of a
//! stream that is not in memory read each stored byte about once, not ten
//! times (before, each read its own copy: ten preads, ten decodes, and
//! ten buffers of fresh pages per batch).
//!
//! Invariants:
//! - A chunk holds every stored message of the offsets `first .. end()`
//!   (an offset missing there is a gap: a write lost before a crash),
//!   each decoded once; it is never changed after it is made.
//! - Chunks kept here never overlap (a new read stops where a kept chunk
//!   starts, [`ReadChunks::read_end`]), so an offset is in at most one.
//! - Chunks of at most `STREAM_READ_CHUNKS_BYTES_MAX` stored bytes in all
//!   are kept (and always the newest); a chunk no reader can need again
//!   (it ends at or before the slowest reader) goes first, then the least
//!   recently used. Memory is that bound per stream being read, plus the
//!   chunk each reader holds, whatever the stream's size.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::limits::STREAM_READ_CHUNKS_BYTES_MAX;
use crate::message::Message;

/// Messages read back together: the stored ones of offsets `first ..
/// end()`, `offsets` ascending, `msgs[i]` at `offsets[i]`.
#[derive(Debug)]
pub struct Chunk {
    /// Where the read started (no message is stored in `first ..
    /// offsets[0]`).
    pub first: u64,
    pub offsets: Vec<u64>,
    pub msgs: Vec<Arc<Message>>,
    /// Stored bytes of its messages.
    pub bytes: u64,
}

impl Chunk {
    /// The offset after its last message.
    pub fn end(&self) -> u64 {
        self.offsets.last().map_or(self.first, |o| o + 1)
    }

    /// The first message at or after `offset`, with its offset, if this
    /// chunk covers `offset`.
    pub fn get(&self, offset: u64) -> Option<(u64, &Arc<Message>)> {
        if offset < self.first || offset >= self.end() {
            return None;
        }
        let i = self.offsets.partition_point(|o| *o < offset);
        Some((self.offsets[i], &self.msgs[i]))
    }
}

/// A stream's recently read chunks, least recently used first.
#[derive(Debug, Default)]
pub struct ReadChunks {
    chunks: VecDeque<Arc<Chunk>>,
    /// Stored bytes of the kept chunks.
    bytes: u64,
}

impl ReadChunks {
    /// The kept chunk holding `offset`, marked as just used.
    pub fn find(&mut self, offset: u64) -> Option<Arc<Chunk>> {
        let i = self
            .chunks
            .iter()
            .position(|c| c.first <= offset && offset < c.end())?;
        let c = self.chunks.remove(i).expect("found above");
        self.chunks.push_back(Arc::clone(&c));
        Some(c)
    }

    /// Where a read starting at `offset` (not in any kept chunk) must stop
    /// at the latest so that it does not overlap a kept chunk.
    pub fn read_end(&self, offset: u64, wanted_end: u64) -> u64 {
        self.chunks
            .iter()
            .map(|c| c.first)
            .filter(|f| *f > offset)
            .fold(wanted_end, u64::min)
    }

    /// Keeps a chunk just read. `slowest` is the lowest offset any reader
    /// still needs: chunks wholly before it go first, then the least
    /// recently used ones beyond the bound.
    pub fn keep(&mut self, chunk: Arc<Chunk>, slowest: u64) {
        debug_assert!(
            self.chunks
                .iter()
                .all(|c| c.end() <= chunk.first || chunk.end() <= c.first),
            "kept chunks never overlap"
        );
        self.forget_before(slowest);
        self.bytes += chunk.bytes;
        self.chunks.push_back(chunk);
        while self.bytes > STREAM_READ_CHUNKS_BYTES_MAX && self.chunks.len() > 1 {
            let gone = self.chunks.pop_front().expect("more than one");
            self.bytes -= gone.bytes;
        }
    }

    /// Forgets every chunk that ends at or before `first` (retention
    /// removed those offsets, or no reader is left to need them).
    pub fn forget_before(&mut self, first: u64) {
        let bytes = &mut self.bytes;
        self.chunks.retain(|c| {
            let keep = c.end() > first;
            if !keep {
                *bytes -= c.bytes;
            }
            keep
        });
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.bytes = 0;
    }

    /// Stored bytes of the kept chunks.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(first: u64, n: usize) -> Arc<Chunk> {
        let m = Message::new(
            String::new(),
            "s".into(),
            berth_protocol::codec::encode_properties(&berth_protocol::AMQPProperties::default()),
            bytes::Bytes::from_static(b"x"),
        )
        .expect("a message");
        Arc::new(Chunk {
            first,
            offsets: (first..first + n as u64).collect(),
            msgs: vec![m; n],
            bytes: n as u64 * 1000,
        })
    }

    #[test]
    fn a_kept_chunk_is_found_by_any_of_its_offsets_and_reads_stop_before_it() {
        let mut c = ReadChunks::default();
        c.keep(chunk(100, 50), 0);
        assert!(c.find(99).is_none());
        assert_eq!(c.find(100).map(|k| k.first), Some(100));
        assert_eq!(c.find(149).map(|k| k.first), Some(100));
        assert!(c.find(150).is_none());
        assert_eq!(c.read_end(10, 356), 100);
        assert_eq!(c.read_end(150, 406), 406);
    }

    #[test]
    fn chunks_behind_the_slowest_reader_go_first_then_the_least_used() {
        let mut c = ReadChunks::default();
        c.keep(chunk(0, 10), 0);
        c.keep(chunk(10, 10), 0);
        // Every reader is at 10 or later: the first chunk is of no use.
        c.keep(chunk(20, 10), 10);
        assert!(c.find(5).is_none());
        assert_eq!(c.len(), 2);
        // Chunks of 10,000 bytes: this many fit the bound.
        let fit = usize::try_from(STREAM_READ_CHUNKS_BYTES_MAX / 10_000).unwrap();
        for i in 3..=fit as u64 + 5 {
            c.find(10);
            c.keep(chunk(i * 10, 10), 10);
        }
        assert_eq!(c.len(), fit);
        assert!(c.bytes() <= STREAM_READ_CHUNKS_BYTES_MAX);
        assert!(c.find(10).is_some(), "used again and again, so kept");
        assert!(c.find(20).is_none(), "the least recently used went");
    }
}
