//! A node's Raft log and vote, as openraft's `RaftLogStorage` sees them:
//! entries kept in memory for reading and in the log's segments for
//! durability, the vote in `raft.vote`, the purge point in `raft.purged`.
//!
//! Invariants:
//! - `append` makes entries readable at once and reports them flushed only
//!   through the writer thread, after their fdatasync (log_file's contract).
//! - Entries are contiguous: each index is one more than the previous, and
//!   every index is greater than the purge point.
//! - A vote is answered (`save_vote` returns) only once it is durable: a
//!   node that forgot its vote could vote twice in one term.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::ClusterError;
use crate::limits::APPEND_BYTES_TARGET;
use crate::log_file::{self, append_frame, Loaded, Writer, PURGED_FILE, VOTE_FILE};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// postcard's output appended to a buffer that holds other frames
/// already (its own `to_extend` takes the buffer by value).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[derive(Default)]
struct State {
    /// index → (log offset of its frame, entry).
    entries: BTreeMap<u64, (u64, Entry)>,
    /// Where the next frame goes.
    log_end: u64,
    vote: Option<Vote>,
    purged: Option<LogId>,
}

/// The log; cheap to clone (openraft asks for a separate reader).
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<State>>,
    writer: Writer,
}

impl LogStore {
    /// Builds the log from what the cluster directory held. The loaded
    /// snapshot is the state machine's business and is ignored here.
    pub(crate) fn from_loaded(
        dir: &Path,
        loaded: &Loaded,
        writer: Writer,
    ) -> Result<Self, ClusterError> {
        let undecodable = |file: &str, e: postcard::Error| ClusterError::Undecodable {
            path: dir.join(file),
            detail: e.to_string(),
        };
        let vote = loaded
            .vote
            .as_deref()
            .map(postcard::from_bytes::<Vote>)
            .transpose()
            .map_err(|e| undecodable(VOTE_FILE, e))?;
        let purged = loaded
            .purged
            .as_deref()
            .map(postcard::from_bytes::<LogId>)
            .transpose()
            .map_err(|e| undecodable(PURGED_FILE, e))?;
        let mut entries = BTreeMap::new();
        let mut last = purged.map(|p| p.index);
        for (offset, payload) in &loaded.entries {
            let entry: Entry =
                postcard::from_bytes(payload).map_err(|e| undecodable(log_file::LOG_FILE, e))?;
            let index = entry.get_log_id().index;
            if purged.is_some_and(|p| index <= p.index) {
                continue; // purged: the file keeps it until it is rewritten
            }
            if last.is_some_and(|l| index != l + 1) {
                return Err(ClusterError::Undecodable {
                    path: dir.join(log_file::LOG_FILE),
                    detail: format!(
                        "entry {index} at byte {offset} does not follow entry {last:?}"
                    ),
                });
            }
            last = Some(index);
            entries.insert(index, (*offset, entry));
        }
        let state = State {
            entries,
            log_end: loaded.log_end,
            vote,
            purged,
        };
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            writer,
        })
    }

    /// The index of the last entry (or of the purge point), for status.
    #[must_use]
    pub fn last_index(&self) -> Option<u64> {
        let s = self.state.lock();
        s.entries
            .keys()
            .next_back()
            .copied()
            .or(s.purged.map(|p| p.index))
    }

    /// Bytes of the log's entries after `index` (all of them for `None`):
    /// what a snapshot at `index` would let go.
    #[must_use]
    pub fn bytes_after(&self, index: Option<u64>) -> u64 {
        let s = self.state.lock();
        let from = index.map_or(0, |i| i + 1);
        s.entries
            .range(from..)
            .next()
            .map_or(0, |(_, (offset, _))| s.log_end - offset)
    }

    async fn durable(&self, submit: impl FnOnce(log_file::Done)) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        submit(Box::new(move |r| {
            let _ = tx.send(r); // the waiter may have gone (shutdown); the write happened either way
        }));
        rx.await
            .unwrap_or_else(|_| Err(io::Error::other("the Raft log writer has stopped")))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let s = self.state.lock();
        Ok(s.entries
            .range(range)
            .map(|(_, (_, e))| e.clone())
            .collect())
    }

    /// What one append may carry: the first entries of `[start, end)` that
    /// fit [`APPEND_BYTES_TARGET`] (at least one). Sized here, so that the
    /// transport never has to refuse an append as too large: openraft's
    /// retry of a refused append with fewer entries could lose track of
    /// where to start (seen: a follower restarted behind a purged log of
    /// 8 MiB entries was probed with entries from index 0 forever).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let s = self.state.lock();
        let range: Vec<&Entry> = s.entries.range(start..end).map(|(_, (_, e))| e).collect();
        let (fit, _) = crate::types::entries_within(range.iter().copied(), APPEND_BYTES_TARGET);
        Ok(range[..fit].iter().map(|e| (*e).clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let s = self.state.lock();
        let last = s
            .entries
            .values()
            .next_back()
            .map(|(_, e)| *e.get_log_id())
            .or(s.purged);
        Ok(LogState {
            last_purged_log_id: s.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let payload = postcard::to_allocvec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.durable(|done| self.writer.replace(VOTE_FILE, &payload, done))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.state.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.state.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut frames = Vec::new();
        let at = {
            let mut s = self.state.lock();
            let at = s.log_end;
            for entry in entries {
                let offset = at + frames.len() as u64;
                append_frame(&mut frames, |out| {
                    postcard::serialize_with_flavor(&entry, AppendTo(out))
                })
                .map_err(|e| StorageIOError::write_logs(&e))?;
                let index = entry.get_log_id().index;
                debug_assert!(
                    s.entries.keys().next_back().is_none_or(|l| *l + 1 == index),
                    "entries are contiguous"
                );
                s.entries.insert(index, (offset, entry));
            }
            s.log_end = at + frames.len() as u64;
            at
        };
        self.writer.append(
            at,
            frames,
            Box::new(move |result| callback.log_io_completed(result)),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let len = {
            let mut s = self.state.lock();
            let cut = s.entries.split_off(&log_id.index);
            if let Some((offset, _)) = cut.values().next() {
                s.log_end = *offset;
            }
            s.log_end
        };
        self.durable(|done| self.writer.truncate(len, done))
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let payload = postcard::to_allocvec(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        self.durable(|done| self.writer.replace(PURGED_FILE, &payload, done))
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Segments that hold only purged entries are deleted (nothing is
        // copied, no offset changes); the job is sent under the lock so
        // that it runs before any later append's.
        let dropped = {
            let mut s = self.state.lock();
            s.entries = s.entries.split_off(&(log_id.index + 1));
            s.purged = Some(log_id);
            let head = s
                .entries
                .values()
                .next()
                .map_or(s.log_end, |(offset, _)| *offset);
            let (tx, rx) = oneshot::channel();
            self.writer.drop_head(
                head,
                Box::new(move |r| {
                    let _ = tx.send(r); // a dropped waiter only means shutdown
                }),
            );
            rx
        };
        dropped
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the Raft log writer has stopped")))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}
