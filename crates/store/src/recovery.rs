//! Recovery of one log group: latest valid checkpoint + journal tail, with
//! every anomaly resolved by a literal decision table.
//!
//! Invariants:
//! - Every observation maps to exactly one [`Action`]: the tables
//!   [`RECORD_TABLE`] and [`SEGMENT_TABLE`] are tested to cover every case
//!   once (`every_case_maps_to_exactly_one_action`).
//! - Nothing is trusted without its checksum; nothing is dropped silently:
//!   a truncated tail is logged with its size, a damaged range is copied to a
//!   quarantine file, reported ([`DamageReport`]) and patched with a `Hole`
//!   record so the next recovery neither re-reports nor trips on it.
//! - Every valid record after a damaged range is kept.
//! - Replay applies records through [`Index::apply`], the writer's own
//!   mutator, so the rebuilt state is the state the writer had.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::checkpoint::{self, CheckpointInfo, ReplayFrom, CHECKPOINT_TMP_NAME};
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::limits::RECORD_BODY_BYTES_MAX;
use crate::manifest::read_all;
use crate::record::{self, Decoded, Record, RECORD_HEADER_BYTES};
use crate::segment::{self, HeaderCheck, SEGMENT_HEADER_BYTES};
use crate::storage::{Storage, StorageFile};
use crate::{MsgId, QueueId};

/// What the bytes at a record position are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Checksum passes.
    Intact,
    /// Checksum fails or the length is impossible.
    Corrupt,
    /// The file ends before the frame does.
    Short,
}

/// Whether an intact frame's body parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    Parses,
    Unparseable,
}

/// An intact record's sequence number against the expected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// lsn == previous + 1.
    Next,
    /// lsn > previous + 1: records are missing.
    Gap,
    /// lsn <= previous: out of order.
    Behind,
    /// A `Hole` record (no lsn).
    Unnumbered,
}

/// One observation during a segment scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordCase {
    pub frame: Frame,
    pub body: Body,
    pub order: Order,
    /// The previous thing in the journal was damage (quarantined or a Hole).
    pub after_damage: bool,
    /// A valid record exists further on in this segment.
    pub valid_later: bool,
    /// This is the group's newest segment.
    pub last_segment: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Use it (a record: apply; a segment: scan it).
    Apply,
    /// Cut the file here (a record) or remove it (a segment): a crash tore
    /// an unfinished write.
    Truncate,
    /// Copy the damaged bytes aside, report the loss, keep what follows.
    Quarantine,
    /// Stop: the store cannot be rebuilt safely without an operator.
    Fail,
}

/// A row of [`RECORD_TABLE`]; `None` matches anything.
pub struct RecordRow {
    pub frame: &'static [Frame],
    pub body: Option<Body>,
    pub order: Option<Order>,
    pub after_damage: Option<bool>,
    pub valid_later: Option<bool>,
    pub last_segment: Option<bool>,
    pub action: Action,
    pub why: &'static str,
}

const BROKEN: &[Frame] = &[Frame::Corrupt, Frame::Short];
const INTACT: &[Frame] = &[Frame::Intact];

/// The record decision table.
#[rustfmt::skip]
pub const RECORD_TABLE: &[RecordRow] = &[
    RecordRow { frame: INTACT, body: Some(Body::Unparseable), order: None, after_damage: None, valid_later: None, last_segment: None,
        action: Action::Fail, why: "checksummed but not understood: newer format or a bug" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Next), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Apply, why: "the expected record" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Unnumbered), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Apply, why: "a Hole left by an earlier quarantine" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Gap), after_damage: Some(true), valid_later: None, last_segment: None,
        action: Action::Apply, why: "records lost to reported damage just before" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Gap), after_damage: Some(false), valid_later: None, last_segment: None,
        action: Action::Fail, why: "records missing with no damage to explain it" },
    RecordRow { frame: INTACT, body: Some(Body::Parses), order: Some(Order::Behind), after_damage: None, valid_later: None, last_segment: None,
        action: Action::Fail, why: "out of order: journal mixed up" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(true), last_segment: None,
        action: Action::Quarantine, why: "damage in the middle: valid records follow" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(false), last_segment: Some(true),
        action: Action::Truncate, why: "torn tail of the newest segment" },
    RecordRow { frame: BROKEN, body: None, order: None, after_damage: None, valid_later: Some(false), last_segment: Some(false),
        action: Action::Quarantine, why: "damage at the end of a sealed (synced) segment" },
];

fn row_matches(row: &RecordRow, c: &RecordCase) -> bool {
    row.frame.contains(&c.frame)
        && row.body.is_none_or(|b| b == c.body)
        && row.order.is_none_or(|o| o == c.order)
        && row.after_damage.is_none_or(|v| v == c.after_damage)
        && row.valid_later.is_none_or(|v| v == c.valid_later)
        && row.last_segment.is_none_or(|v| v == c.last_segment)
}

/// The action for a record observation.
pub fn decide(case: &RecordCase) -> (Action, &'static str) {
    let mut rows = RECORD_TABLE.iter().filter(|r| row_matches(r, case));
    let row = rows.next().expect("decision table covers every case");
    debug_assert!(rows.next().is_none(), "decision table overlaps at {case:?}");
    (row.action, row.why)
}

/// What a segment's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    Ok,
    /// Short or checksum mismatch.
    Torn,
    /// Checksum passes but it is not this group's segment of this number.
    Foreign,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentCase {
    pub header: Header,
    pub last_segment: bool,
    /// A valid record follows the header position anyway.
    pub valid_records: bool,
}

pub struct SegmentRow {
    pub header: Header,
    pub last_segment: Option<bool>,
    pub valid_records: Option<bool>,
    pub action: Action,
    pub why: &'static str,
}

/// The segment decision table.
#[rustfmt::skip]
pub const SEGMENT_TABLE: &[SegmentRow] = &[
    SegmentRow { header: Header::Ok, last_segment: None, valid_records: None, action: Action::Apply, why: "scan it" },
    SegmentRow { header: Header::Torn, last_segment: Some(true), valid_records: Some(false), action: Action::Truncate,
        why: "creation of the newest segment torn by a crash" },
    SegmentRow { header: Header::Torn, last_segment: Some(true), valid_records: Some(true), action: Action::Fail,
        why: "damaged header over valid records" },
    SegmentRow { header: Header::Torn, last_segment: Some(false), valid_records: None, action: Action::Fail,
        why: "damaged header of a sealed segment" },
    SegmentRow { header: Header::Foreign, last_segment: None, valid_records: None, action: Action::Fail,
        why: "not this group's segment, or another format version" },
];

pub fn decide_segment(case: &SegmentCase) -> (Action, &'static str) {
    let mut rows = SEGMENT_TABLE.iter().filter(|r| {
        r.header == case.header
            && r.last_segment.is_none_or(|v| v == case.last_segment)
            && r.valid_records.is_none_or(|v| v == case.valid_records)
    });
    let row = rows.next().expect("segment table covers every case");
    debug_assert!(rows.next().is_none(), "segment table overlaps at {case:?}");
    (row.action, row.why)
}

/// A damaged range found and quarantined during recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamageReport {
    pub group: u32,
    pub file: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// Where the damaged bytes were copied.
    pub quarantine_file: PathBuf,
    /// Records known lost (from the sequence-number gap), if a valid
    /// record followed in the same segment.
    pub records_lost: Option<u64>,
    /// Messages (and their queues) named by damaged publish headers that
    /// could still be read; unverified, for the operator.
    pub messages: Vec<MsgId>,
    pub queues: Vec<QueueId>,
    pub reason: String,
}

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
    pub checkpoints: Vec<(u64, CheckpointInfo)>,
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

struct Scan<'a> {
    storage: &'a dyn Storage,
    group: u32,
    /// The store's record salt: a record is valid only under it.
    salt: u32,
    dir: &'a Path,
    index: Index,
    last_lsn: u64,
    after_damage: bool,
    damage: Vec<DamageReport>,
    records: u64,
    truncated: u64,
}

/// Offset of the first valid record at or after `from` whose lsn is beyond
/// `last_lsn` (or a Hole), if any. Every offset is tried, payload bytes
/// included: only the record salt (secret from publishers) keeps a record
/// embedded in a payload from being taken for one of the journal's.
fn next_valid(salt: u32, buf: &[u8], from: usize, last_lsn: u64) -> Option<usize> {
    (from..buf.len().saturating_sub(RECORD_HEADER_BYTES - 1)).find(|&o| {
        matches!(record::decode(salt, &buf[o..]),
            Decoded::Record { lsn, record, .. } if lsn > last_lsn || matches!(record, Record::Hole { .. }))
    })
}

impl Scan<'_> {
    fn fail(&self, path: &Path, offset: usize, reason: String) -> StoreError {
        StoreError::Recovery {
            group: self.group,
            path: path.to_path_buf(),
            offset: offset as u64,
            reason,
        }
    }

    /// Scans one segment from `start`, applying, truncating or quarantining.
    fn segment(
        &mut self,
        seq: u32,
        file: &Arc<dyn StorageFile>,
        buf: &mut [u8],
        start: usize,
        last_segment: bool,
        progress: &Progress,
    ) -> Result<u64, StoreError> {
        let path = segment::segment_path(self.dir, seq);
        let mut at = start;
        while at < buf.len() {
            let mut unparseable = String::new();
            let (frame, body, order, parsed) = match record::decode(self.salt, &buf[at..]) {
                Decoded::Record { lsn, record, len } => {
                    let order = if matches!(record, Record::Hole { .. }) {
                        Order::Unnumbered
                    } else if lsn == self.last_lsn + 1 {
                        Order::Next
                    } else if lsn > self.last_lsn {
                        Order::Gap
                    } else {
                        Order::Behind
                    };
                    (Frame::Intact, Body::Parses, order, Some((lsn, record, len)))
                }
                Decoded::Unparseable { lsn, reason, .. } => {
                    unparseable = format!("record lsn {lsn}: {reason}");
                    (Frame::Intact, Body::Unparseable, Order::Next, None)
                }
                Decoded::Corrupt(_) => (Frame::Corrupt, Body::Parses, Order::Next, None),
                Decoded::Incomplete { .. } => (Frame::Short, Body::Parses, Order::Next, None),
            };
            let later = if frame == Frame::Intact {
                None
            } else {
                next_valid(self.salt, buf, at + RECORD_HEADER_BYTES, self.last_lsn)
            };
            let case = RecordCase {
                frame,
                body,
                order,
                after_damage: self.after_damage,
                valid_later: later.is_some(),
                last_segment,
            };
            let (action, why) = decide(&case);
            match action {
                Action::Apply => {
                    let (lsn, record, len) = parsed.expect("Apply only for parsed records");
                    let loc = Loc {
                        seg: seq,
                        offset: u32::try_from(at).expect("segments < 4 GiB"),
                        len: u32::try_from(len).expect("records < 4 GiB"),
                    };
                    self.index.apply(&record, loc);
                    if let Record::Hole { .. } = record {
                        self.after_damage = true;
                    } else {
                        self.last_lsn = lsn;
                        self.after_damage = false;
                        self.records += 1;
                    }
                    at += len;
                    progress.records.fetch_add(1, Ordering::Relaxed);
                }
                Action::Truncate => {
                    let cut = buf.len() - at;
                    tracing::warn!(group = self.group, file = %path.display(), offset = at, bytes = cut,
                        "truncating torn tail ({why})");
                    file.set_len(at as u64).map_err(io_err("truncate", &path))?;
                    file.sync_data().map_err(io_err("fdatasync", &path))?;
                    self.truncated += cut as u64;
                    return Ok(at as u64);
                }
                Action::Quarantine => {
                    let end = later.unwrap_or(buf.len());
                    self.quarantine(seq, file, buf, at, end, later, why)?;
                    at = end;
                    self.after_damage = true;
                }
                Action::Fail => {
                    let detail = match &parsed {
                        Some((lsn, ..)) => format!("record lsn {lsn} after lsn {}", self.last_lsn),
                        None => unparseable,
                    };
                    return Err(self.fail(&path, at, format!("{why}: {detail}")));
                }
            }
        }
        Ok(buf.len() as u64)
    }

    #[allow(clippy::too_many_arguments)]
    fn quarantine(
        &mut self,
        seq: u32,
        file: &Arc<dyn StorageFile>,
        buf: &mut [u8],
        at: usize,
        end: usize,
        later: Option<usize>,
        why: &str,
    ) -> Result<(), StoreError> {
        let path = segment::segment_path(self.dir, seq);
        let damaged = &buf[at..end];
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
        let records_lost = later.and_then(|l| match record::decode(self.salt, &buf[l..]) {
            Decoded::Record { lsn, .. } if lsn > 0 => Some(lsn - self.last_lsn - 1),
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
        if end - at >= RECORD_HEADER_BYTES {
            let holes = hole_records(end - at);
            let mut patch = Vec::with_capacity(end - at);
            for body_len in holes {
                record::encode(self.salt, 0, &Record::Hole { body_len }, &mut patch);
            }
            debug_assert_eq!(patch.len(), end - at);
            file.write_all_at(&patch, at as u64)
                .map_err(io_err("write", &path))?;
            buf[at..end].copy_from_slice(&patch);
        } else {
            file.set_len(at as u64).map_err(io_err("truncate", &path))?;
        }
        file.sync_data().map_err(io_err("fdatasync", &path))?;
        let report = DamageReport {
            group: self.group,
            file: path,
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

/// Recovers group `group` stored in `dir`, whose records are checksummed
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
    storage
        .create_dir_all(dir)
        .map_err(io_err("create dir", dir))?;
    let names = storage.list(dir).map_err(io_err("list", dir))?;
    let mut seqs: Vec<u32> = names
        .iter()
        .filter_map(|n| segment::parse_segment_name(n))
        .collect();
    seqs.sort_unstable();
    let mut ckpt_nos: Vec<u64> = names
        .iter()
        .filter_map(|n| checkpoint::parse_checkpoint_name(n))
        .collect();
    ckpt_nos.sort_unstable();
    if names.iter().any(|n| n == CHECKPOINT_TMP_NAME) {
        let tmp = dir.join(CHECKPOINT_TMP_NAME);
        storage.remove(&tmp).map_err(io_err("remove", &tmp))?;
    }

    // Newest valid checkpoint whose journal is complete.
    let mut chosen: Option<(CheckpointInfo, Index)> = None;
    let mut valid_ckpts = Vec::new();
    let mut ignored = Vec::new();
    for &no in ckpt_nos.iter().rev() {
        let path = dir.join(checkpoint::checkpoint_name(no));
        match read_all(storage, &path).and_then(|b| checkpoint::decode(group, &b, &path)) {
            Ok((info, index)) => {
                valid_ckpts.push((no, info));
                if chosen.is_none() {
                    chosen = Some((info, index));
                }
            }
            // Checksummed, but written by another format: refuse rather
            // than fall back past it (the journal after it may be newer too).
            Err(e @ StoreError::FormatVersion { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(group, file = %path.display(), error = %e, "ignoring invalid checkpoint");
                ignored.push(path);
            }
        }
    }
    valid_ckpts.reverse();
    let checkpoint_used = chosen.as_ref().map(|(info, _)| info.lsn);
    let (replay, mut index, last_lsn) = match chosen {
        Some((info, index)) => (info.replay, index, info.lsn),
        None => {
            if seqs.first().is_some_and(|&s| s != 1) {
                return Err(StoreError::Recovery {
                    group,
                    path: dir.to_path_buf(),
                    offset: 0,
                    reason: format!(
                        "no valid checkpoint, and the journal before segment {} was reclaimed",
                        seqs[0]
                    ),
                });
            }
            (
                ReplayFrom {
                    seg: 1,
                    offset: SEGMENT_HEADER_BYTES as u64,
                },
                Index::default(),
                0,
            )
        }
    };
    // The replayed segments must be consecutive.
    let tail: Vec<u32> = seqs.iter().copied().filter(|&s| s >= replay.seg).collect();
    for (i, &s) in tail.iter().enumerate() {
        let expected = replay.seg + u32::try_from(i).expect("few segments");
        if s != expected {
            return Err(StoreError::Recovery {
                group,
                path: segment::segment_path(dir, expected),
                offset: 0,
                reason: format!("segment {expected} is missing from the journal to replay"),
            });
        }
    }

    let mut segments = BTreeMap::new();
    for &s in &seqs {
        let path = segment::segment_path(dir, s);
        let file = storage.open(&path).map_err(io_err("open", &path))?;
        let len = file.len().map_err(io_err("stat", &path))?;
        if len > u64::from(u32::MAX) {
            return Err(StoreError::Recovery {
                group,
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
            progress.bytes_total.fetch_add(len, Ordering::Relaxed);
        }
        segments.insert(s, SegFile { file, len });
    }

    let mut scan = Scan {
        storage,
        group,
        salt,
        dir,
        index: std::mem::take(&mut index),
        last_lsn,
        after_damage: false,
        damage: Vec::new(),
        records: 0,
        truncated: 0,
    };
    let mut bytes_scanned = 0;
    let last_seq = seqs.last().copied();
    for &s in &tail {
        let path = segment::segment_path(dir, s);
        let seg = segments.get(&s).expect("opened above");
        let mut buf = vec![0u8; usize::try_from(seg.len).expect("segment fits memory")];
        seg.file
            .read_exact_at(&mut buf, 0)
            .map_err(io_err("read", &path))?;
        let last = Some(s) == last_seq;
        let header = match segment::check_header(&buf, group, s) {
            HeaderCheck::Ok => Header::Ok,
            HeaderCheck::Torn => Header::Torn,
            HeaderCheck::Foreign(_) => Header::Foreign,
        };
        let valid_records = header != Header::Ok
            && next_valid(salt, &buf, SEGMENT_HEADER_BYTES, scan.last_lsn).is_some();
        let (action, why) = decide_segment(&SegmentCase {
            header,
            last_segment: last,
            valid_records,
        });
        match action {
            Action::Apply => {
                let start = if s == replay.seg {
                    replay.offset
                } else {
                    SEGMENT_HEADER_BYTES as u64
                };
                let start = usize::try_from(start).expect("fits");
                if start > buf.len() {
                    return Err(scan.fail(
                        &path,
                        start,
                        format!(
                            "checkpoint replays from offset {start} beyond the end ({})",
                            buf.len()
                        ),
                    ));
                }
                let file = Arc::clone(&seg.file);
                let new_len = scan.segment(s, &file, &mut buf, start, last, progress)?;
                segments.get_mut(&s).expect("present").len = new_len;
            }
            Action::Truncate => {
                tracing::warn!(group, file = %path.display(), "removing segment ({why})");
                storage.remove(&path).map_err(io_err("remove", &path))?;
                storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
                scan.truncated += buf.len() as u64;
                segments.remove(&s);
            }
            Action::Quarantine | Action::Fail => {
                let detail = match segment::check_header(&buf, group, s) {
                    HeaderCheck::Foreign(d) => format!("{why}: {d}"),
                    _ => why.to_owned(),
                };
                return Err(scan.fail(&path, 0, detail));
            }
        }
        bytes_scanned += buf.len() as u64;
        progress
            .bytes_done
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
    }

    // A segment the index still needs is gone: deleted by hand, lost with a
    // disk, or (before the fix that syncs relocations first) unlinked ahead
    // of compaction's copies. Refuse, unless the operator accepted the loss.
    let missing: Vec<u32> = scan
        .index
        .iter_live()
        .map(|m| m.loc.seg)
        .filter(|s| !segments.contains_key(s))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if let (Some(&first), false) = (missing.first(), accept_missing_segments) {
        let held = scan
            .index
            .iter_live()
            .filter(|m| missing.contains(&m.loc.seg))
            .count();
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
    let index_from_journal = missing.is_empty();
    for s in missing {
        let lost = scan.index.drop_segment(s);
        let mut queues: Vec<QueueId> = lost.iter().flat_map(|m| m.queues.iter().copied()).collect();
        queues.sort_unstable();
        queues.dedup();
        let path = segment::segment_path(dir, s);
        tracing::error!(group, file = %path.display(), messages = lost.len(), queues = ?queues,
            "segment holding live messages is missing; its messages are dropped (accept_missing_segments)");
        scan.damage.push(DamageReport {
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

    // After the segments that survived: a removed torn segment's number is
    // reused, so numbering stays consecutive.
    let next_seq = segments
        .keys()
        .next_back()
        .map_or(1, |s| s + 1)
        .max(replay.seg);
    Ok(GroupRecovery {
        next_lsn: scan.last_lsn + 1,
        index: scan.index,
        segments,
        next_seq,
        checkpoints: valid_ckpts,
        next_checkpoint_no: ckpt_nos.last().map_or(1, |n| n + 1),
        damage: scan.damage,
        records_replayed: scan.records,
        bytes_scanned,
        truncated_bytes: scan.truncated,
        checkpoint_used,
        checkpoints_ignored: ignored,
        index_from_journal,
    })
}

#[cfg(test)]
mod tests;
