//! Checkpoints: a group's index at one journal position, so restart reads
//! the checkpoints plus only the journal after the newest.
//!
//! File `ckpt-<n:020>.ckpt` in the group directory (`n` counts the group's
//! checkpoints; the newest has the highest), written as
//! `ckpt.tmp` + fdatasync + rename + directory fsync. Since format
//! version 2 checkpoints form chains: a *base* lists the whole index, a
//! *delta* lists only what changed between its parent checkpoint (the
//! previous link, base or delta) and its own position, so a checkpoint
//! costs what changed, not what is live (FORMAT.md, *Checkpoint files*):
//!
//! ```text
//!  header (72 bytes)
//!  0          8        12      16    24           32              40          48     52         56          64
//!  +----------+--------+-------+-----+------------+---------------+-----------+------+----------+-----------+
//!  | BERTHCKP | version| group | lsn | replay_seg | replay_offset | msg_id_hw | kind | reserved | parent_no |
//!  |  8 bytes | u32 = 2|  u32  | u64 |    u64     |      u64      |    u64    | u32  |  u32 = 0 |    u64    |
//!  +----------+--------+-------+-----+------------+---------------+-----------+------+----------+-----------+
//!  64: parent_lsn u64
//!  base (kind 1):  meta_count u64 · meta_count × ( key_len u32 | value_len u32 | key | value )
//!                  run_count u64 · run_count × ( queue_count u32 | msg_count u32 | queue u64 × queue_count
//!                                                | msg_count × ( msg u64 | seg u32 | offset u32 | rec_len u32 ) )
//!  delta (kind 2): op_count u64 · op_count × ( op u8 | fields ), in journal order
//!  crc32c u32 over every byte before it
//! ```
//!
//! Version 1 (a base without kind or parent, one entry per message) is
//! still read; only version 2 is written.
//!
//! Invariants:
//! - The journal up to `lsn` is fdatasync'ed before the checkpoint is
//!   written, so `replay_seg`/`replay_offset` always point inside (or at
//!   the end of) durable journal.
//! - A checkpoint is trusted only whole: one CRC covers it all; and a
//!   delta only with every link of its chain down to a base: each link's
//!   `parent_no`/`parent_lsn` name the previous link exactly.
//! - Applying a delta's ops to its parent's index in order gives the index
//!   that replaying the journal between the two positions gives (the ops
//!   are the journal's records without their payloads).
//! - The chains of the two newest checkpoints are kept, and a segment is
//!   deleted only if it lies wholly before the replay position of both, so
//!   falling back to the older checkpoint always finds its journal.

use std::path::Path;

use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::record::Record;
use crate::{MsgId, QueueId};

mod streams;

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"BERTHCKP";
/// The version this build writes (version 1 is still read).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 3;
/// Version 2: chains, written before streams' sparse indexes (still read).
pub const CHECKPOINT_FORMAT_VERSION_V2: u32 = 2;
/// Version 1: a whole index, one entry per message (written until chains).
pub const CHECKPOINT_FORMAT_VERSION_V1: u32 = 1;
pub const CK_OFF_VERSION: usize = 8;
pub const CK_OFF_GROUP: usize = CK_OFF_VERSION + 4;
pub const CK_OFF_LSN: usize = CK_OFF_GROUP + 4;
pub const CK_OFF_REPLAY_SEG: usize = CK_OFF_LSN + 8;
pub const CK_OFF_REPLAY_OFFSET: usize = CK_OFF_REPLAY_SEG + 8;
pub const CK_OFF_MSG_ID_HW: usize = CK_OFF_REPLAY_OFFSET + 8;
/// Version 1 only: counts follow `msg_id_hw`.
pub const CK1_OFF_META_COUNT: usize = CK_OFF_MSG_ID_HW + 8;
pub const CK1_OFF_MSG_COUNT: usize = CK1_OFF_META_COUNT + 8;
pub const CHECKPOINT_V1_HEADER_BYTES: usize = CK1_OFF_MSG_COUNT + 8;
const _: () = assert!(CHECKPOINT_V1_HEADER_BYTES == 64);
/// Version 2: kind and parent follow `msg_id_hw`.
pub const CK_OFF_KIND: usize = CK_OFF_MSG_ID_HW + 8;
pub const CK_OFF_RESERVED: usize = CK_OFF_KIND + 4;
pub const CK_OFF_PARENT_NO: usize = CK_OFF_RESERVED + 4;
pub const CK_OFF_PARENT_LSN: usize = CK_OFF_PARENT_NO + 8;
pub const CHECKPOINT_HEADER_BYTES: usize = CK_OFF_PARENT_LSN + 8;
const _: () = assert!(CHECKPOINT_HEADER_BYTES == 72);
pub const CHECKPOINT_TMP_NAME: &str = "ckpt.tmp";

/// `kind` of a base: the whole index.
pub const KIND_BASE: u32 = 1;
/// `kind` of a delta: the changes since its parent.
pub const KIND_DELTA: u32 = 2;

/// Delta op codes (one byte before each op's fields).
pub const OP_PUT: u8 = 1;
pub const OP_REMOVE: u8 = 2;
pub const OP_PURGE: u8 = 3;
pub const OP_META_PUT: u8 = 4;
pub const OP_META_DELETE: u8 = 5;
/// Version 3: a stream's Append (`queue u64 · offset u64 · seg u32 · pos u32 · len u32`).
pub const OP_APPEND: u8 = 6;
/// Version 3: a stream's Trim (`queue u64 · below u64`).
pub const OP_TRIM: u8 = 7;

/// Bytes of one message in a base's run: msg, seg, offset, rec_len.
pub const RUN_ENTRY_BYTES: usize = 8 + 4 + 4 + 4;

/// Where replay resumes after a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReplayFrom {
    pub seg: u32,
    pub offset: u64,
}

impl ReplayFrom {
    /// The journal's first record: where replay starts with no checkpoint.
    pub const START: ReplayFrom = ReplayFrom {
        seg: 1,
        offset: crate::segment::SEGMENT_HEADER_BYTES as u64,
    };
}

/// A decoded checkpoint's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub lsn: u64,
    pub replay: ReplayFrom,
}

/// What a checkpoint file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The whole index (every version-1 file is one).
    Base,
    /// The changes since checkpoint `parent_no`, which covers `parent_lsn`.
    Delta { parent_no: u64, parent_lsn: u64 },
}

/// One retained checkpoint as the writer and recovery track it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub no: u64,
    pub info: CheckpointInfo,
    pub kind: Kind,
    /// Size of the file: what a base rewrite is weighed against.
    pub bytes: u64,
}

/// File name of the group's `n`-th checkpoint.
pub fn checkpoint_name(n: u64) -> String {
    format!("ckpt-{n:020}.ckpt")
}

pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?.strip_suffix(".ckpt")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn header(group: u32, info: CheckpointInfo, msg_id_hw: u64, kind: Kind) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES);
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&info.lsn.to_le_bytes());
    out.extend_from_slice(&u64::from(info.replay.seg).to_le_bytes());
    out.extend_from_slice(&info.replay.offset.to_le_bytes());
    out.extend_from_slice(&msg_id_hw.to_le_bytes());
    let (code, parent_no, parent_lsn) = match kind {
        Kind::Base => (KIND_BASE, 0, 0),
        Kind::Delta {
            parent_no,
            parent_lsn,
        } => (KIND_DELTA, parent_no, parent_lsn),
    };
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&parent_no.to_le_bytes());
    out.extend_from_slice(&parent_lsn.to_le_bytes());
    debug_assert_eq!(out.len(), CHECKPOINT_HEADER_BYTES);
    out
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).expect("length fits u32").to_le_bytes());
}

fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Serializes `index` as a base checkpoint of `group` at `info`.
pub fn encode(group: u32, info: CheckpointInfo, index: &Index) -> Vec<u8> {
    let mut out = header(group, info, index.msg_id_hw, Kind::Base);
    out.reserve(16 + RUN_ENTRY_BYTES * index.live_messages());
    out.extend_from_slice(&(index.meta.len() as u64).to_le_bytes());
    for (k, v) in &index.meta {
        put_len(&mut out, k.len());
        put_len(&mut out, v.len());
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    let run_count_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut runs = 0u64;
    index.for_each_run(|queues, entries| {
        for chunk in entries.chunks(u32::MAX as usize) {
            runs += 1;
            put_len(&mut out, queues.len());
            put_len(&mut out, chunk.len());
            for q in queues {
                out.extend_from_slice(&q.0.to_le_bytes());
            }
            for (msg, loc) in chunk {
                out.extend_from_slice(&msg.0.to_le_bytes());
                out.extend_from_slice(&loc.seg.to_le_bytes());
                out.extend_from_slice(&loc.offset.to_le_bytes());
                out.extend_from_slice(&loc.len.to_le_bytes());
            }
        }
    });
    out[run_count_at..run_count_at + 8].copy_from_slice(&runs.to_le_bytes());
    streams::encode(&mut out, index);
    seal(out)
}

/// A delta being built: the index ops of the journal records between its
/// parent's position and its own, in journal order.
pub struct DeltaBuilder {
    ops: Vec<u8>,
    count: u64,
    msg_id_hw: u64,
}

impl DeltaBuilder {
    /// A delta on a parent whose index had `msg_id_hw`.
    pub fn new(msg_id_hw: u64) -> DeltaBuilder {
        DeltaBuilder {
            ops: Vec::new(),
            count: 0,
            msg_id_hw,
        }
    }

    /// Adds the op of one journal record found at `loc`.
    pub fn push(&mut self, record: &Record<'_>, loc: Loc) {
        let out = &mut self.ops;
        match record {
            Record::Publish { msg, queues, .. } | Record::Relocate { msg, queues, .. } => {
                self.msg_id_hw = self.msg_id_hw.max(msg.0);
                out.push(OP_PUT);
                out.extend_from_slice(&msg.0.to_le_bytes());
                out.extend_from_slice(&loc.seg.to_le_bytes());
                out.extend_from_slice(&loc.offset.to_le_bytes());
                out.extend_from_slice(&loc.len.to_le_bytes());
                put_len(out, queues.len());
                for q in queues.iter() {
                    out.extend_from_slice(&q.0.to_le_bytes());
                }
            }
            Record::Remove { queue, msgs } => {
                out.push(OP_REMOVE);
                out.extend_from_slice(&queue.0.to_le_bytes());
                put_len(out, msgs.len());
                for m in msgs.iter() {
                    out.extend_from_slice(&m.0.to_le_bytes());
                }
            }
            Record::Purge { queue } => {
                out.push(OP_PURGE);
                out.extend_from_slice(&queue.0.to_le_bytes());
            }
            Record::MetaPut { key, value } => {
                out.push(OP_META_PUT);
                put_len(out, key.len());
                put_len(out, value.len());
                out.extend_from_slice(key);
                out.extend_from_slice(value);
            }
            Record::MetaDelete { key } => {
                out.push(OP_META_DELETE);
                put_len(out, key.len());
                out.extend_from_slice(key);
            }
            Record::Append { queue, offset, .. } => {
                out.push(OP_APPEND);
                out.extend_from_slice(&queue.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&loc.seg.to_le_bytes());
                out.extend_from_slice(&loc.offset.to_le_bytes());
                out.extend_from_slice(&loc.len.to_le_bytes());
            }
            Record::Trim { queue, below } => {
                out.push(OP_TRIM);
                out.extend_from_slice(&queue.0.to_le_bytes());
                out.extend_from_slice(&below.to_le_bytes());
            }
            Record::Hole { .. } => return,
        }
        self.count += 1;
    }

    /// Bytes its ops take so far (what keeping it costs in memory).
    pub fn ops_bytes(&self) -> usize {
        self.ops.len()
    }

    /// The delta's file: at `info`, extending checkpoint `parent_no` at
    /// `parent_lsn`.
    pub fn encode(
        self,
        group: u32,
        info: CheckpointInfo,
        parent_no: u64,
        parent_lsn: u64,
    ) -> Vec<u8> {
        let kind = Kind::Delta {
            parent_no,
            parent_lsn,
        };
        let mut out = header(group, info, self.msg_id_hw, kind);
        out.reserve(8 + self.ops.len() + 4);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.ops);
        seal(out)
    }
}

#[derive(Clone)]
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn left(&self) -> usize {
        self.buf.len() - self.at
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// A checkpoint file whose checksum, magic, version and group were
/// checked; its body is parsed by [`Parsed::load_base`] or
/// [`Parsed::apply_delta`].
pub struct Parsed {
    pub info: CheckpointInfo,
    pub kind: Kind,
    pub version: u32,
    pub msg_id_hw: u64,
    bytes: Vec<u8>,
    path: std::path::PathBuf,
}

/// Checks a checkpoint of `group`: checksum, magic, version, group and
/// header; the body is parsed later, against its chain.
pub fn parse(group: u32, bytes: Vec<u8>, path: &Path) -> Result<Parsed, StoreError> {
    let corrupt = |offset: usize, reason: &str| StoreError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason: reason.to_owned(),
    };
    if bytes.len() < CHECKPOINT_V1_HEADER_BYTES + 4 {
        return Err(corrupt(0, "shorter than a checkpoint header"));
    }
    let body_end = bytes.len() - 4;
    let stored = le_u32(&bytes[body_end..]);
    if stored != crc32c::crc32c(&bytes[..body_end]) {
        return Err(corrupt(body_end, "checksum mismatch"));
    }
    if bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt(0, "bad magic"));
    }
    let version = le_u32(&bytes[CK_OFF_VERSION..CK_OFF_VERSION + 4]);
    if version != CHECKPOINT_FORMAT_VERSION
        && version != CHECKPOINT_FORMAT_VERSION_V2
        && version != CHECKPOINT_FORMAT_VERSION_V1
    {
        return Err(StoreError::FormatVersion {
            path: path.to_path_buf(),
            found: version,
            expected: CHECKPOINT_FORMAT_VERSION,
        });
    }
    let g = le_u32(&bytes[CK_OFF_GROUP..CK_OFF_GROUP + 4]);
    if g != group {
        return Err(corrupt(
            CK_OFF_GROUP,
            &format!("checkpoint of group {g} in group {group}'s directory"),
        ));
    }
    let lsn = le_u64(&bytes[CK_OFF_LSN..CK_OFF_LSN + 8]);
    let seg = le_u64(&bytes[CK_OFF_REPLAY_SEG..CK_OFF_REPLAY_SEG + 8]);
    let offset = le_u64(&bytes[CK_OFF_REPLAY_OFFSET..CK_OFF_REPLAY_OFFSET + 8]);
    let msg_id_hw = le_u64(&bytes[CK_OFF_MSG_ID_HW..CK_OFF_MSG_ID_HW + 8]);
    let seg = u32::try_from(seg).map_err(|e| {
        corrupt(
            CK_OFF_REPLAY_SEG,
            &format!("segment number {seg} out of range: {e}"),
        )
    })?;
    let kind = if version == CHECKPOINT_FORMAT_VERSION_V1 {
        Kind::Base
    } else {
        if body_end < CHECKPOINT_HEADER_BYTES {
            return Err(corrupt(0, "shorter than a checkpoint header"));
        }
        if le_u32(&bytes[CK_OFF_RESERVED..CK_OFF_RESERVED + 4]) != 0 {
            return Err(corrupt(CK_OFF_RESERVED, "reserved field is not 0"));
        }
        let parent_no = le_u64(&bytes[CK_OFF_PARENT_NO..CK_OFF_PARENT_NO + 8]);
        let parent_lsn = le_u64(&bytes[CK_OFF_PARENT_LSN..CK_OFF_PARENT_LSN + 8]);
        match le_u32(&bytes[CK_OFF_KIND..CK_OFF_KIND + 4]) {
            KIND_BASE if parent_no == 0 && parent_lsn == 0 => Kind::Base,
            KIND_DELTA => Kind::Delta {
                parent_no,
                parent_lsn,
            },
            k => {
                return Err(corrupt(
                    CK_OFF_KIND,
                    &format!("kind {k} with parent {parent_no}"),
                ))
            }
        }
    };
    Ok(Parsed {
        info: CheckpointInfo {
            lsn,
            replay: ReplayFrom { seg, offset },
        },
        kind,
        version,
        msg_id_hw,
        bytes,
        path: path.to_path_buf(),
    })
}

impl Parsed {
    fn corrupt(&self, offset: usize, reason: &str) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            offset: offset as u64,
            reason: reason.to_owned(),
        }
    }

    fn body(&self) -> Reader<'_> {
        let at = if self.version == CHECKPOINT_FORMAT_VERSION_V1 {
            CK1_OFF_META_COUNT
        } else {
            CHECKPOINT_HEADER_BYTES
        };
        Reader {
            buf: &self.bytes[..self.bytes.len() - 4],
            at,
        }
    }

    /// The index a base lists.
    pub fn load_base(&self) -> Result<Index, StoreError> {
        assert_eq!(self.kind, Kind::Base, "load_base of a delta");
        let mut r = self.body();
        let bad = |r: &Reader<'_>| self.corrupt(r.at, "truncated or inconsistent body");
        let mut index = Index::default();
        index.msg_id_hw = self.msg_id_hw;
        let meta_count = if self.version == CHECKPOINT_FORMAT_VERSION_V1 {
            let m = r.u64().ok_or_else(|| bad(&r))?;
            let _msg_count = r.u64().ok_or_else(|| bad(&r))?;
            m
        } else {
            r.u64().ok_or_else(|| bad(&r))?
        };
        for _ in 0..meta_count {
            let kl = r.u32().ok_or_else(|| bad(&r))? as usize;
            let vl = r.u32().ok_or_else(|| bad(&r))? as usize;
            let k = r.take(kl).ok_or_else(|| bad(&r))?.to_vec();
            let v = r.take(vl).ok_or_else(|| bad(&r))?.to_vec();
            index.meta.insert(k, v);
        }
        if self.version == CHECKPOINT_FORMAT_VERSION_V1 {
            self.load_v1_messages(&mut r, &mut index)?;
        } else {
            self.load_runs(&mut r, &mut index)?;
        }
        if self.version >= CHECKPOINT_FORMAT_VERSION {
            self.load_streams(&mut r, &mut index)?;
        }
        if r.left() != 0 {
            return Err(bad(&r));
        }
        Ok(index)
    }

    /// `what` names the entry for the error, formatted only when there is
    /// one: this runs for every message of a delta at every restart.
    fn check_queues(
        &self,
        at: usize,
        queues: &[QueueId],
        what: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        if queues.is_empty() {
            Err(self.corrupt(at, &format!("{} with no queue", what())))
        } else if queues.contains(&QueueId(u64::MAX)) {
            Err(self.corrupt(
                at,
                &format!("{} names the reserved queue id u64::MAX", what()),
            ))
        } else {
            Ok(())
        }
    }

    fn load_runs(&self, r: &mut Reader<'_>, index: &mut Index) -> Result<(), StoreError> {
        let bad = |r: &Reader<'_>| self.corrupt(r.at, "truncated or inconsistent body");
        let runs = r.u64().ok_or_else(|| bad(r))?;
        // The table sized once for every run, not regrown run by run
        // (a damaged body is reported by the loop below, not here).
        if let Some(total) = Self::messages_in_runs(r.clone(), runs) {
            index.reserve_messages(total);
        }
        let mut queues: Vec<QueueId> = Vec::new();
        for _ in 0..runs {
            let at = r.at;
            let qn = r.u32().ok_or_else(|| bad(r))? as usize;
            let n = r.u32().ok_or_else(|| bad(r))? as usize;
            let raw = r
                .take(qn.checked_mul(8).ok_or_else(|| bad(r))?)
                .ok_or_else(|| bad(r))?;
            queues.clear();
            queues.extend(raw.chunks_exact(8).map(|c| QueueId(le_u64(c))));
            self.check_queues(at, &queues, || "a run".to_string())?;
            if !queues.windows(2).all(|w| w[0] < w[1]) {
                return Err(self.corrupt(at, "a run's queues are not ascending"));
            }
            // The encoder writes no empty run; loading one would leave
            // its queues listed with nothing live in them.
            if n == 0 {
                return Err(self.corrupt(at, "a run with no messages"));
            }
            let entries = r
                .take(n.checked_mul(RUN_ENTRY_BYTES).ok_or_else(|| bad(r))?)
                .ok_or_else(|| bad(r))?;
            index.reserve_run(&queues, n);
            let decoded = entries.chunks_exact(RUN_ENTRY_BYTES).map(|e| {
                (
                    MsgId(le_u64(&e[0..8])),
                    Loc {
                        seg: le_u32(&e[8..12]),
                        offset: le_u32(&e[12..16]),
                        len: le_u32(&e[16..20]),
                    },
                )
            });
            if let Err(m) = index.load_run(&queues, decoded) {
                return Err(self.corrupt(at, &format!("message {} listed twice", m.0)));
            }
        }
        Ok(())
    }

    /// How many messages `runs` runs from `r` on list, if they parse.
    fn messages_in_runs(mut r: Reader<'_>, runs: u64) -> Option<usize> {
        let mut total = 0usize;
        for _ in 0..runs {
            let qn = r.u32()? as usize;
            let n = r.u32()? as usize;
            r.take(
                qn.checked_mul(8)?
                    .checked_add(n.checked_mul(RUN_ENTRY_BYTES)?)?,
            )?;
            total = total.checked_add(n)?;
        }
        Some(total)
    }

    fn load_v1_messages(&self, r: &mut Reader<'_>, index: &mut Index) -> Result<(), StoreError> {
        let bad = |r: &Reader<'_>| self.corrupt(r.at, "truncated or inconsistent body");
        let msg_count = le_u64(&self.bytes[CK1_OFF_MSG_COUNT..CK1_OFF_MSG_COUNT + 8]);
        let mut queues: Vec<QueueId> = Vec::new();
        for _ in 0..msg_count {
            let msg = MsgId(r.u64().ok_or_else(|| bad(r))?);
            let loc = Loc {
                seg: r.u32().ok_or_else(|| bad(r))?,
                offset: r.u32().ok_or_else(|| bad(r))?,
                len: r.u32().ok_or_else(|| bad(r))?,
            };
            let n = r.u32().ok_or_else(|| bad(r))? as usize;
            let raw = r
                .take(n.checked_mul(8).ok_or_else(|| bad(r))?)
                .ok_or_else(|| bad(r))?;
            queues.clear();
            queues.extend(raw.chunks_exact(8).map(|c| QueueId(le_u64(c))));
            // The encoder wrote each live message once, with its queues; an
            // entry the index could not hold consistently is damage or a bug.
            self.check_queues(r.at, &queues, || format!("message {}", msg.0))?;
            if index.contains(msg) {
                return Err(self.corrupt(r.at, &format!("message {} listed twice", msg.0)));
            }
            index.insert(msg, &queues, loc);
        }
        Ok(())
    }

    /// Applies a delta's ops, in order, to its parent's `index`.
    pub fn apply_delta(&self, index: &mut Index) -> Result<(), StoreError> {
        assert!(
            matches!(self.kind, Kind::Delta { .. }),
            "apply_delta of a base"
        );
        let mut r = self.body();
        let bad = |r: &Reader<'_>| self.corrupt(r.at, "truncated or inconsistent body");
        let count = r.u64().ok_or_else(|| bad(&r))?;
        let mut ids: Vec<u64> = Vec::new();
        let mut queues: Vec<QueueId> = Vec::new();
        for _ in 0..count {
            let at = r.at;
            match r.u8().ok_or_else(|| bad(&r))? {
                OP_PUT => {
                    let msg = MsgId(r.u64().ok_or_else(|| bad(&r))?);
                    let loc = Loc {
                        seg: r.u32().ok_or_else(|| bad(&r))?,
                        offset: r.u32().ok_or_else(|| bad(&r))?,
                        len: r.u32().ok_or_else(|| bad(&r))?,
                    };
                    let n = r.u32().ok_or_else(|| bad(&r))? as usize;
                    let raw = r
                        .take(n.checked_mul(8).ok_or_else(|| bad(&r))?)
                        .ok_or_else(|| bad(&r))?;
                    queues.clear();
                    queues.extend(raw.chunks_exact(8).map(|c| QueueId(le_u64(c))));
                    self.check_queues(at, &queues, || format!("message {}", msg.0))?;
                    index.apply(
                        &Record::Relocate {
                            msg,
                            queues: queues.as_slice().into(),
                            payload: &[],
                        },
                        loc,
                    );
                }
                OP_REMOVE => {
                    let queue = QueueId(r.u64().ok_or_else(|| bad(&r))?);
                    let n = r.u32().ok_or_else(|| bad(&r))? as usize;
                    let raw = r
                        .take(n.checked_mul(8).ok_or_else(|| bad(&r))?)
                        .ok_or_else(|| bad(&r))?;
                    ids.clear();
                    ids.extend(raw.chunks_exact(8).map(le_u64));
                    index.remove_ids(queue, &ids);
                }
                OP_PURGE => {
                    let queue = QueueId(r.u64().ok_or_else(|| bad(&r))?);
                    index.apply(
                        &Record::Purge { queue },
                        Loc {
                            seg: 0,
                            offset: 0,
                            len: 0,
                        },
                    );
                }
                OP_META_PUT => {
                    let kl = r.u32().ok_or_else(|| bad(&r))? as usize;
                    let vl = r.u32().ok_or_else(|| bad(&r))? as usize;
                    let k = r.take(kl).ok_or_else(|| bad(&r))?.to_vec();
                    let v = r.take(vl).ok_or_else(|| bad(&r))?.to_vec();
                    index.meta.insert(k, v);
                }
                OP_META_DELETE => {
                    let kl = r.u32().ok_or_else(|| bad(&r))? as usize;
                    let k = r.take(kl).ok_or_else(|| bad(&r))?;
                    index.meta.remove(k);
                }
                OP_APPEND if self.version >= CHECKPOINT_FORMAT_VERSION => {
                    let queue = QueueId(r.u64().ok_or_else(|| bad(&r))?);
                    let offset = r.u64().ok_or_else(|| bad(&r))?;
                    let loc = Loc {
                        seg: r.u32().ok_or_else(|| bad(&r))?,
                        offset: r.u32().ok_or_else(|| bad(&r))?,
                        len: r.u32().ok_or_else(|| bad(&r))?,
                    };
                    self.apply_append(at, index, queue, offset, loc)?;
                }
                OP_TRIM if self.version >= CHECKPOINT_FORMAT_VERSION => {
                    let queue = QueueId(r.u64().ok_or_else(|| bad(&r))?);
                    let below = r.u64().ok_or_else(|| bad(&r))?;
                    index.apply(
                        &Record::Trim { queue, below },
                        Loc {
                            seg: 0,
                            offset: 0,
                            len: 0,
                        },
                    );
                }
                op => return Err(self.corrupt(at, &format!("unknown delta op {op}"))),
            }
        }
        if r.left() != 0 {
            return Err(bad(&r));
        }
        index.msg_id_hw = index.msg_id_hw.max(self.msg_id_hw);
        Ok(())
    }
}

/// Parses and verifies a checkpoint of `group`: a base's index, or a
/// delta applied to an empty index (the fuzzer's entry point).
pub fn decode(
    group: u32,
    bytes: &[u8],
    path: &Path,
) -> Result<(CheckpointInfo, Index), StoreError> {
    let parsed = parse(group, bytes.to_vec(), path)?;
    let index = match parsed.kind {
        Kind::Base => parsed.load_base()?,
        Kind::Delta { .. } => {
            let mut index = Index::default();
            parsed.apply_delta(&mut index)?;
            index
        }
    };
    Ok((parsed.info, index))
}

#[cfg(test)]
mod tests;
