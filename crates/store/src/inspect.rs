//! Read-only inspection of a store's files, for the operator's tools
//! (`berth store scan|verify|backup`): what is in every segment and
//! checkpoint, and every problem found, with its file and offset.
//!
//! It reads through recovery's own scanner ([`crate::group_reader`]): the same
//! checkpoint choice, segment walk and decision tables, so it rebuilds each
//! group's index exactly as recovery would and reports as a problem exactly
//! what recovery would quarantine, skip or refuse, and as a note what it
//! would truncate or pass over. It never writes, truncates or quarantines
//! anything.
//!
//! Invariants:
//! - Nothing here writes: files are opened with [`Storage::open_read`].
//! - Works on a running broker's directories: checkpoints are read before
//!   segments, segments in ascending order, each to the length it had when
//!   opened. The writer only appends to the newest segment and deletes a
//!   segment only after the records that made it dead are durable in a
//!   later one, so this order reads a state recovery could have produced.
//!   A listed file that vanished before it was read (reclaimed meanwhile)
//!   makes the group be read again, a bounded number of times.
//! - A damaged tail of the newest segment with nothing valid after it is
//!   not a problem (a write in progress, or a torn tail that recovery
//!   truncates); anywhere else damage is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, CheckpointInfo};
use crate::decision::{Action, Reported};
use crate::error::StoreError;
use crate::group_reader::{
    CheckpointBytes, CheckpointSeen, Damage, Found, Journal, Listing, Seg, Span, Verdict, Visit,
};
use crate::index::{payload_len, Index, Loc};
use crate::manifest::{self, Manifest, MANIFEST_NAME};
use crate::record::{self, Decoded};
use crate::segment::{self, HeaderCheck, SEGMENT_HEADER_BYTES};
use crate::storage::Storage;
use crate::{MsgId, QueueId};

mod report;
pub use report::*;

/// Times a group is read again when files vanish under the reader.
pub const INSPECT_RETRIES_MAX: u32 = 8;

/// The store's data directories in manifest order, and its manifest.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `dirs[i]` is the directory whose manifest says `dir_index = i`.
    pub dirs: Vec<PathBuf>,
    pub manifest: Manifest,
    /// Manifest format version found on disk.
    pub manifest_version: u32,
}

impl Layout {
    /// What an operator should know about a store whose records carry no
    /// salt (created with manifest version 1: salt 0), or `None`. Such a
    /// store keeps that until it is copied into a new one, which gets a
    /// salt and re-seals every record.
    pub fn unsalted_note(&self) -> Option<&'static str> {
        (self.manifest.record_salt == 0).then_some(
            "this store is unsalted (created with manifest version 1): a record a publisher \
             embeds in a payload could pass its checksum after damage; reshape it \
             (berth serve --reshape) or back it up and restore it into new directories \
             (berth store backup, berth store restore) to give it a record salt",
        )
    }

    /// Reads the manifests of `dirs` (in any order) and checks that they
    /// are the whole of one store.
    pub fn open(storage: &dyn Storage, dirs: &[PathBuf]) -> Result<Layout, StoreError> {
        if dirs.is_empty() {
            return Err(StoreError::Config("no data directory given".into()));
        }
        let mut by_index: BTreeMap<u32, (PathBuf, Manifest)> = BTreeMap::new();
        let mut version = 0;
        let mut first: Option<Manifest> = None;
        for dir in dirs {
            let path = dir.join(MANIFEST_NAME);
            let bytes = read_file(storage, &path).map_err(|e| match e {
                StoreError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                    StoreError::Config(format!(
                        "{} holds no berth store (no {MANIFEST_NAME})",
                        dir.display()
                    ))
                }
                e => e,
            })?;
            let m = Manifest::decode(&bytes, &path)?;
            version = u32::from_le_bytes(
                bytes[manifest::MAN_OFF_VERSION..manifest::MAN_OFF_GROUP_COUNT]
                    .try_into()
                    .expect("4 bytes"),
            );
            if let Some(f) = first {
                if f.store_id != m.store_id
                    || f.group_count != m.group_count
                    || f.dir_count != m.dir_count
                {
                    return Err(StoreError::Config(format!(
                        "{} belongs to another store than {} (manifests {m:?} and {f:?})",
                        dir.display(),
                        dirs[0].display()
                    )));
                }
            }
            first = Some(m);
            if by_index.insert(m.dir_index, (dir.clone(), m)).is_some() {
                return Err(StoreError::Config(format!(
                    "data directory {} of the store is given twice",
                    m.dir_index
                )));
            }
        }
        let manifest = first.expect("dirs is not empty");
        if by_index.len() != manifest.dir_count as usize {
            let missing: Vec<u32> = (0..manifest.dir_count)
                .filter(|i| !by_index.contains_key(i))
                .collect();
            return Err(StoreError::Config(format!(
                "the store has {} data directories; given {}, missing number(s) {missing:?}",
                manifest.dir_count,
                by_index.len()
            )));
        }
        Ok(Layout {
            dirs: by_index.into_values().map(|(d, _)| d).collect(),
            manifest,
            manifest_version: version,
        })
    }

    /// Directory of group `g`.
    pub fn group_dir(&self, g: u32) -> PathBuf {
        self.dirs[g as usize % self.dirs.len()].join(format!("group-{g:04}"))
    }
}

/// A Publish/Relocate record found in the journal.
#[derive(Clone, Copy)]
struct Located {
    msg: MsgId,
    len: u32,
}

/// Reads group `g` of the store, retrying while files vanish under it (a
/// running broker reclaiming segments). `progress` is told the bytes read.
pub fn inspect_group(
    storage: &dyn Storage,
    layout: &Layout,
    g: u32,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GroupReport, StoreError> {
    let mut attempt = 0;
    loop {
        match read_group(storage, layout, g, progress) {
            Err(StoreError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound && attempt < INSPECT_RETRIES_MAX =>
            {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Inspection's side of the journal walk: reports every action the
/// tables give ([`Action::reported_as`]) and gathers the statistics.
struct Inspecting<'a> {
    storage: &'a dyn Storage,
    progress: &'a (dyn Fn(u64) + Sync),
    rep: GroupReport,
    /// Every valid checkpoint's index, to check against the journal.
    checkpoint_indexes: Vec<(u64, PathBuf, Index)>,
    /// Publish/Relocate records by (segment, offset).
    found: HashMap<(u32, u32), Located>,
    published_queues: HashSet<QueueId>,
    /// The segment being walked.
    segment: SegmentReport,
}

impl Inspecting<'_> {
    /// Files what a reader found under the heading its action gives it.
    fn report(&mut self, action: Action, file: &Path, offset: u64, what: String) {
        let item = Problem {
            file: file.to_path_buf(),
            offset,
            what,
        };
        match action.reported_as() {
            Reported::Silent => {}
            Reported::Note => self.rep.notes.push(item),
            Reported::Problem => self.rep.problems.push(item),
        }
    }
}

impl Visit for Inspecting<'_> {
    fn read_checkpoint(&mut self, path: &Path) -> CheckpointBytes {
        let bytes = read_file(self.storage, path)?;
        (self.progress)(bytes.len() as u64);
        Ok(Ok(bytes))
    }

    fn unfinished_checkpoint(&mut self, path: &Path, verdict: Verdict) -> Result<(), StoreError> {
        self.report(verdict.action, path, 0, verdict.why.to_owned());
        Ok(())
    }

    fn checkpoint(&mut self, seen: CheckpointSeen<'_>) -> Result<(), StoreError> {
        let mut cr = CheckpointReport {
            no: seen.no,
            path: seen.path.to_path_buf(),
            bytes: seen.bytes,
            info: None,
            messages: 0,
        };
        match seen.decoded {
            Ok((link, index)) => {
                cr.info = Some(link.info);
                if seen.chosen {
                    self.rep.checkpoint_used = Some(seen.no);
                }
                // Only the chosen link's index is built (a delta's is its
                // whole chain's): that one is checked against the journal.
                if let Some(index) = index {
                    cr.messages = index.live_messages() as u64;
                    self.checkpoint_indexes
                        .push((seen.no, seen.path.to_path_buf(), index.clone()));
                }
            }
            Err(e) => {
                let p = problem_of(&e, seen.path);
                self.report(seen.verdict.action, &p.file, p.offset, p.what);
            }
        }
        self.rep.checkpoints.push(cr);
        Ok(())
    }

    fn load_segment(&mut self, _seq: u32, path: &Path) -> Result<Vec<u8>, StoreError> {
        let bytes = read_file(self.storage, path)?;
        (self.progress)(bytes.len() as u64);
        Ok(bytes)
    }

    fn missing(&mut self, seq: u32, verdict: Verdict) -> Result<(), StoreError> {
        let file = self.rep.dir.join(segment::segment_name(seq));
        self.report(verdict.action, &file, 0, verdict.why.to_owned());
        Ok(())
    }

    fn header(&mut self, seg: &Seg<'_>) -> Result<(), StoreError> {
        let Verdict { action, why } = seg.verdict;
        self.segment = SegmentReport {
            seq: seg.seq,
            path: seg.path.to_path_buf(),
            bytes: seg.bytes.len() as u64,
            ..SegmentReport::default()
        };
        let what = match (&seg.header, action) {
            (_, Action::Truncate) => {
                format!("segment being created (or its creation torn by a crash): {why}")
            }
            (HeaderCheck::Foreign(d), _) => format!("segment header: {d} ({why})"),
            _ => format!("segment header fails its checksum ({why})"),
        };
        self.report(action, seg.path, 0, what);
        Ok(())
    }

    fn record(&mut self, seg: &Seg<'_>, found: &Found<'_>) -> Result<(), StoreError> {
        let Verdict { action, why } = found.verdict;
        let (at, lsn) = (found.at, found.lsn);
        if let (Action::Fail, Some(prev)) = (action, found.prev_lsn) {
            let what = format!(
                "record lsn {lsn} follows lsn {prev} (expected {}): {why}",
                prev + 1
            );
            self.report(action, seg.path, at as u64, what);
        }
        let sr = &mut self.segment;
        if lsn != 0 {
            // Not a Hole: recovery reported that loss when it wrote it.
            sr.first_lsn.get_or_insert(lsn);
            sr.last_lsn = Some(lsn);
        }
        sr.records += 1;
        if let Some((msg, queues, payload)) = found.record.message() {
            let offset = u32::try_from(at).expect("segments are below 4 GiB");
            let len = u32::try_from(found.len).expect("records are below 4 GiB");
            self.found.insert((seg.seq, offset), Located { msg, len });
            if found.record.kind() == record::Kind::Publish {
                sr.publishes += 1;
                self.rep.sizes.add(payload.len() as u64);
                self.published_queues.extend(queues.iter().copied());
            }
        }
        if found.in_replay {
            self.rep.replay_records += 1;
            self.rep.replay_bytes += found.len as u64;
        }
        Ok(())
    }

    fn damage(&mut self, seg: &Seg<'_>, d: &Damage<'_>) -> Result<(), StoreError> {
        let Verdict { action, why } = d.verdict;
        let (at, end) = (d.at, d.end);
        if action == Action::End {
            // A prepared segment's unwritten rest: nothing to report.
            return Ok(());
        }
        if action == Action::Truncate {
            self.segment.tail_bytes = (seg.bytes.len() - at) as u64;
            let what = format!(
                "{} bytes at the end are not a whole record yet (a write in progress, \
                 or a torn tail that recovery truncates)",
                self.segment.tail_bytes
            );
            self.report(action, seg.path, at as u64, what);
            return Ok(());
        }
        let what = match &d.decoded {
            Decoded::Incomplete { needed } if seg.newest => {
                format!("record cut short (needs {needed} bytes)")
            }
            Decoded::Incomplete { needed } => {
                format!("record cut short (needs {needed} bytes) in a sealed segment")
            }
            Decoded::Corrupt(record::Corruption::Checksum { stored, computed }) => {
                format!("damaged record: checksum {stored:#010x} stored, {computed:#010x} computed")
            }
            Decoded::Corrupt(record::Corruption::LengthTooLarge(n)) => {
                format!("damaged record: length {n} exceeds the largest record")
            }
            Decoded::Unparseable { reason, .. } => {
                format!("record checksum passes but the body does not parse: {reason}")
            }
            Decoded::Record { .. } => unreachable!("a record is not damage"),
        };
        let what = format!("{what}; {} bytes unreadable ({why})", end - at);
        self.report(action, seg.path, at as u64, what);
        self.segment.tail_bytes = if d.later.is_none() {
            (end - at) as u64
        } else {
            0
        };
        Ok(())
    }

    fn segment_end(
        &mut self,
        _seg: &Seg<'_>,
        _scanned_to: Option<usize>,
    ) -> Result<(), StoreError> {
        let sr = std::mem::take(&mut self.segment);
        self.rep.segments.push(sr);
        Ok(())
    }
}

fn read_group(
    storage: &dyn Storage,
    layout: &Layout,
    g: u32,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GroupReport, StoreError> {
    let dir = layout.group_dir(g);
    let mut rep = GroupReport {
        group: g,
        dir: dir.clone(),
        ..GroupReport::default()
    };
    let names = match storage.list(&dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A group nothing was ever written to may have no directory.
            rep.notes.push(Problem {
                file: dir,
                offset: 0,
                what: "group directory absent (nothing written to this group yet)".into(),
            });
            return Ok(rep);
        }
        Err(e) => return Err(StoreError::io("list", &dir, e)),
    };
    let listing = Listing::of(&names);
    let journal = Journal {
        group: g,
        salt: layout.manifest.record_salt,
        dir: &dir,
        listing: &listing,
    };
    let mut v = Inspecting {
        storage,
        progress,
        rep,
        checkpoint_indexes: Vec::new(),
        found: HashMap::new(),
        published_queues: HashSet::new(),
        segment: SegmentReport::default(),
    };
    // Checkpoints first (see the module invariants), newest chosen.
    let start = journal.choose_checkpoint(&mut v)?;
    v.rep.checkpoints.reverse();
    if start.verdict.action != Action::Apply {
        if let Some(&first) = listing.segments.first() {
            let file = dir.join(segment::segment_name(first));
            let what = format!("{}: the group cannot be rebuilt", start.verdict.why);
            v.report(start.verdict.action, &file, 0, what);
        }
    }
    for n in &listing.quarantines {
        v.rep.notes.push(Problem {
            file: dir.join(n),
            offset: 0,
            what: "bytes an earlier recovery found damaged and set aside (its log named the \
                   messages lost); the journal holds a Hole record in their place"
                .into(),
        });
    }
    let start_lsn = start.lsn;
    let walked = journal.walk(start, Span::Whole, &mut v)?;
    let mut index = walked.index;
    v.rep.last_lsn = start_lsn.max(walked.last_lsn.unwrap_or(0));
    v.check_checkpoints(&listing.segments, layout.manifest.record_salt);
    v.count_live(&listing.segments, &index);
    v.rep.queues_published = v.published_queues.len() as u64;
    v.rep.meta = std::mem::take(&mut index.meta);
    Ok(v.rep)
}

impl Inspecting<'_> {
    /// Every checkpoint against the journal: its replay position starts a
    /// record (or ends the journal), and the messages it lists are where it
    /// says, unless their segment was reclaimed since (then the journal
    /// after it must have removed them: checked on the final index).
    fn check_checkpoints(&mut self, seqs: &[u32], salt: u32) {
        for (no, path, ck_index) in std::mem::take(&mut self.checkpoint_indexes) {
            let rep = &mut self.rep;
            let info = rep
                .checkpoints
                .iter()
                .find(|c| c.no == no)
                .and_then(|c| c.info)
                .expect("decoded above");
            if let Some(s) = rep.segments.iter().find(|s| s.seq == info.replay.seg) {
                let boundary = info.replay.offset == SEGMENT_HEADER_BYTES as u64
                    || info.replay.offset == s.bytes - s.tail_bytes
                    || self.found.contains_key(&(
                        info.replay.seg,
                        u32::try_from(info.replay.offset).unwrap_or(u32::MAX),
                    ))
                    || starts_record(self.storage, &s.path, info.replay.offset, salt);
                if !boundary {
                    rep.problems.push(Problem {
                        file: path.clone(),
                        offset: checkpoint::CK_OFF_REPLAY_OFFSET as u64,
                        what: format!(
                            "replay position {}:{} is not a record boundary in the journal",
                            info.replay.seg, info.replay.offset
                        ),
                    });
                }
            }
            check_refs(rep, &self.found, seqs, &ck_index, &path, "checkpoint lists");
        }
    }

    /// Every index reference of the rebuilt state, and what is live where.
    fn count_live(&mut self, seqs: &[u32], index: &Index) {
        let rep = &mut self.rep;
        let dir = rep.dir.clone();
        check_refs(rep, &self.found, seqs, index, &dir, "live message");
        for (q, st) in index.streams() {
            for span in st.spans() {
                if !seqs.contains(&span.seg) {
                    rep.problems.push(Problem {
                        file: dir.join(segment::segment_name(span.seg)),
                        offset: u64::from(span.points[0].pos),
                        what: format!(
                            "{} records of stream {q} are in this missing segment",
                            span.count
                        ),
                    });
                }
            }
            rep.streams.insert(q, st.clone());
        }
        for m in index.iter_live() {
            if !seqs.contains(&m.loc.seg) {
                rep.problems.push(Problem {
                    file: dir.join(segment::segment_name(m.loc.seg)),
                    offset: u64::from(m.loc.offset),
                    what: format!(
                        "live message {} of {:?} is in this missing segment",
                        m.msg, m.queues
                    ),
                });
            }
            let len = u64::from(payload_len(m.loc.len, m.queues.len()));
            rep.live_messages += 1;
            rep.live_payload_bytes += len;
            for q in &m.queues {
                let qr = rep.queues.entry(*q).or_default();
                qr.messages += 1;
                qr.bytes += len;
                if qr.oldest.is_none_or(|(o, _)| m.msg < o) {
                    qr.oldest = Some((m.msg, m.loc.seg));
                }
                let at = (m.msg, m.loc);
                rep.queue_segments
                    .entry((*q, m.loc.seg))
                    .and_modify(|r| {
                        r.messages += 1;
                        r.bytes += len;
                        if m.msg < r.oldest.0 {
                            r.oldest = at;
                        }
                        if m.msg > r.newest.0 {
                            r.newest = at;
                        }
                    })
                    .or_insert(QueueSegmentReport {
                        messages: 1,
                        bytes: len,
                        oldest: at,
                        newest: at,
                    });
            }
        }
        for s in &mut rep.segments {
            let live = index.seg_live(s.seq);
            s.live_messages = live.count;
            s.live_bytes = live.bytes;
            s.dead_bytes = s
                .bytes
                .saturating_sub(SEGMENT_HEADER_BYTES as u64 + live.bytes + s.tail_bytes);
        }
    }
}

/// Reads the payload of live message `msg` at `loc` in group `g` back
/// (read-only), checked against its record's CRC.
pub fn read_payload(
    storage: &dyn Storage,
    layout: &Layout,
    g: u32,
    msg: MsgId,
    loc: Loc,
) -> Result<Vec<u8>, StoreError> {
    let path = layout.group_dir(g).join(segment::segment_name(loc.seg));
    let f = storage
        .open_read(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    let mut buf = vec![0u8; loc.len as usize];
    f.read_exact_at(&mut buf, u64::from(loc.offset))
        .map_err(|e| StoreError::io("read", &path, e))?;
    match record::message_payload(layout.manifest.record_salt, &buf, msg) {
        Ok(p) => Ok(p.to_vec()),
        Err(other) => Err(StoreError::Corrupt {
            path,
            offset: u64::from(loc.offset),
            reason: format!("record of {msg} does not verify: {other:?}"),
        }),
    }
}

/// The payload of the newest record of stream `queue` in `span` (group
/// `g`), found by scanning from the span's last index point.
pub fn read_stream_last(
    storage: &dyn Storage,
    layout: &Layout,
    g: u32,
    queue: QueueId,
    span: &crate::stream_index::Span,
) -> Result<Vec<u8>, StoreError> {
    let path = layout.group_dir(g).join(segment::segment_name(span.seg));
    let f = storage
        .open_read(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    let start = span.points.last().map_or(0, |p| p.pos);
    let mut buf = vec![0u8; span.end.saturating_sub(start) as usize];
    f.read_exact_at(&mut buf, u64::from(start))
        .map_err(|e| StoreError::io("read", &path, e))?;
    let mut at = 0;
    let mut last = None;
    while at < buf.len() {
        match record::decode(layout.manifest.record_salt, &buf[at..]) {
            record::Decoded::Record { record, len, .. } => {
                if let record::Record::Append {
                    queue: q, payload, ..
                } = record
                {
                    if q == queue {
                        last = Some(payload.to_vec());
                    }
                }
                at += len;
            }
            other => {
                return Err(StoreError::Corrupt {
                    path,
                    offset: u64::from(start) + at as u64,
                    reason: format!("stream {queue}'s record does not verify: {other:?}"),
                })
            }
        }
    }
    last.ok_or_else(|| StoreError::Corrupt {
        path,
        offset: u64::from(start),
        reason: format!("no record of stream {queue} where its index points"),
    })
}

/// Tries of [`read_file`] at a file that shrinks under it.
const READ_FILE_TRIES: usize = 3;

/// Reads a whole file, read-only. On a running broker the newest segment
/// can shrink between the size and the read (the writer cuts a prepared
/// segment's unwritten zeros off when it seals it): the read then ends
/// early and is made again at the new size, a few times.
pub fn read_file(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>, StoreError> {
    let f = storage
        .open_read(path)
        .map_err(|e| StoreError::io("open", path, e))?;
    let mut tries = 0;
    loop {
        let len = f.len().map_err(|e| StoreError::io("stat", path, e))?;
        let len = usize::try_from(len).map_err(|e| StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason: format!("file of {len} bytes does not fit in memory: {e}"),
        })?;
        let mut buf = vec![0u8; len];
        match f.read_exact_at(&mut buf, 0) {
            Ok(()) => return Ok(buf),
            Err(e)
                if e.kind() == std::io::ErrorKind::UnexpectedEof && tries + 1 < READ_FILE_TRIES =>
            {
                tries += 1;
            }
            Err(e) => return Err(StoreError::io("read", path, e)),
        }
    }
}

/// Whether a whole valid record starts at `offset` of `path`.
fn starts_record(storage: &dyn Storage, path: &Path, offset: u64, salt: u32) -> bool {
    read_file(storage, path).is_ok_and(|b| {
        usize::try_from(offset)
            .ok()
            .and_then(|o| b.get(o..))
            .is_some_and(|rest| matches!(record::decode(salt, rest), Decoded::Record { .. }))
    })
}

/// Checks that every message of `index` located in a present segment has
/// its Publish/Relocate record there.
fn check_refs(
    rep: &mut GroupReport,
    found: &HashMap<(u32, u32), Located>,
    seqs: &[u32],
    index: &Index,
    file: &Path,
    what: &str,
) {
    let mut bad: Vec<(MsgId, Loc)> = index
        .iter_live()
        .filter(|m| seqs.contains(&m.loc.seg))
        .filter(|m| {
            found
                .get(&(m.loc.seg, m.loc.offset))
                .is_none_or(|f| f.msg != m.msg || f.len != m.loc.len)
        })
        .map(|m| (m.msg, m.loc))
        .collect();
    bad.sort_unstable_by_key(|(m, _)| *m);
    for (msg, loc) in bad {
        rep.problems.push(Problem {
            file: file.to_path_buf(),
            offset: 0,
            what: format!(
                "{what} {msg} at segment {} offset {} ({} bytes), where the journal has no such record",
                loc.seg, loc.offset, loc.len
            ),
        });
    }
}

fn problem_of(e: &StoreError, path: &Path) -> Problem {
    match e {
        StoreError::Corrupt {
            path,
            offset,
            reason,
        } => Problem {
            file: path.clone(),
            offset: *offset,
            what: reason.clone(),
        },
        other => Problem {
            file: path.to_path_buf(),
            offset: 0,
            what: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::read_file;
    use crate::fault::FaultStorage;
    use crate::hooked::{FileHooks, Hooked};
    use crate::storage::Storage;

    /// Once set, the next size asked for is stale: the size a segment had
    /// before the writer cut its prepared zeros off.
    struct StaleOnce(AtomicBool);

    impl FileHooks for StaleOnce {
        fn len(&self, _: &Path, len: u64) -> u64 {
            if self.0.swap(false, Ordering::Relaxed) {
                len + 4096
            } else {
                len
            }
        }
    }

    #[test]
    fn a_file_cut_between_its_size_and_the_read_is_read_at_its_new_size() {
        let storage = Hooked {
            inner: FaultStorage::new(1),
            hooks: Arc::new(StaleOnce(AtomicBool::new(false))),
        };
        let path = Path::new("/g/0000000005.seg");
        storage.create_dir_all(Path::new("/g")).unwrap();
        let file = storage.create(path).unwrap();
        file.write_all_at(b"the records before the cut", 0).unwrap();
        storage.hooks.0.store(true, Ordering::Relaxed);

        let read = read_file(&storage, path).expect("the read is made again at the new size");
        assert_eq!(read, b"the records before the cut");
    }
}
