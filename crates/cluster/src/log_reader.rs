//! Entries the log no longer holds in memory, read back from its
//! segments: only the last [`LOG_RESIDENT_BYTES_MAX`] of the log stay in
//! memory once durable, so a member's memory for its log does not grow
//! with the backlog (a log of 512 MiB between snapshots used to be 512
//! MiB of RAM). A follower that is behind, a restart that applies the log
//! again, and the leader's appends to a lagging member read older entries
//! here.
//!
//! Invariants:
//! - Only entries whose write completed are read from disk (the log's
//!   store keeps the others in memory), each checked against its frame's
//!   CRC: a bad read is an I/O error that stops Raft, never a wrong entry.
//! - Open files are forgotten when the log is cut: a segment deleted by a
//!   cut may be made again under the same name with other entries.
//!
//! [`LOG_RESIDENT_BYTES_MAX`]: crate::limits::LOG_RESIDENT_BYTES_MAX

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::log_frame::read_frame_payload;
use crate::log_segments::segment_name;
use crate::types::{Command, Entry, InLog, LogId};

/// Reads frames at log offsets from the segment files of one directory.
pub(crate) struct SegmentReader {
    dir: PathBuf,
    /// Open segment files by base offset.
    files: Mutex<BTreeMap<u64, Arc<File>>>,
    /// Entries read so far (for status).
    reads: std::sync::atomic::AtomicU64,
}

impl SegmentReader {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            files: Mutex::default(),
            reads: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many entries were read back so far.
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Forgets every open file (after the log was cut or purged).
    pub(crate) fn forget(&self) {
        self.files.lock().clear();
    }

    /// The segment holding log offset `at`: its base and file.
    fn segment(&self, at: u64) -> io::Result<(u64, Arc<File>)> {
        if let Some((base, file)) = self.files.lock().range(..=at).next_back() {
            if let Ok(meta) = file.metadata() {
                if at < base + meta.len() {
                    return Ok((*base, Arc::clone(file)));
                }
            }
        }
        let bases = crate::log_segments::bases(&self.dir)?;
        let base = bases
            .into_iter()
            .take_while(|b| *b <= at)
            .last()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no Raft log segment in {} holds log offset {at}",
                        self.dir.display()
                    ),
                )
            })?;
        let file = Arc::new(File::open(self.dir.join(segment_name(base)))?);
        self.files.lock().insert(base, Arc::clone(&file));
        Ok((base, file))
    }

    /// The entry whose frame of `frame_len` bytes starts at log offset `at`.
    pub(crate) fn read(&self, at: u64, frame_len: usize) -> io::Result<Entry> {
        let (base, file) = self.segment(at)?;
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        read_frame(&file, &self.segment_path(base), at - base, frame_len)
    }

    /// Entry `log_id`, a normal entry whose frame of `frame_len` bytes
    /// starts at log offset `at`, with its command left in the segment
    /// (read when it is applied or sent: [`Command::bytes`]).
    pub(crate) fn read_later(&self, at: u64, frame_len: usize, log_id: LogId) -> io::Result<Entry> {
        let (base, file) = self.segment(at)?;
        Ok(Entry {
            log_id,
            payload: openraft::EntryPayload::Normal(Command::in_log(InLog {
                file,
                path: self.segment_path(base),
                at: at - base,
                frame_len,
                log_id,
            })),
        })
    }

    fn segment_path(&self, base: u64) -> PathBuf {
        self.dir.join(segment_name(base))
    }
}

/// The entry whose frame of `frame_len` bytes is at offset `at` of `file`
/// (the segment `path`), checked against its length and CRC.
fn read_frame(file: &File, path: &Path, at: u64, frame_len: usize) -> io::Result<Entry> {
    let payload = read_frame_payload(file, path, at, frame_len)?;
    postcard::from_bytes(&payload).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "Raft log entry at offset {at} of {}: does not decode: {e}",
                path.display()
            ),
        )
    })
}
