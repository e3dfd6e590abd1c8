//! A node's Raft log and vote, as openraft's `RaftLogStorage` sees them:
//! entries in the log's segments for durability, the newest of them also
//! in memory (up to [`LOG_RESIDENT_BYTES_MAX`] once durable; older ones
//! are read back from the segments, `log_reader.rs`), the vote in
//! `raft.vote`, the purge point in `raft.purged`.
//!
//! Invariants:
//! - An entry leaves memory only once its write completed, oldest first:
//!   entries below `first_resident` are on disk only, the rest in memory.
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
#[cfg(doc)]
use crate::limits::LOG_RESIDENT_BYTES_MAX;
use crate::limits::{APPEND_BYTES_TARGET, LOG_READ_LATER_BYTES_MIN};
use crate::log_file::{self, append_frame, Loaded, Writer, PURGED_FILE, VOTE_FILE};
use crate::log_frame::FRAME_HEADER_BYTES;
use crate::log_reader::SegmentReader;
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

/// The byte postcard writes, after an entry's log id, for a normal entry
/// (openraft's payload variant), so that a start that reads only the
/// heads of old entries knows which of them hold a command.
fn normal_tag() -> u8 {
    use std::sync::OnceLock;
    static TAG: OnceLock<u8> = OnceLock::new();
    *TAG.get_or_init(|| {
        let payload: openraft::EntryPayload<TypeConfig> =
            openraft::EntryPayload::Normal(crate::types::Command::new(bytes::Bytes::new()));
        postcard::to_allocvec(&payload).expect("a payload encodes")[0]
    })
}

/// How [`LogStore::read`] gets an entry: (log offset, frame length).
enum Planned {
    Held(Entry),
    Read(u64, usize),
    /// Left on disk until used, as the normal entry of this log id.
    Later(u64, usize, LogId),
}

/// An entry as the log holds it.
enum Held {
    /// In memory: the newest entries, and any not yet durable.
    Resident(Entry),
    /// Only in its segment (read back by `log_reader`); whether it is a
    /// normal entry (a command, which a read may leave on disk).
    OnDisk(LogId, bool),
}

struct Slot {
    /// Log offset of its frame.
    offset: u64,
    /// Its frame's length in bytes.
    frame_len: u64,
    held: Held,
}

impl Slot {
    fn log_id(&self) -> LogId {
        match &self.held {
            Held::Resident(e) => *e.get_log_id(),
            Held::OnDisk(id, _) => *id,
        }
    }
}

#[derive(Default)]
struct State {
    /// index → where its frame is, and the entry if resident.
    entries: BTreeMap<u64, Slot>,
    /// Where the next frame goes.
    log_end: u64,
    /// The log offset up to which writes completed.
    written_end: u64,
    /// Bumped by every cut, so that a completion of an append made before
    /// a cut does not mark bytes written after it.
    cuts: u64,
    /// Frame bytes of the resident entries.
    resident_bytes: u64,
    /// Entries below this index are on disk only.
    first_resident: u64,
    /// The resident bytes kept once durable (`LOG_RESIDENT_BYTES_MAX`).
    resident_max: u64,
    vote: Option<Vote>,
    purged: Option<LogId>,
}

impl State {
    /// Lets the oldest durable entries go from memory while the resident
    /// ones pass `resident_max`.
    fn evict(&mut self) {
        let (mut resident, written) = (self.resident_bytes, self.written_end);
        let mut next = self.first_resident;
        for (index, slot) in self.entries.range_mut(self.first_resident..) {
            if resident <= self.resident_max || slot.offset + slot.frame_len > written {
                break;
            }
            if let Held::Resident(e) = &slot.held {
                let normal = matches!(e.payload, openraft::EntryPayload::Normal(_));
                slot.held = Held::OnDisk(*e.get_log_id(), normal);
                resident -= slot.frame_len;
            }
            next = index + 1;
        }
        self.resident_bytes = resident;
        self.first_resident = next;
    }

    /// Forgets the resident bytes of `removed` (cut or purged entries).
    fn removed(&mut self, removed: &BTreeMap<u64, Slot>) {
        for slot in removed.values() {
            if matches!(slot.held, Held::Resident(_)) {
                self.resident_bytes -= slot.frame_len;
            }
        }
    }
}

/// The log; cheap to clone (openraft asks for a separate reader).
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<State>>,
    writer: Writer,
    reader: Arc<SegmentReader>,
}

impl LogStore {
    /// Builds the log from what the cluster directory held. The loaded
    /// snapshot is the state machine's business and is ignored here.
    pub(crate) fn from_loaded(
        dir: &Path,
        loaded: &Loaded,
        writer: Writer,
        resident_max: u64,
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
        let mut resident_bytes = 0;
        let mut last = purged.map(|p| p.index);
        for (n, (offset, payload)) in loaded.entries.iter().enumerate() {
            let next = loaded
                .entries
                .get(n + 1)
                .map_or(loaded.log_end, |(o, _)| *o);
            let frame_len = next - offset;
            // A whole payload, or only its head (`open_keeping`).
            let whole = (FRAME_HEADER_BYTES + payload.len()) as u64 == frame_len;
            let (log_id, held) = if whole {
                let entry: Entry = postcard::from_bytes(payload)
                    .map_err(|e| undecodable(log_file::LOG_FILE, e))?;
                (*entry.get_log_id(), Held::Resident(entry))
            } else {
                let (log_id, rest) = postcard::take_from_bytes::<LogId>(payload)
                    .map_err(|e| undecodable(log_file::LOG_FILE, e))?;
                (
                    log_id,
                    Held::OnDisk(log_id, rest.first() == Some(&normal_tag())),
                )
            };
            let index = log_id.index;
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
            if matches!(held, Held::Resident(_)) {
                resident_bytes += frame_len;
            }
            entries.insert(
                index,
                Slot {
                    offset: *offset,
                    frame_len,
                    held,
                },
            );
        }
        let mut state = State {
            first_resident: entries
                .iter()
                .find(|(_, slot)| matches!(slot.held, Held::Resident(_)))
                .map(|(i, _)| *i)
                .or_else(|| entries.keys().next_back().map(|i| i + 1))
                .unwrap_or_else(|| purged.map_or(0, |p| p.index + 1)),
            entries,
            log_end: loaded.log_end,
            written_end: loaded.log_end,
            cuts: 0,
            resident_bytes,
            resident_max,
            vote,
            purged,
        };
        state.evict();
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            writer,
            reader: Arc::new(SegmentReader::new(dir)),
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
            .map_or(0, |(_, slot)| s.log_end - slot.offset)
    }

    /// The entries of `range`: those in memory shared, the others read
    /// back from the segments (outside the lock: appends go on meanwhile).
    fn read(&self, range: impl RangeBounds<u64>, bytes_max: u64) -> io::Result<Vec<Entry>> {
        /// Room for an entry's log id and framing (as `entries_within`).
        const OVERHEAD: u64 = 64;
        let planned: Vec<Planned> = {
            let s = self.state.lock();
            let mut size = OVERHEAD;
            let mut planned = Vec::new();
            for slot in s.entries.range(range).map(|(_, slot)| slot) {
                size += OVERHEAD + slot.frame_len;
                if size > bytes_max && !planned.is_empty() {
                    break;
                }
                let (at, len) = (
                    slot.offset,
                    usize::try_from(slot.frame_len).expect("a frame fits in memory"),
                );
                planned.push(match &slot.held {
                    Held::Resident(e) => Planned::Held(e.clone()),
                    // A large command stays on disk until it is used.
                    Held::OnDisk(id, true) if slot.frame_len >= LOG_READ_LATER_BYTES_MIN => {
                        Planned::Later(at, len, *id)
                    }
                    Held::OnDisk(..) => Planned::Read(at, len),
                });
            }
            planned
        };
        planned
            .into_iter()
            .map(|p| match p {
                Planned::Held(e) => Ok(e),
                Planned::Read(at, len) => self.reader.read(at, len),
                Planned::Later(at, len, log_id) => self.reader.read_later(at, len, log_id),
            })
            .collect()
    }

    /// Bytes of entries held in memory, and how many entries were read
    /// back from the segments so far (for status).
    #[must_use]
    pub fn memory(&self) -> (u64, u64) {
        (self.state.lock().resident_bytes, self.reader.reads())
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
        self.read(range, u64::MAX)
            .map_err(|e| StorageIOError::read_logs(&e).into())
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
        self.read(start..end, APPEND_BYTES_TARGET as u64)
            .map_err(|e| StorageIOError::read_logs(&e).into())
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
            .map(Slot::log_id)
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
        let (at, cuts) = {
            let mut s = self.state.lock();
            let at = s.log_end;
            for entry in entries {
                let offset = at + frames.len() as u64;
                append_frame(&mut frames, |out| {
                    postcard::serialize_with_flavor(&entry, AppendTo(out))
                })
                .map_err(|e| StorageIOError::write_logs(&e))?;
                let frame_len = at + frames.len() as u64 - offset;
                let index = entry.get_log_id().index;
                debug_assert!(
                    s.entries.keys().next_back().is_none_or(|l| *l + 1 == index),
                    "entries are contiguous"
                );
                s.resident_bytes += frame_len;
                s.entries.insert(
                    index,
                    Slot {
                        offset,
                        frame_len,
                        held: Held::Resident(entry),
                    },
                );
            }
            s.log_end = at + frames.len() as u64;
            (at, s.cuts)
        };
        let end = at + frames.len() as u64;
        let state = Arc::clone(&self.state);
        self.writer.append(
            at,
            frames,
            Box::new(move |result| {
                if result.is_ok() {
                    let mut s = state.lock();
                    if s.cuts == cuts {
                        s.written_end = s.written_end.max(end);
                        s.evict();
                    }
                }
                callback.log_io_completed(result);
            }),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let len = {
            let mut s = self.state.lock();
            let cut = s.entries.split_off(&log_id.index);
            if let Some(slot) = cut.values().next() {
                s.log_end = slot.offset;
            }
            s.removed(&cut);
            s.cuts += 1;
            s.written_end = s.written_end.min(s.log_end);
            s.first_resident = s.first_resident.min(log_id.index);
            s.log_end
        };
        self.reader.forget();
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
            let kept = s.entries.split_off(&(log_id.index + 1));
            let gone = std::mem::replace(&mut s.entries, kept);
            s.removed(&gone);
            s.purged = Some(log_id);
            s.first_resident = s.first_resident.max(log_id.index + 1);
            let head = s
                .entries
                .values()
                .next()
                .map_or(s.log_end, |slot| slot.offset);
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
        self.reader.forget();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use berth_testdir::TestDir;
    use bytes::Bytes;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::log_frame::encode_frame;
    use crate::sync_gate::SyncGate;
    use crate::types::Command;

    const LARGE: usize = 256 * 1024;

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload,
        }
    }

    fn body(index: u64, bytes: usize) -> Bytes {
        Bytes::from(vec![u8::try_from(index % 251).unwrap(); bytes])
    }

    /// Writes `entries` as a log of 1 MiB segments, then opens it as a
    /// start does, keeping nothing resident.
    fn written_and_reopened(dir: &Path, entries: &[Entry]) -> LogStore {
        {
            let (_, w) = log_file::open_with(dir, SyncGate::default(), 1024 * 1024).unwrap();
            let mut at = 0;
            for e in entries {
                let frame = encode_frame(&postcard::to_allocvec(e).unwrap());
                let (tx, rx) = mpsc::channel();
                w.append(at, frame.clone(), Box::new(move |r| tx.send(r).unwrap()));
                rx.recv().unwrap().unwrap();
                at += frame.len() as u64;
            }
        }
        let (loaded, w) = log_file::open_keeping(dir, SyncGate::default(), 1024 * 1024, 0).unwrap();
        LogStore::from_loaded(dir, &loaded, w, 0).unwrap()
    }

    #[test]
    fn a_start_hands_out_large_entries_as_where_they_lie_and_reads_them_when_used() {
        let dir = TestDir::new("cluster-read-later");
        let mut written = vec![entry(1, EntryPayload::Blank)];
        for i in 2..=41 {
            let bytes = if i % 10 == 0 { 100 } else { LARGE };
            written.push(entry(i, EntryPayload::Normal(Command::new(body(i, bytes)))));
        }
        let log = written_and_reopened(&dir, &written);
        // openraft reads the whole range at once to apply it at a start.
        let read = log.read(1..=41, u64::MAX).unwrap();
        assert_eq!(read.len(), written.len());
        let held: usize = read
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(c) => c.held_bytes(),
                _ => 0,
            })
            .sum();
        assert!(
            held <= 4 * 100,
            "a range of {} large entries read back holds {held} bytes of commands in memory",
            written.len()
        );
        // The segments go (a purge) while the entries are still to be
        // applied or sent: they read from the handles they keep.
        for name in crate::log_segments::bases(&dir).unwrap() {
            std::fs::remove_file(dir.join(crate::log_segments::segment_name(name))).unwrap();
        }
        for (r, w) in read.iter().zip(&written) {
            assert_eq!(r.log_id, w.log_id);
            match (&r.payload, &w.payload) {
                (EntryPayload::Normal(r), EntryPayload::Normal(w)) => {
                    assert_eq!(r.bytes().unwrap(), w.bytes().unwrap());
                }
                (EntryPayload::Blank, EntryPayload::Blank) => {}
                (r, w) => panic!("read {r:?} for {w:?}"),
            }
            // Sent to a follower, it encodes as it was written.
            assert_eq!(
                postcard::to_allocvec(r).unwrap(),
                postcard::to_allocvec(w).unwrap()
            );
        }
    }

    #[test]
    fn an_entry_whose_frame_changed_under_it_is_an_error_not_another_entry() {
        let dir = TestDir::new("cluster-read-later-changed");
        let written: Vec<Entry> = (1..=3)
            .map(|i| entry(i, EntryPayload::Normal(Command::new(body(i, LARGE)))))
            .collect();
        let log = written_and_reopened(&dir, &written);
        let read = log.read(2..=2, u64::MAX).unwrap();
        // Entry 3's frame written where entry 2's was (a cut and rewrite).
        let seg = dir.join(crate::log_segments::segment_name(0));
        let bytes = std::fs::read(&seg).unwrap();
        let second = encode_frame(&postcard::to_allocvec(&written[0]).unwrap()).len();
        let third = encode_frame(&postcard::to_allocvec(&written[2]).unwrap());
        let mut changed = bytes.clone();
        changed[second..second + third.len()].copy_from_slice(&third);
        std::fs::write(&seg, &changed).unwrap();
        let EntryPayload::Normal(c) = &read[0].payload else {
            panic!("entry 2 is a normal entry");
        };
        match c.bytes() {
            Ok(b) => panic!("entry 2 read as {} bytes after its frame changed", b.len()),
            Err(e) => assert!(e.to_string().contains("no longer holds entry"), "{e}"),
        }
    }
}
