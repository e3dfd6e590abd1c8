//! The one reader of a log group's files: which files there are, which
//! checkpoint the index starts from, and every segment and record after
//! it, each observation looked up in the decision tables
//! ([`crate::decision`]). Recovery and inspection both read through here
//! and differ only in their [`Visit`]: recovery acts on each action,
//! inspection reports it.
//!
//! Invariants:
//! - Observations reach the visitor in journal order: the unfinished
//!   checkpoint, checkpoints newest first, missing segments, then each
//!   segment's header and records, oldest segment first.
//! - Every observation carries exactly one action from a table; nothing
//!   here decides what to do about damage.
//! - The index is rebuilt only through [`Index::apply`] (the writer's own
//!   mutator), only from records at or after the checkpoint's replay
//!   position, so a rebuilt state is the state the writer had.
//! - From the replay position on, records are judged against the
//!   checkpoint's lsn, exactly as recovery judges them, whichever part of
//!   the journal the reader started at.

use std::path::Path;

use crate::checkpoint::{
    self, CheckpointInfo, Kind, Link, Parsed, ReplayFrom, CHECKPOINT_TMP_NAME,
};
use crate::decision::{
    decide, decide_checkpoint, decide_segment, Action, Body, CheckpointCase, Frame, Header, Order,
    RecordCase, SegmentCase,
};
use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::record::{self, Decoded, Record, RECORD_HEADER_BYTES};
use crate::segment::{self, HeaderCheck, SEGMENT_HEADER_BYTES};

/// The action a table gives an observation, and the row's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub why: &'static str,
}

impl Verdict {
    fn of((action, why): (Action, &'static str)) -> Verdict {
        Verdict { action, why }
    }
}

/// A checkpoint file's bytes: the outer error stops the read, the inner
/// one makes this checkpoint `Damaged`.
pub type CheckpointBytes = Result<Result<Vec<u8>, StoreError>, StoreError>;

/// A group directory's journal files, from its listing.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Segment numbers, ascending.
    pub segments: Vec<u32>,
    /// Checkpoint numbers, ascending.
    pub checkpoints: Vec<u64>,
    /// `ckpt.tmp` is there.
    pub unfinished_checkpoint: bool,
    /// Quarantine files an earlier recovery wrote.
    pub quarantines: Vec<String>,
}

impl Listing {
    pub fn of(names: &[String]) -> Listing {
        let mut segments: Vec<u32> = names
            .iter()
            .filter_map(|n| segment::parse_segment_name(n))
            .collect();
        segments.sort_unstable();
        let mut checkpoints: Vec<u64> = names
            .iter()
            .filter_map(|n| checkpoint::parse_checkpoint_name(n))
            .collect();
        checkpoints.sort_unstable();
        Listing {
            segments,
            checkpoints,
            unfinished_checkpoint: names.iter().any(|n| n == CHECKPOINT_TMP_NAME),
            quarantines: names
                .iter()
                .filter(|n| n.starts_with("quarantine-"))
                .cloned()
                .collect(),
        }
    }

    pub fn newest_segment(&self) -> Option<u32> {
        self.segments.last().copied()
    }

    /// Numbers without a file between the oldest segment (or the replay
    /// start, if earlier) and the newest, each with its action.
    ///
    /// Also the replay start's segment when it and every later file are
    /// gone although the checkpoint recorded a position past its header:
    /// a checkpoint replays from the segment that was active when it was
    /// written, and the writer creates a segment (and fsyncs its directory)
    /// before any record in it, so that file existed durably. (A position
    /// at the header may name a segment not yet created.)
    pub fn missing(&self, replay: ReplayFrom) -> Vec<(u32, Verdict)> {
        let verdict = |seq: u32, tail: bool| {
            Verdict::of(decide_segment(&SegmentCase {
                header: Header::Missing,
                last_segment: tail,
                valid_records: false,
                before_replay: seq < replay.seg,
            }))
        };
        let mut out: Vec<(u32, Verdict)> = match (self.segments.first(), self.segments.last()) {
            (Some(&first), Some(&last)) => (first.min(replay.seg)..=last)
                .filter(|s| self.segments.binary_search(s).is_err())
                .map(|seq| (seq, verdict(seq, false)))
                .collect(),
            _ => Vec::new(),
        };
        let tail_lost = replay.offset > SEGMENT_HEADER_BYTES as u64
            && self.newest_segment().is_none_or(|last| last < replay.seg);
        if tail_lost {
            out.push((replay.seg, verdict(replay.seg, true)));
        }
        out
    }
}

type CheckpointFile = (u64, std::path::PathBuf, u64, Result<Parsed, StoreError>);

/// Marks every delta whose parent is not a valid earlier file (missing,
/// damaged, or at another lsn) damaged itself; `files` is oldest first.
fn break_chains(files: &mut [CheckpointFile]) {
    for i in 0..files.len() {
        let Ok(p) = &files[i].3 else { continue };
        let Kind::Delta {
            parent_no,
            parent_lsn,
        } = p.kind
        else {
            continue;
        };
        let parent = files[..i].iter().find(|f| f.0 == parent_no);
        let why = match parent.map(|f| &f.3) {
            None => Some(format!("its parent checkpoint {parent_no} is not there")),
            Some(Err(_)) => Some(format!("its parent checkpoint {parent_no} is not valid")),
            Some(Ok(pp)) if pp.info.lsn != parent_lsn || pp.info.lsn > p.info.lsn => Some(format!(
                "its parent checkpoint {parent_no} is at lsn {}, not {parent_lsn}",
                pp.info.lsn
            )),
            Some(Ok(_)) => None,
        };
        if let Some(reason) = why {
            files[i].3 = Err(StoreError::Corrupt {
                path: files[i].1.clone(),
                offset: checkpoint::CK_OFF_PARENT_NO as u64,
                reason: format!("checkpoint chain broken: {reason}"),
            });
        }
    }
}

/// The index at `files[at]`: its base loaded, then each delta of its chain
/// applied. On failure, the position of the link that did not load.
fn load_chain_of(files: &[CheckpointFile], at: usize) -> Result<Index, (usize, StoreError)> {
    let mut chain = vec![at];
    while let Ok(Parsed {
        kind: Kind::Delta { parent_no, .. },
        ..
    }) = &files[*chain.last().expect("not empty")].3
    {
        let i = files
            .iter()
            .position(|f| f.0 == *parent_no)
            .expect("break_chains checked every parent");
        chain.push(i);
    }
    let mut index = Index::default();
    for &i in chain.iter().rev() {
        let p = files[i]
            .3
            .as_ref()
            .expect("break_chains checked every link");
        let loaded = match p.kind {
            Kind::Base => p.load_base().map(|ix| index = ix),
            Kind::Delta { .. } => p.apply_delta(&mut index),
        };
        loaded.map_err(|e| (i, e))?;
    }
    Ok(index)
}

/// Where the index starts: a checkpoint, or the beginning of the journal.
pub struct Start {
    /// The checkpoint used: its number and header.
    pub checkpoint: Option<(u64, CheckpointInfo)>,
    pub index: Index,
    pub replay: ReplayFrom,
    /// The last lsn the start covers (0 without a checkpoint).
    pub lsn: u64,
    /// The verdict on the start itself: `Apply` from a checkpoint; without
    /// one, whether the journal is whole enough to replay.
    pub verdict: Verdict,
}

/// One checkpoint file as the scanner found it.
pub struct CheckpointSeen<'a> {
    pub no: u64,
    pub path: &'a Path,
    /// Its header, and the index if it is the chosen one (a delta's own
    /// index is its whole chain's; only the chosen link's is built).
    pub decoded: Result<(Link, Option<&'a Index>), StoreError>,
    /// Size of the file as read (0 if unreadable).
    pub bytes: u64,
    pub verdict: Verdict,
    /// This is the checkpoint the index starts from.
    pub chosen: bool,
}

/// A segment being walked.
pub struct Seg<'a> {
    pub seq: u32,
    pub path: &'a Path,
    pub bytes: &'a [u8],
    /// The group's newest segment (the one a writer may be appending to).
    pub newest: bool,
    /// Where the walk starts in it.
    pub start: usize,
    /// What its header says, and the segment table's verdict on it.
    pub header: HeaderCheck,
    pub verdict: Verdict,
}

/// An intact record found by the walk.
pub struct Found<'a> {
    pub at: usize,
    pub lsn: u64,
    pub record: Record<'a>,
    pub len: usize,
    /// At or after the checkpoint's replay position: applied to the index.
    pub in_replay: bool,
    /// The lsn of the previous numbered record walked, if any.
    pub prev_lsn: Option<u64>,
    pub verdict: Verdict,
}

/// Bytes at a record position that are not a valid record.
pub struct Damage<'a> {
    pub at: usize,
    /// Where the walk resumes: the next valid record, or the segment's end.
    pub end: usize,
    /// The next valid record in the segment, if any.
    pub later: Option<usize>,
    /// What decoding found at `at`.
    pub decoded: Decoded<'a>,
    pub prev_lsn: Option<u64>,
    pub verdict: Verdict,
}

/// What a reader does with each observation. Returning an error stops the
/// walk (recovery on `Fail`); returning `Ok` after a `Fail` goes on as
/// inspection does: past a bad record, on to the next segment.
pub trait Visit {
    fn read_checkpoint(&mut self, path: &Path) -> CheckpointBytes;
    fn unfinished_checkpoint(&mut self, path: &Path, verdict: Verdict) -> Result<(), StoreError>;
    fn checkpoint(&mut self, seen: CheckpointSeen<'_>) -> Result<(), StoreError>;
    /// The whole of segment `seq`, as long as it is now.
    fn load_segment(&mut self, seq: u32, path: &Path) -> Result<Vec<u8>, StoreError>;
    fn missing(&mut self, seq: u32, verdict: Verdict) -> Result<(), StoreError>;
    /// A segment's header (`seg.header`, `seg.verdict`).
    fn header(&mut self, seg: &Seg<'_>) -> Result<(), StoreError>;
    fn record(&mut self, seg: &Seg<'_>, found: &Found<'_>) -> Result<(), StoreError>;
    fn damage(&mut self, seg: &Seg<'_>, damage: &Damage<'_>) -> Result<(), StoreError>;
    /// The segment is done: walked up to `scanned_to`, or not walked
    /// (`None`: its header's verdict was not `Apply`).
    fn segment_end(&mut self, seg: &Seg<'_>, scanned_to: Option<usize>) -> Result<(), StoreError>;
}

/// One group's journal, as a reader sees it.
pub struct Journal<'a> {
    pub group: u32,
    /// The store's record salt: a record is valid only under it.
    pub salt: u32,
    pub dir: &'a Path,
    pub listing: &'a Listing,
}

impl Journal<'_> {
    /// Chooses the checkpoint to start from: the newest valid one, each file
    /// shown to the visitor.
    pub fn choose_checkpoint(&self, v: &mut dyn Visit) -> Result<Start, StoreError> {
        let (group, dir, listing) = (self.group, self.dir, self.listing);
        if listing.unfinished_checkpoint {
            let verdict = Verdict::of(decide_checkpoint(CheckpointCase::Unfinished));
            v.unfinished_checkpoint(&dir.join(CHECKPOINT_TMP_NAME), verdict)?;
        }
        // Every file first, oldest first: a delta is valid only with its
        // whole chain down to a base.
        let mut files: Vec<(u64, std::path::PathBuf, u64, Result<Parsed, StoreError>)> = Vec::new();
        for &no in &listing.checkpoints {
            let path = dir.join(checkpoint::checkpoint_name(no));
            let bytes = v.read_checkpoint(&path)?;
            let len = bytes.as_ref().map_or(0, |b| b.len() as u64);
            let parsed = bytes.and_then(|b| checkpoint::parse(group, b, &path));
            files.push((no, path, len, parsed));
        }
        let mut chosen: Option<(u64, CheckpointInfo, Index)> = None;
        loop {
            break_chains(&mut files);
            let Some(newest) = files.iter().rposition(|f| f.3.is_ok()) else {
                break;
            };
            match load_chain_of(&files, newest) {
                Ok(index) => {
                    let p = files[newest].3.as_ref().expect("valid");
                    chosen = Some((files[newest].0, p.info, index));
                    break;
                }
                // A link whose body does not parse: that link is damaged,
                // and so is every link built on it; choose again.
                Err((at, e)) => files[at].3 = Err(e),
            }
        }
        for (no, path, len, parsed) in files.into_iter().rev() {
            let decoded = parsed.map(|p| Link {
                no,
                info: p.info,
                kind: p.kind,
                bytes: len,
            });
            let case = match &decoded {
                Ok(_) => CheckpointCase::Valid,
                Err(StoreError::FormatVersion { .. }) => CheckpointCase::OtherVersion,
                Err(_) => CheckpointCase::Damaged,
            };
            let verdict = Verdict::of(decide_checkpoint(case));
            let is_chosen = chosen.as_ref().is_some_and(|c| c.0 == no);
            let use_it = verdict.action == Action::Apply && is_chosen;
            v.checkpoint(CheckpointSeen {
                no,
                path: &path,
                decoded: decoded.map(|l| (l, chosen.as_ref().filter(|_| is_chosen).map(|c| &c.2))),
                verdict,
                chosen: use_it,
                bytes: len,
            })?;
        }
        Ok(match chosen {
            Some((no, info, index)) => Start {
                checkpoint: Some((no, info)),
                index,
                replay: info.replay,
                lsn: info.lsn,
                verdict: Verdict::of(decide_checkpoint(CheckpointCase::Valid)),
            },
            None => {
                let case = if listing.segments.first().is_some_and(|&s| s != 1) {
                    CheckpointCase::NoneJournalReclaimed
                } else {
                    CheckpointCase::NoneJournalWhole
                };
                Start {
                    checkpoint: None,
                    index: Index::default(),
                    replay: ReplayFrom::START,
                    lsn: 0,
                    verdict: Verdict::of(decide_checkpoint(case)),
                }
            }
        })
    }

    /// Walks the segments in `span` from `start`: missing segments first,
    /// then each segment's header and records.
    pub fn walk(&self, start: Start, span: Span, v: &mut dyn Visit) -> Result<Walked, StoreError> {
        let listing = self.listing;
        let missing = listing.missing(start.replay);
        for &(seq, verdict) in &missing {
            v.missing(seq, verdict)?;
        }
        let mut w = Walker {
            group: self.group,
            salt: self.salt,
            dir: self.dir,
            replay: start.replay,
            start_lsn: start.lsn,
            span,
            last_lsn: (span == Span::Replay).then_some(start.lsn),
            index: start.index,
            after_damage: false,
            resync_at_replay: span == Span::Whole
                && listing.segments.binary_search(&start.replay.seg).is_ok(),
        };
        let newest = listing.newest_segment();
        for &seq in &listing.segments {
            if span == Span::Replay && seq < w.replay.seg {
                continue;
            }
            // Records of a reclaimed segment are gone: the numbers jump.
            if missing
                .iter()
                .any(|&(s, verdict)| s + 1 == seq && verdict.action == Action::Note)
            {
                w.after_damage = true;
            }
            w.segment(seq, Some(seq) == newest, v)?;
        }
        Ok(Walked {
            index: w.index,
            last_lsn: w.last_lsn,
        })
    }
}

/// Which part of the journal a walk reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// From the replay position on (recovery: restart cost ∝ the tail).
    Replay,
    /// Every segment from its header (inspection: statistics and damage
    /// anywhere).
    Whole,
}

/// What a walk ends with.
pub struct Walked {
    /// The start's index with every replayed record applied.
    pub index: Index,
    /// The lsn of the last numbered record walked (or the start's).
    pub last_lsn: Option<u64>,
}

/// Offset of the first valid record at or after `from` whose lsn is beyond
/// `last_lsn` (or a Hole), if any. Every offset is tried, payload bytes
/// included: only the record salt (secret from publishers) keeps a record
/// embedded in a payload from being taken for one of the journal's.
///
/// Offsets whose header bytes are all zero are skipped without decoding:
/// no record's header is all zeros (its kind byte is never 0, see
/// `record::tests::no_record_kind_is_zero`), so the answer is the same,
/// but a zero-filled stretch (what a crash can leave at the end of a
/// file) costs a byte scan instead of a checksum per offset — 64 MiB of
/// zeros took 2.45 s per segment to judge before.
pub fn next_valid(salt: u32, buf: &[u8], from: usize, last_lsn: u64) -> Option<usize> {
    let end = buf.len().saturating_sub(RECORD_HEADER_BYTES - 1);
    let mut at = from;
    while at < end {
        // Every start whose header lies wholly before the next non-zero
        // byte is all zeros; none after the last non-zero byte can be valid.
        let nonzero = at + buf[at..].iter().position(|&b| b != 0)?;
        let first_possible = (nonzero + 1).saturating_sub(RECORD_HEADER_BYTES);
        if first_possible > at {
            at = first_possible;
            continue;
        }
        if matches!(record::decode(salt, &buf[at..]),
            Decoded::Record { lsn, record, .. } if lsn > last_lsn || matches!(record, Record::Hole { .. }))
        {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The walk's position in the journal's numbering.
struct Walker<'a> {
    group: u32,
    salt: u32,
    dir: &'a Path,
    replay: ReplayFrom,
    /// The lsn the start covers.
    start_lsn: u64,
    span: Span,
    index: Index,
    last_lsn: Option<u64>,
    /// The previous thing walked was damage, a Hole or a reclaimed segment:
    /// a gap in the numbers is explained.
    after_damage: bool,
    /// Whether the numbering still has to be set to the checkpoint's at
    /// the replay position (a whole walk that will reach it).
    resync_at_replay: bool,
}

impl Walker<'_> {
    fn segment(&mut self, seq: u32, newest: bool, v: &mut dyn Visit) -> Result<(), StoreError> {
        let path = segment::segment_path(self.dir, seq);
        let bytes = v.load_segment(seq, &path)?;
        let replay = self.replay;
        let start = if self.span == Span::Replay && seq == replay.seg {
            usize::try_from(replay.offset).unwrap_or(usize::MAX)
        } else {
            SEGMENT_HEADER_BYTES
        };
        let check = segment::check_header(&bytes, self.group, seq);
        let header = match check {
            HeaderCheck::Ok => Header::Ok,
            HeaderCheck::Torn => Header::Torn,
            HeaderCheck::Foreign(_) => Header::Foreign,
        };
        let valid_records = header != Header::Ok
            && next_valid(
                self.salt,
                &bytes,
                SEGMENT_HEADER_BYTES,
                self.last_lsn.unwrap_or(0),
            )
            .is_some();
        let verdict = Verdict::of(decide_segment(&SegmentCase {
            header,
            last_segment: newest,
            valid_records,
            before_replay: seq < replay.seg,
        }));
        let seg = Seg {
            seq,
            path: &path,
            bytes: &bytes,
            newest,
            start,
            header: check,
            verdict,
        };
        v.header(&seg)?;
        let scanned_to = if verdict.action == Action::Apply {
            Some(self.records(&seg, v)?)
        } else {
            None
        };
        v.segment_end(&seg, scanned_to)
    }

    /// Walks the records of `seg`; returns where the walk stopped (its end,
    /// or the start of a tail to truncate).
    fn records(&mut self, seg: &Seg<'_>, v: &mut dyn Visit) -> Result<usize, StoreError> {
        let bytes = seg.bytes;
        let mut at = seg.start;
        while at < bytes.len() {
            let in_replay = (seg.seq, at as u64) >= (self.replay.seg, self.replay.offset);
            if in_replay && self.resync_at_replay {
                // From here on, judge as recovery does: against the lsn the
                // checkpoint covers.
                self.resync_at_replay = false;
                self.last_lsn = Some(self.start_lsn);
                self.after_damage = false;
            }
            match record::decode(self.salt, &bytes[at..]) {
                Decoded::Record { lsn, record, len } => {
                    let found = Found {
                        at,
                        lsn,
                        verdict: self.judge(&record, lsn, seg.newest),
                        record,
                        len,
                        in_replay,
                        prev_lsn: self.last_lsn,
                    };
                    self.record(seg, &found, v)?;
                    at += len;
                }
                other => match self.damage(seg, at, other, v)? {
                    Some(end) => at = end,
                    None => return Ok(at),
                },
            }
        }
        Ok(bytes.len())
    }

    /// The record table's verdict on an intact record numbered `lsn`.
    fn judge(&self, record: &Record<'_>, lsn: u64, newest: bool) -> Verdict {
        let order = match self.last_lsn {
            _ if matches!(record, Record::Hole { .. }) => Order::Unnumbered,
            None => Order::Next,
            Some(prev) if lsn == prev + 1 => Order::Next,
            Some(prev) if lsn > prev => Order::Gap,
            Some(_) => Order::Behind,
        };
        Verdict::of(decide(&RecordCase {
            frame: Frame::Intact,
            body: Body::Parses,
            order,
            after_damage: self.after_damage,
            valid_later: false,
            last_segment: newest,
        }))
    }

    fn record(
        &mut self,
        seg: &Seg<'_>,
        found: &Found<'_>,
        v: &mut dyn Visit,
    ) -> Result<(), StoreError> {
        v.record(seg, found)?;
        if found.in_replay {
            let loc = Loc {
                seg: seg.seq,
                offset: u32::try_from(found.at).expect("segments are below 4 GiB"),
                len: u32::try_from(found.len).expect("records are below 4 GiB"),
            };
            self.index.apply(&found.record, loc);
        }
        if matches!(found.record, Record::Hole { .. }) {
            self.after_damage = true;
        } else {
            self.last_lsn = Some(found.lsn);
            self.after_damage = false;
        }
        Ok(())
    }

    /// Shows damage (or the zeros of a prepared segment's unwritten rest)
    /// at `at` to the visitor; returns where the walk resumes, or `None`
    /// when the rest of the segment is a tail to truncate.
    fn damage<'b>(
        &mut self,
        seg: &Seg<'b>,
        at: usize,
        decoded: Decoded<'b>,
        v: &mut dyn Visit,
    ) -> Result<Option<usize>, StoreError> {
        let (frame, body) = match decoded {
            Decoded::Unparseable { .. } => (Frame::Intact, Body::Unparseable),
            Decoded::Corrupt(_) => (Frame::Corrupt, Body::Parses),
            Decoded::Incomplete { .. } => (Frame::Short, Body::Parses),
            Decoded::Record { .. } => unreachable!("records are walked, not damage"),
        };
        // Before anything the decode said: zeros are no record (no kind
        // is 0), but 16 zero bytes do pass the checksum for about one
        // salt in 2^32, and then decode as "intact, unparseable".
        let frame = if seg.bytes[at..].iter().all(|&b| b == 0) {
            Frame::Zeros
        } else {
            frame
        };
        let later = next_valid(
            self.salt,
            seg.bytes,
            at + RECORD_HEADER_BYTES,
            self.last_lsn.unwrap_or(0),
        );
        let verdict = Verdict::of(decide(&RecordCase {
            frame,
            body,
            order: Order::Next,
            after_damage: self.after_damage,
            valid_later: later.is_some(),
            last_segment: seg.newest,
        }));
        let damage = Damage {
            at,
            end: later.unwrap_or(seg.bytes.len()),
            later,
            decoded,
            prev_lsn: self.last_lsn,
            verdict,
        };
        v.damage(seg, &damage)?;
        if matches!(verdict.action, Action::Truncate | Action::End) {
            return Ok(None);
        }
        // The records lost there explain a gap in the numbers.
        self.after_damage = true;
        Ok(Some(damage.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MsgId, QueueId};

    /// `next_valid` as it was: a decode at every offset.
    fn next_valid_every_offset(salt: u32, buf: &[u8], from: usize, last_lsn: u64) -> Option<usize> {
        (from..buf.len().saturating_sub(RECORD_HEADER_BYTES - 1)).find(|&o| {
            matches!(record::decode(salt, &buf[o..]),
                Decoded::Record { lsn, record, .. } if lsn > last_lsn || matches!(record, Record::Hole { .. }))
        })
    }

    #[test]
    fn skipping_zeros_finds_what_a_decode_at_every_offset_finds() {
        let salt = 0x5eed_1234;
        let publish = |lsn: u64, payload: &[u8], out: &mut Vec<u8>| {
            let queues = [QueueId(7)];
            record::encode(
                salt,
                lsn,
                &Record::Publish {
                    msg: MsgId(lsn),
                    queues: queues.as_slice().into(),
                    payload,
                },
                out,
            );
        };
        // Zero runs shorter than, equal to and longer than a header, a
        // record whose payload is zeros, garbage, records at the very end.
        for zeros in [
            0,
            1,
            RECORD_HEADER_BYTES - 1,
            RECORD_HEADER_BYTES,
            100,
            4096,
        ] {
            let mut buf = vec![0u8; zeros];
            publish(1, b"first", &mut buf);
            buf.extend(std::iter::repeat_n(0u8, zeros));
            publish(2, &[0u8; 64], &mut buf);
            buf.extend_from_slice(&[0, 0, 0xff, 0, 0, 0, 0x13]);
            buf.extend(std::iter::repeat_n(0u8, zeros));
            publish(3, b"", &mut buf);
            buf.extend(std::iter::repeat_n(0u8, zeros));
            // Every start for short runs; a sample for the long one (a
            // decode at every offset of every start is quadratic).
            let step = if zeros > 100 { 61 } else { 1 };
            for last_lsn in [0, 2, 3] {
                for from in (0..=buf.len()).step_by(step) {
                    assert_eq!(
                        next_valid(salt, &buf, from, last_lsn),
                        next_valid_every_offset(salt, &buf, from, last_lsn),
                        "zeros {zeros}, from {from}, last_lsn {last_lsn}"
                    );
                }
            }
            // Torn in the middle of the last record: the same too.
            let torn = &buf[..buf.len() - zeros - 3];
            assert_eq!(
                next_valid(salt, torn, 0, 2),
                next_valid_every_offset(salt, torn, 0, 2)
            );
        }
    }

    #[test]
    fn a_zero_filled_tail_has_no_valid_record() {
        let mut buf = Vec::new();
        record::encode(1, 1, &Record::Purge { queue: QueueId(1) }, &mut buf);
        buf.resize(1 << 20, 0);
        assert_eq!(next_valid(1, &buf, 1, 1), None);
        assert_eq!(next_valid(1, &buf, 0, 0), Some(0));
    }
}
