//! Recovery of one log group: latest valid checkpoint + journal tail, read
//! by the one journal scanner ([`crate::group_reader`]), every anomaly resolved
//! by the decision tables ([`crate::decision`]) that inspection reports
//! from too.
//!
//! Invariants:
//! - Recovery acts on the tables' actions and decides nothing itself:
//!   `Apply` uses, `Truncate` cuts or removes, `Quarantine` sets aside,
//!   `Skip` falls back, `Fail` stops with the file and offset.
//! - Nothing is trusted without its checksum; nothing is dropped silently:
//!   a truncated tail is logged with its size, a damaged range is copied to a
//!   quarantine file, reported ([`DamageReport`]) and patched with a `Hole`
//!   record so the next recovery neither re-reports nor trips on it.
//! - Every valid record after a damaged range is kept.
//! - What recovery accepted is durable before it returns: every replayed
//!   segment is fdatasynced and the directory fsynced (the tail may have
//!   been read from the page cache of a killed process).
//! - Replay applies records through [`Index::apply`] (in the scanner), the
//!   writer's own mutator, so the rebuilt state is the state the writer had.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::checkpoint::{Link, ReplayFrom};
use crate::decision::{decide_layout, Action, LayoutCase};
use crate::error::StoreError;
use crate::group_reader::{
    CheckpointBytes, CheckpointSeen, Damage, Found, Journal, Listing, Seg, Span, Verdict, Visit,
};
use crate::index::Index;
use crate::limits::{LISTING_THREADS_MAX, RECORD_BODY_BYTES_MAX};
use crate::manifest::read_all;
use crate::record::{self, Decoded, Record, RECORD_HEADER_BYTES};
use crate::report::DamageReport;
use crate::report::RecoveredMessage;
use crate::segment::{self, HeaderCheck};
use crate::storage::{Storage, StorageFile};
use crate::QueueId;

/// A segment file known after recovery.
pub struct SegFile {
    pub file: Arc<dyn StorageFile>,
    pub len: u64,
}

/// Everything recovery learnt about one group.
pub struct GroupRecovery {
    pub index: Index,
    pub segments: BTreeMap<u32, SegFile>,
    pub next_lsn: u64,
    pub next_seq: u32,
    /// Valid checkpoints on disk (number, header), oldest first.
    pub checkpoints: Vec<Link>,
    /// Number for the next checkpoint file.
    pub next_checkpoint_no: u64,
    pub damage: Vec<DamageReport>,
    pub records_replayed: u64,
    pub bytes_scanned: u64,
    pub truncated_bytes: u64,
    pub checkpoint_used: Option<u64>,
    pub checkpoints_ignored: Vec<PathBuf>,
    /// The index is exactly the chosen checkpoint plus the journal after
    /// it: false when messages of a missing segment were dropped.
    pub index_from_journal: bool,
    /// Each queue's live messages in id order (`Index::live_by_queue`),
    /// made here so that the groups' threads share the work.
    pub queues: Vec<(QueueId, Vec<RecoveredMessage>)>,
}

/// Shared progress counters for the recovery log lines.
#[derive(Default)]
pub struct Progress {
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
    pub records: AtomicU64,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| StoreError::io(op, path, e)
}

/// Recovery's side of the journal walk: acts on every action the tables
/// give, and keeps what the writer needs afterwards.
struct Recovering<'a> {
    storage: &'a dyn Storage,
    group: u32,
    /// The store's record salt: Holes are written under it.
    salt: u32,
    dir: &'a Path,
    progress: &'a Progress,
    segments: BTreeMap<u32, SegFile>,
    /// Valid checkpoints, newest first.
    checkpoints: Vec<Link>,
    ignored: Vec<PathBuf>,
    damage: Vec<DamageReport>,
    records: u64,
    truncated: u64,
    bytes_scanned: u64,
}

impl Recovering<'_> {
    fn fail(&self, path: &Path, offset: usize, reason: String) -> StoreError {
        StoreError::Recovery {
            group: self.group,
            path: path.to_path_buf(),
            offset: offset as u64,
            reason,
        }
    }

    fn file(&self, seq: u32) -> Arc<dyn StorageFile> {
        Arc::clone(
            &self
                .segments
                .get(&seq)
                .expect("opened before the walk")
                .file,
        )
    }

    /// Opens every segment (the writer keeps them all), refusing one that
    /// cannot be berth's, and counts the bytes to replay for the progress
    /// lines.
    fn open_segments(&mut self, listing: &Listing, replay: ReplayFrom) -> Result<(), StoreError> {
        for &s in &listing.segments {
            let path = segment::segment_path(self.dir, s);
            let file = self.storage.open(&path).map_err(io_err("open", &path))?;
            let len = file.len().map_err(io_err("stat", &path))?;
            if len > u64::from(u32::MAX) {
                return Err(StoreError::Recovery {
                    group: self.group,
                    path,
                    offset: u64::from(u32::MAX) + 1,
                    reason: format!(
                        "segment is {len} bytes, but offsets are 32-bit so berth never writes one \
                         of 4 GiB or more: not a berth segment, or damaged; move it aside and restore \
                         it from a backup"
                    ),
                });
            }
            if s >= replay.seg {
                self.progress.bytes_total.fetch_add(len, Ordering::Relaxed);
            }
            self.segments.insert(s, SegFile { file, len });
        }
        Ok(())
    }

    /// Copies the damaged range aside, patches it with Holes and reports
    /// it: the next recovery neither re-reports nor trips on it.
    fn quarantine(&mut self, seg: &Seg<'_>, d: &Damage<'_>, why: &str) -> Result<(), StoreError> {
        let (seq, at, end) = (seg.seq, d.at, d.end);
        let path = seg.path;
        let damaged = &seg.bytes[at..end];
        // Salvage what the damaged headers still say, hopping by their lengths.
        let (mut messages, mut queues) = (Vec::new(), Vec::new());
        let mut o = 0;
        while o + RECORD_HEADER_BYTES <= damaged.len() {
            if let Some((m, qs)) = record::salvage_publish_header(&damaged[o..]) {
                messages.push(m);
                queues.extend(qs);
            }
            let body_len =
                u32::from_le_bytes(damaged[o + 4..o + 8].try_into().expect("4 bytes")) as usize;
            o += RECORD_HEADER_BYTES + body_len;
        }
        queues.sort_unstable();
        queues.dedup();
        let last_lsn = d.prev_lsn.unwrap_or(0);
        let records_lost = d
            .later
            .and_then(|l| match record::decode(self.salt, &seg.bytes[l..]) {
                Decoded::Record { lsn, .. } if lsn > 0 => Some(lsn - last_lsn - 1),
                _ => None,
            });
        let qname = format!("quarantine-{seq:010}-{at:010}.bin");
        let qpath = self.dir.join(&qname);
        let qf = self
            .storage
            .create(&qpath)
            .map_err(io_err("create", &qpath))?;
        qf.write_all_at(damaged, 0)
            .map_err(io_err("write", &qpath))?;
        qf.sync_data().map_err(io_err("fdatasync", &qpath))?;
        self.storage
            .sync_dir(self.dir)
            .map_err(io_err("fsync dir", self.dir))?;
        // Patch the range so the segment reads cleanly from now on.
        let file = self.file(seq);
        if end - at >= RECORD_HEADER_BYTES {
            let holes = hole_records(end - at);
            let mut patch = Vec::with_capacity(end - at);
            for body_len in holes {
                record::encode(self.salt, 0, &Record::Hole { body_len }, &mut patch);
            }
            debug_assert_eq!(patch.len(), end - at);
            file.write_all_at(&patch, at as u64)
                .map_err(io_err("write", path))?;
        } else {
            file.set_len(at as u64).map_err(io_err("truncate", path))?;
        }
        file.sync_data().map_err(io_err("fdatasync", path))?;
        let report = DamageReport {
            group: self.group,
            file: path.to_path_buf(),
            offset: at as u64,
            len: (end - at) as u64,
            quarantine_file: qpath,
            records_lost,
            messages,
            queues,
            reason: why.to_owned(),
        };
        tracing::error!(group = report.group, file = %report.file.display(), offset = report.offset,
            bytes = report.len, records_lost = ?report.records_lost, messages = report.messages.len(),
            queues = ?report.queues, quarantine = %report.quarantine_file.display(),
            "damaged journal range quarantined ({why}); valid records after it kept");
        self.damage.push(report);
        Ok(())
    }
}

impl Visit for Recovering<'_> {
    fn read_checkpoint(&mut self, path: &Path) -> CheckpointBytes {
        // An unreadable checkpoint is one more invalid one: fall back.
        Ok(read_all(self.storage, path))
    }

    fn unfinished_checkpoint(&mut self, path: &Path, verdict: Verdict) -> Result<(), StoreError> {
        let why = verdict.why;
        match verdict.action {
            Action::Truncate => self.storage.remove(path).map_err(io_err("remove", path)),
            Action::Apply | Action::Note | Action::Skip => Ok(()),
            Action::Quarantine | Action::Fail => Err(self.fail(path, 0, why.to_owned())),
            Action::End => unreachable!("End is a record table action"),
        }
    }

    fn checkpoint(&mut self, seen: CheckpointSeen<'_>) -> Result<(), StoreError> {
        let why = seen.verdict.why;
        match (seen.verdict.action, seen.decoded) {
            (Action::Apply, Ok((link, _))) => self.checkpoints.push(link),
            (Action::Fail, Err(e)) => return Err(e),
            (Action::Fail, Ok(_)) => return Err(self.fail(seen.path, 0, why.to_owned())),
            (_, Err(e)) => {
                tracing::warn!(group = self.group, file = %seen.path.display(), error = %e,
                    "ignoring invalid checkpoint ({why})");
                self.ignored.push(seen.path.to_path_buf());
            }
            (_, Ok(_)) => {}
        }
        Ok(())
    }

    fn load_segment(&mut self, seq: u32, path: &Path) -> Result<Vec<u8>, StoreError> {
        let seg = self.segments.get(&seq).expect("opened before the walk");
        let mut buf = vec![0u8; usize::try_from(seg.len).expect("segment fits memory")];
        seg.file
            .read_exact_at(&mut buf, 0)
            .map_err(io_err("read", path))?;
        Ok(buf)
    }

    fn missing(&mut self, seq: u32, verdict: Verdict) -> Result<(), StoreError> {
        let why = verdict.why;
        match verdict.action {
            Action::Fail => Err(StoreError::Recovery {
                group: self.group,
                path: segment::segment_path(self.dir, seq),
                offset: 0,
                reason: format!(
                    "{why}: segment {seq} is not there, and the records it held are unknown \
                     (store.accept_missing_segments covers only segments whose messages the \
                     index names); restore this group's directory from a backup"
                ),
            }),
            // Before the replay start: recovery never reads it.
            _ => Ok(()),
        }
    }

    fn header(&mut self, seg: &Seg<'_>) -> Result<(), StoreError> {
        let why = seg.verdict.why;
        match seg.verdict.action {
            Action::Apply if seg.start > seg.bytes.len() => Err(self.fail(
                seg.path,
                seg.start,
                format!(
                    "checkpoint replays from offset {} beyond the end ({})",
                    seg.start,
                    seg.bytes.len()
                ),
            )),
            Action::Apply | Action::Note => Ok(()),
            Action::Truncate => {
                let (path, dir) = (seg.path, self.dir);
                tracing::warn!(group = self.group, file = %path.display(), "removing segment ({why})");
                self.storage.remove(path).map_err(io_err("remove", path))?;
                self.storage
                    .sync_dir(dir)
                    .map_err(io_err("fsync dir", dir))?;
                self.truncated += seg.bytes.len() as u64;
                self.segments.remove(&seg.seq);
                Ok(())
            }
            Action::End => unreachable!("End is a record table action"),
            Action::Skip | Action::Quarantine | Action::Fail => {
                let detail = match &seg.header {
                    HeaderCheck::Foreign(d) => format!("{why}: {d}"),
                    _ => why.to_owned(),
                };
                Err(self.fail(seg.path, 0, detail))
            }
        }
    }

    fn record(&mut self, seg: &Seg<'_>, found: &Found<'_>) -> Result<(), StoreError> {
        let why = found.verdict.why;
        if found.verdict.action != Action::Apply {
            let prev = found.prev_lsn.unwrap_or(0);
            let detail = format!("record lsn {} after lsn {prev}", found.lsn);
            return Err(self.fail(seg.path, found.at, format!("{why}: {detail}")));
        }
        if !matches!(found.record, Record::Hole { .. }) {
            self.records += 1;
        }
        self.progress.records.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn damage(&mut self, seg: &Seg<'_>, d: &Damage<'_>) -> Result<(), StoreError> {
        let why = d.verdict.why;
        match d.verdict.action {
            Action::Truncate => {
                let (path, at) = (seg.path, d.at);
                let cut = seg.bytes.len() - at;
                tracing::warn!(group = self.group, file = %path.display(), offset = at, bytes = cut,
                    "truncating torn tail ({why})");
                let file = self.file(seg.seq);
                file.set_len(at as u64).map_err(io_err("truncate", path))?;
                file.sync_data().map_err(io_err("fdatasync", path))?;
                self.truncated += cut as u64;
                Ok(())
            }
            Action::End => {
                // A prepared segment's unwritten zeros: cut off so the
                // segment ends at its last record, as a grown one does.
                let (path, at) = (seg.path, d.at);
                tracing::debug!(group = self.group, file = %path.display(), offset = at,
                    "cutting off the newest segment's unwritten zeros ({why})");
                let file = self.file(seg.seq);
                file.set_len(at as u64).map_err(io_err("truncate", path))?;
                file.sync_data().map_err(io_err("fdatasync", path))
            }
            Action::Quarantine => self.quarantine(seg, d, why),
            Action::Apply | Action::Note | Action::Skip | Action::Fail => {
                let detail = match &d.decoded {
                    Decoded::Unparseable { lsn, reason, .. } => {
                        format!("record lsn {lsn}: {reason}")
                    }
                    _ => String::new(),
                };
                Err(self.fail(seg.path, d.at, format!("{why}: {detail}")))
            }
        }
    }

    fn segment_end(&mut self, seg: &Seg<'_>, scanned_to: Option<usize>) -> Result<(), StoreError> {
        if let (Some(end), Some(s)) = (scanned_to, self.segments.get_mut(&seg.seq)) {
            s.len = end as u64;
        }
        let len = seg.bytes.len() as u64;
        self.bytes_scanned += len;
        self.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}

/// Body lengths of the `Hole` records that exactly cover a damaged range
/// of `len` bytes (`len` ≥ one record header): as few as possible, none
/// with a body over [`RECORD_BODY_BYTES_MAX`], none shorter than a header.
fn hole_records(len: usize) -> Vec<u32> {
    const WHOLE_MAX: usize = RECORD_HEADER_BYTES + RECORD_BODY_BYTES_MAX as usize;
    assert!(
        len >= RECORD_HEADER_BYTES,
        "a hole needs {RECORD_HEADER_BYTES} bytes"
    );
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let mut take = left.min(WHOLE_MAX);
        if left - take > 0 && left - take < RECORD_HEADER_BYTES {
            // Leave enough for the last hole's header.
            take -= RECORD_HEADER_BYTES;
        }
        out.push(u32::try_from(take - RECORD_HEADER_BYTES).expect("bounded by the body limit"));
        left -= take;
    }
    out
}

/// Recovers group `group` stored in `dir` (which must exist: it is
/// created with the store's manifests, never here), whose records are checksummed
/// under `salt` (the manifest's record salt). With `accept_missing_segments`
/// (see [`crate::StoreConfig`]), messages of a missing segment are dropped
/// and reported; without it, a missing segment fails recovery.
pub fn recover_group(
    storage: &dyn Storage,
    group: u32,
    dir: &Path,
    progress: &Progress,
    salt: u32,
    accept_missing_segments: bool,
) -> Result<GroupRecovery, StoreError> {
    let names = match storage.list(dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (action, why) = decide_layout(LayoutCase::GroupDirMissing);
            debug_assert_eq!(action, Action::Fail);
            return Err(StoreError::Recovery {
                group,
                path: dir.to_path_buf(),
                offset: 0,
                reason: format!(
                    "{why}: restore the directory from a backup (berth store restore), or put \
                     it back if it was moved; berth creates it only for a new store"
                ),
            });
        }
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    if names.iter().any(|n| n == segment::PREPARED_SEGMENT_NAME) {
        // A next segment being prepared when the broker stopped: zeros,
        // no record, never a segment yet. The writer prepares a new one.
        let path = segment::prepared_segment_path(dir);
        storage.remove(&path).map_err(io_err("remove", &path))?;
        tracing::debug!(group, file = %path.display(), "prepared segment left by a stop removed");
    }
    let listing = Listing::of(&names);
    let journal = Journal {
        group,
        salt,
        dir,
        listing: &listing,
    };
    let mut r = Recovering {
        storage,
        group,
        salt,
        dir,
        progress,
        segments: BTreeMap::new(),
        checkpoints: Vec::new(),
        ignored: Vec::new(),
        damage: Vec::new(),
        records: 0,
        truncated: 0,
        bytes_scanned: 0,
    };
    let start = journal.choose_checkpoint(&mut r)?;
    if start.verdict.action != Action::Apply {
        let first = listing.segments.first().copied().unwrap_or(1);
        return Err(r.fail(
            dir,
            0,
            format!(
                "{}: the journal starts at segment {first}",
                start.verdict.why
            ),
        ));
    }
    let checkpoint_used = start.checkpoint.map(|(_, info)| info.lsn);
    let replay = start.replay;
    r.open_segments(&listing, replay)?;
    let walked = journal.walk(start, Span::Replay, &mut r)?;
    let mut index = walked.index;
    let index_from_journal = r.drop_missing(&mut index, accept_missing_segments)?;
    r.make_replayed_durable(replay)?;

    // After the segments that survived: a removed torn segment's number is
    // reused, so numbering stays consecutive.
    let next_seq = r
        .segments
        .keys()
        .next_back()
        .map_or(1, |s| s + 1)
        .max(replay.seg);
    r.checkpoints.reverse();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let queues = index.live_by_queue(cores.min(LISTING_THREADS_MAX));
    Ok(GroupRecovery {
        next_lsn: walked.last_lsn.unwrap_or(0) + 1,
        index,
        segments: r.segments,
        next_seq,
        checkpoints: r.checkpoints,
        next_checkpoint_no: listing.checkpoints.last().map_or(1, |n| n + 1),
        damage: r.damage,
        records_replayed: r.records,
        bytes_scanned: r.bytes_scanned,
        truncated_bytes: r.truncated,
        checkpoint_used,
        checkpoints_ignored: r.ignored,
        index_from_journal,
        queues,
    })
}

impl Recovering<'_> {
    /// fdatasyncs every segment replayed, then the directory. After a
    /// process kill the tail just read may be in the page cache only; the
    /// writer's next records follow it in sequence and its next checkpoint
    /// covers it, so a power loss that cut it short would leave records
    /// missing with nothing to explain them, or a checkpoint past the
    /// durable end. Runs before the group's writer exists, so before it
    /// accepts a write or writes a checkpoint.
    fn make_replayed_durable(&self, replay: ReplayFrom) -> Result<(), StoreError> {
        for (&seq, seg) in self.segments.range(replay.seg..) {
            let path = segment::segment_path(self.dir, seq);
            seg.file.sync_data().map_err(io_err("fdatasync", &path))?;
        }
        self.storage
            .sync_dir(self.dir)
            .map_err(io_err("fsync dir", self.dir))
    }

    /// A segment the index still needs is gone: deleted by hand, lost with
    /// a disk, or (before the fix that syncs relocations first) unlinked
    /// ahead of compaction's copies. Refuses, unless the operator accepted
    /// the loss: then drops its messages and reports them as damage.
    /// Returns whether the index is exactly checkpoint + journal.
    fn drop_missing(&mut self, index: &mut Index, accept: bool) -> Result<bool, StoreError> {
        let (group, dir) = (self.group, self.dir);
        // The segments' live counts (messages and stream records) say
        // which are needed: a walk of the segments, not of the messages.
        let missing: Vec<u32> = index
            .live_segments()
            .filter(|s| !self.segments.contains_key(s))
            .collect();
        if let (Some(&first), false) = (missing.first(), accept) {
            let held: u64 = missing.iter().map(|&s| index.seg_live(s).count).sum();
            let names: Vec<String> = missing.iter().map(|&s| segment::segment_name(s)).collect();
            return Err(StoreError::Recovery {
                group,
                path: segment::segment_path(dir, first),
                offset: 0,
                reason: format!(
                    "segment(s) {} holding {held} live message(s) are missing; restore them from a \
                     backup, or set store.accept_missing_segments = true to open without those \
                     messages (they are then listed as damage)",
                    names.join(", ")
                ),
            });
        }
        let whole = missing.is_empty();
        for s in missing {
            let stream_lost = index.drop_stream_segment(s);
            if stream_lost > 0 {
                let path = segment::segment_path(dir, s);
                tracing::error!(group, file = %path.display(), records = stream_lost,
                    "segment holding stream records is missing; they are dropped (accept_missing_segments)");
            }
            let lost = index.drop_segment(s);
            let mut queues: Vec<QueueId> =
                lost.iter().flat_map(|m| m.queues.iter().copied()).collect();
            queues.sort_unstable();
            queues.dedup();
            let path = segment::segment_path(dir, s);
            tracing::error!(group, file = %path.display(), messages = lost.len(), queues = ?queues,
                "segment holding live messages is missing; its messages are dropped (accept_missing_segments)");
            self.damage.push(DamageReport {
                group,
                file: path.clone(),
                offset: 0,
                len: 0,
                quarantine_file: path,
                records_lost: None,
                messages: lost.iter().map(|m| m.msg).collect(),
                queues,
                reason: "segment holding live messages is missing (accepted)".into(),
            });
        }
        Ok(whole)
    }
}

#[cfg(test)]
mod tests;
