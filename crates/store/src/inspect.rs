//! Read-only inspection of a store's files, for the operator's tools
//! (`berth store scan|verify|backup`): what is in every segment and
//! checkpoint, and every problem found, with its file and offset.
//!
//! It decodes with the store's own codecs (`record`, `checkpoint`,
//! `manifest`, `segment`) and rebuilds each group's index exactly as
//! recovery would (newest valid checkpoint + the journal after it, through
//! [`Index::apply`]), but never writes, truncates or quarantines anything.
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
//! - An incomplete record at the end of the newest segment is not a
//!   problem (a write in progress, or a torn tail that recovery
//!   truncates); anywhere else it is.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, CheckpointInfo, ReplayFrom, CHECKPOINT_TMP_NAME};
use crate::error::StoreError;
use crate::index::{payload_len, Index, Loc};
use crate::manifest::{self, Manifest, MANIFEST_NAME};
use crate::record::{self, Decoded, Record};
use crate::segment::{self, HeaderCheck, SEGMENT_HEADER_BYTES};
use crate::storage::Storage;
use crate::{MsgId, QueueId};

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

/// Something wrong, where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub offset: u64,
    pub what: String,
}

/// One segment as read.
#[derive(Clone, Debug, Default)]
pub struct SegmentReport {
    pub seq: u32,
    pub path: PathBuf,
    /// File length when read.
    pub bytes: u64,
    pub records: u64,
    pub publishes: u64,
    pub first_lsn: Option<u64>,
    pub last_lsn: Option<u64>,
    /// Records of messages still live (per the rebuilt index) in this
    /// segment: count and bytes.
    pub live_messages: u64,
    pub live_bytes: u64,
    /// Bytes after the header that are not live message records
    /// (acks, metadata, dead messages): what compaction could reclaim.
    pub dead_bytes: u64,
    /// Bytes at the end that do not (yet) form a whole record.
    pub tail_bytes: u64,
}

/// One checkpoint file as read.
#[derive(Clone, Debug)]
pub struct CheckpointReport {
    pub no: u64,
    pub path: PathBuf,
    pub bytes: u64,
    /// `None` when it does not decode (see the problems).
    pub info: Option<CheckpointInfo>,
    pub messages: u64,
}

/// Live messages of one queue in one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueReport {
    pub messages: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Oldest live message (ids grow in publish order) and its segment.
    pub oldest: Option<(MsgId, u32)>,
}

/// Message-size histogram with log-2 buckets: bucket `i` counts sizes in
/// `[2^i, 2^(i+1))`, bucket 0 also counts size 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    pub buckets: BTreeMap<u32, u64>,
    pub count: u64,
    pub sum: u64,
    pub max: u64,
}

impl Histogram {
    pub fn add(&mut self, size: u64) {
        let bucket = if size < 2 { 0 } else { size.ilog2() };
        *self.buckets.entry(bucket).or_default() += 1;
        self.count += 1;
        self.sum += size;
        self.max = self.max.max(size);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (b, n) in &other.buckets {
            *self.buckets.entry(*b).or_default() += n;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Upper bound (exclusive) of the bucket holding the `q`-quantile
    /// (0.0..=1.0), capped at the largest size seen.
    pub fn quantile_upper(&self, q: f64) -> u64 {
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        #[allow(clippy::cast_sign_loss)]
        let rank = ((self.count as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (b, n) in &self.buckets {
            seen += n;
            if seen >= rank.max(1) {
                return (1u64 << (b + 1)).min(self.max.max(1));
            }
        }
        self.max
    }
}

/// Everything read from one group.
#[derive(Clone, Debug, Default)]
pub struct GroupReport {
    pub group: u32,
    pub dir: PathBuf,
    pub segments: Vec<SegmentReport>,
    pub checkpoints: Vec<CheckpointReport>,
    /// Checkpoint number the index was rebuilt from.
    pub checkpoint_used: Option<u64>,
    /// Restart cost: records and bytes after the checkpoint used.
    pub replay_records: u64,
    pub replay_bytes: u64,
    pub last_lsn: u64,
    pub live_messages: u64,
    pub live_payload_bytes: u64,
    pub queues: BTreeMap<QueueId, QueueReport>,
    /// Payload sizes of every Publish record in the journal.
    pub sizes: Histogram,
    /// Distinct queues named by Publish records in the journal.
    pub queues_published: u64,
    /// Metadata as rebuilt (the broker's definitions).
    pub meta: BTreeMap<Vec<u8>, Vec<u8>>,
    pub problems: Vec<Problem>,
    /// Not damage: a write in progress at the tail, a leftover temp file.
    pub notes: Vec<Problem>,
}

/// A Publish/Relocate record found in the journal.
#[derive(Clone, Copy)]
struct Found {
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

fn read_group(
    storage: &dyn Storage,
    layout: &Layout,
    g: u32,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GroupReport, StoreError> {
    let dir = layout.group_dir(g);
    let salt = layout.manifest.record_salt;
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
        rep.notes.push(Problem {
            file: dir.join(CHECKPOINT_TMP_NAME),
            offset: 0,
            what: "checkpoint being written (or left by a crash; removed at start)".into(),
        });
    }

    // Checkpoints first (see the module invariants), newest chosen.
    let mut chosen: Option<(u64, CheckpointInfo, Index)> = None;
    let mut ckpt_indexes: Vec<(u64, PathBuf, Index)> = Vec::new();
    for &no in ckpt_nos.iter().rev() {
        let path = dir.join(checkpoint::checkpoint_name(no));
        let bytes = read_file(storage, &path)?;
        progress(bytes.len() as u64);
        let mut cr = CheckpointReport {
            no,
            path: path.clone(),
            bytes: bytes.len() as u64,
            info: None,
            messages: 0,
        };
        match checkpoint::decode(g, &bytes, &path) {
            Ok((info, index)) => {
                cr.info = Some(info);
                cr.messages = index.live_messages() as u64;
                if chosen.is_none() {
                    chosen = Some((no, info, index.clone()));
                }
                ckpt_indexes.push((no, path.clone(), index));
            }
            Err(e) => rep.problems.push(problem_of(&e, &path)),
        }
        rep.checkpoints.push(cr);
    }
    rep.checkpoints.reverse();

    let (replay, mut index, mut last_lsn) = match chosen {
        Some((no, info, index)) => {
            rep.checkpoint_used = Some(no);
            (info.replay, index, info.lsn)
        }
        None => {
            if let Some(&first) = seqs.first().filter(|&&s| s != 1) {
                rep.problems.push(Problem {
                    file: dir.join(segment::segment_name(first)),
                    offset: 0,
                    what: format!(
                        "no valid checkpoint, and the journal before segment {first} was reclaimed: \
                         the group cannot be rebuilt"
                    ),
                });
            }
            let replay = ReplayFrom {
                seg: 1,
                offset: SEGMENT_HEADER_BYTES as u64,
            };
            (replay, Index::default(), 0)
        }
    };
    if !seqs.is_empty() && !seqs.contains(&replay.seg) && replay.seg <= *seqs.last().unwrap_or(&0) {
        rep.problems.push(Problem {
            file: dir.join(segment::segment_name(replay.seg)),
            offset: replay.offset,
            what: "segment missing: replay after the checkpoint starts in it".into(),
        });
    }
    for w in seqs.windows(2) {
        for missing in w[0] + 1..w[1] {
            let file = dir.join(segment::segment_name(missing));
            if missing < replay.seg {
                // Reclaimed (compaction or deletion of a dead segment): the
                // checkpoint's index is checked below for anything still
                // located in it.
                rep.notes.push(Problem {
                    file,
                    offset: 0,
                    what: "segment reclaimed (before the checkpoint's replay start)".into(),
                });
                continue;
            }
            rep.problems.push(Problem {
                file,
                offset: 0,
                what: format!(
                    "segment missing between {} and {}",
                    segment::segment_name(w[0]),
                    segment::segment_name(w[1])
                ),
            });
        }
    }

    // The journal, oldest first.
    let mut found: HashMap<(u32, u32), Found> = HashMap::new();
    let mut published_queues: std::collections::HashSet<QueueId> = Default::default();
    let mut journal_lsn: Option<u64> = None;
    // After a Hole or a damaged range, a gap in the numbers is explained.
    let mut after_hole = false;
    for n in names.iter().filter(|n| n.starts_with("quarantine-")) {
        rep.notes.push(Problem {
            file: dir.join(n),
            offset: 0,
            what: "bytes an earlier recovery found damaged and set aside (its log named the \
                   messages lost); the journal holds a Hole record in their place"
                .into(),
        });
    }
    let newest = seqs.last().copied();
    let mut prev_seq: Option<u32> = None;
    for &seq in &seqs {
        // Records of a reclaimed segment are gone: after one, before the
        // replay start, the lsn numbers jump.
        if prev_seq.is_some_and(|p| seq != p + 1) && seq <= replay.seg {
            after_hole = true;
        }
        prev_seq = Some(seq);
        let path = dir.join(segment::segment_name(seq));
        let bytes = read_file(storage, &path)?;
        progress(bytes.len() as u64);
        let mut sr = SegmentReport {
            seq,
            path: path.clone(),
            bytes: bytes.len() as u64,
            ..SegmentReport::default()
        };
        match segment::check_header(&bytes, g, seq) {
            HeaderCheck::Ok => {}
            HeaderCheck::Torn if Some(seq) == newest && bytes.len() < SEGMENT_HEADER_BYTES => {
                rep.notes.push(Problem {
                    file: path,
                    offset: 0,
                    what: "segment being created (or its creation torn by a crash)".into(),
                });
                rep.segments.push(sr);
                continue;
            }
            HeaderCheck::Torn => {
                rep.problems.push(Problem {
                    file: path,
                    offset: 0,
                    what: "segment header fails its checksum".into(),
                });
                rep.segments.push(sr);
                continue;
            }
            HeaderCheck::Foreign(why) => {
                rep.problems.push(Problem {
                    file: path,
                    offset: 0,
                    what: format!("segment header: {why}"),
                });
                rep.segments.push(sr);
                continue;
            }
        }
        let mut at = SEGMENT_HEADER_BYTES;
        while at < bytes.len() {
            let in_replay = (seq, at as u64) >= (replay.seg, replay.offset);
            match record::decode(salt, &bytes[at..]) {
                Decoded::Record { lsn, record, len } => {
                    if lsn == 0 {
                        // A Hole: recovery reported the loss when it wrote it.
                        after_hole = true;
                    } else {
                        if let Some(prev) = journal_lsn {
                            let gap_allowed = after_hole && lsn > prev;
                            if lsn != prev + 1 && !gap_allowed {
                                rep.problems.push(Problem {
                                    file: path.clone(),
                                    offset: at as u64,
                                    what: format!(
                                        "record lsn {lsn} follows lsn {prev} (expected {})",
                                        prev + 1
                                    ),
                                });
                            }
                        }
                        journal_lsn = Some(lsn);
                        after_hole = false;
                        sr.first_lsn.get_or_insert(lsn);
                        sr.last_lsn = Some(lsn);
                    }
                    sr.records += 1;
                    let loc = Loc {
                        seg: seq,
                        offset: u32::try_from(at).expect("segments are below 4 GiB"),
                        len: u32::try_from(len).expect("records are below 4 GiB"),
                    };
                    if let Record::Publish {
                        msg,
                        queues,
                        payload,
                    }
                    | Record::Relocate {
                        msg,
                        queues,
                        payload,
                    } = &record
                    {
                        found.insert(
                            (seq, loc.offset),
                            Found {
                                msg: *msg,
                                len: loc.len,
                            },
                        );
                        if record.kind() == record::Kind::Publish {
                            sr.publishes += 1;
                            rep.sizes.add(payload.len() as u64);
                            published_queues.extend(queues.iter().copied());
                        }
                    }
                    if in_replay {
                        if lsn != 0 && lsn <= last_lsn {
                            rep.problems.push(Problem {
                                file: path.clone(),
                                offset: at as u64,
                                what: format!(
                                    "record lsn {lsn} after the checkpoint, which covers up to lsn {last_lsn}"
                                ),
                            });
                        }
                        index.apply(&record, loc);
                        rep.replay_records += 1;
                        rep.replay_bytes += len as u64;
                        if lsn != 0 {
                            last_lsn = lsn;
                        }
                    }
                    at += len;
                }
                Decoded::Incomplete { .. } if Some(seq) == newest => {
                    sr.tail_bytes = (bytes.len() - at) as u64;
                    rep.notes.push(Problem {
                        file: path.clone(),
                        offset: at as u64,
                        what: format!(
                            "{} bytes at the end are not a whole record yet (a write in progress, \
                             or a torn tail that recovery truncates)",
                            sr.tail_bytes
                        ),
                    });
                    break;
                }
                bad => {
                    let why = match bad {
                        Decoded::Incomplete { needed } => {
                            format!("record cut short (needs {needed} bytes) in a sealed segment")
                        }
                        Decoded::Corrupt(record::Corruption::Checksum { stored, computed }) => {
                            format!(
                                "damaged record: checksum {stored:#010x} stored, {computed:#010x} computed"
                            )
                        }
                        Decoded::Corrupt(record::Corruption::LengthTooLarge(n)) => {
                            format!("damaged record: length {n} exceeds the largest record")
                        }
                        Decoded::Unparseable { reason, .. } => {
                            format!("record checksum passes but the body does not parse: {reason}")
                        }
                        Decoded::Record { .. } => unreachable!("matched above"),
                    };
                    // Resynchronise at the next valid record, as recovery would.
                    let next = (at + 1..bytes.len()).find(|&o| {
                        matches!(record::decode(salt, &bytes[o..]), Decoded::Record { lsn, .. }
                            if lsn == 0 || journal_lsn.is_none_or(|p| lsn > p))
                    });
                    let end = next.unwrap_or(bytes.len());
                    rep.problems.push(Problem {
                        file: path.clone(),
                        offset: at as u64,
                        what: format!("{why}; {} bytes unreadable", end - at),
                    });
                    sr.tail_bytes = if next.is_none() { (end - at) as u64 } else { 0 };
                    // The records lost there explain a gap in the numbers.
                    after_hole = true;
                    at = end;
                }
            }
        }
        rep.segments.push(sr);
    }
    rep.last_lsn = last_lsn.max(journal_lsn.unwrap_or(0));

    // Every checkpoint against the journal: its replay position starts a
    // record (or ends the journal), and the messages it lists are where it
    // says, unless their segment was reclaimed since (then the journal
    // after it must have removed them: checked on the final index below).
    for (no, path, ck_index) in &ckpt_indexes {
        let info = rep
            .checkpoints
            .iter()
            .find(|c| c.no == *no)
            .and_then(|c| c.info)
            .expect("decoded above");
        if let Some(s) = rep.segments.iter().find(|s| s.seq == info.replay.seg) {
            let boundary = info.replay.offset == SEGMENT_HEADER_BYTES as u64
                || info.replay.offset == s.bytes - s.tail_bytes
                || found.contains_key(&(
                    info.replay.seg,
                    u32::try_from(info.replay.offset).unwrap_or(u32::MAX),
                ))
                || starts_record(storage, &s.path, info.replay.offset, salt);
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
        check_refs(&mut rep, &found, &seqs, ck_index, path, "checkpoint lists");
    }

    // Every index reference of the rebuilt state.
    check_refs(&mut rep, &found, &seqs, &index, &dir, "live message");
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
    rep.queues_published = published_queues.len() as u64;
    rep.meta = std::mem::take(&mut index.meta);
    Ok(rep)
}

/// Reads a whole file, read-only.
pub fn read_file(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>, StoreError> {
    let f = storage
        .open_read(path)
        .map_err(|e| StoreError::io("open", path, e))?;
    let len = f.len().map_err(|e| StoreError::io("stat", path, e))?;
    let len = usize::try_from(len).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        reason: format!("file of {len} bytes does not fit in memory: {e}"),
    })?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(buf)
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
    found: &HashMap<(u32, u32), Found>,
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
