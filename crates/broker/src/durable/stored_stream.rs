//! What a journal gives back of a stream after a restart, without reading
//! it (`Journal::stream_append` wrote it): the broker rebuilds the stream's
//! log from this (`stream/log.rs`).

/// A stream as the journal gives it back after a restart, without reading
/// it: its bounds and size, and marks to cut it into segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredStream {
    pub first: u64,
    /// The offset after its newest message.
    pub end: u64,
    pub messages: u64,
    pub bytes: u64,
    /// Ascending `(offset, stored bytes before it)`, a few per journal
    /// segment (the journal's index points).
    pub marks: Vec<(u64, u64)>,
}
