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
mod tests {
    use super::*;
    use crate::record::Record;
    use std::borrow::Cow;

    #[test]
    fn checkpoint_roundtrips_and_rejects_any_flip() {
        let mut ix = Index::default();
        ix.apply(
            &Record::MetaPut {
                key: b"k",
                value: b"v",
            },
            Loc {
                seg: 1,
                offset: 32,
                len: 30,
            },
        );
        ix.apply(
            &Record::Publish {
                msg: MsgId(5),
                queues: Cow::Borrowed(&[QueueId(1), QueueId(2)]),
                payload: b"x",
            },
            Loc {
                seg: 1,
                offset: 62,
                len: 49,
            },
        );
        let info = CheckpointInfo {
            lsn: 2,
            replay: ReplayFrom {
                seg: 1,
                offset: 111,
            },
        };
        let bytes = encode(0, info, &ix);
        assert_eq!(&bytes[..8], b"BERTHCKP");
        let (i2, ix2) = decode(0, &bytes, Path::new("c")).unwrap();
        assert_eq!(i2, info);
        assert_eq!(ix2.meta, ix.meta);
        assert_eq!(
            ix2.iter_live().collect::<Vec<_>>(),
            ix.iter_live().collect::<Vec<_>>()
        );
        assert_eq!(ix2.msg_id_hw, 5);
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(
                decode(0, &b, Path::new("c")).is_err(),
                "flip at {at} accepted"
            );
        }
    }

    /// The version-1 encoding (one entry per message), as berth wrote it
    /// before chains: pins that such files still load.
    fn encode_v1(group: u32, info: CheckpointInfo, index: &Index) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&CHECKPOINT_FORMAT_VERSION_V1.to_le_bytes());
        out.extend_from_slice(&group.to_le_bytes());
        out.extend_from_slice(&info.lsn.to_le_bytes());
        out.extend_from_slice(&u64::from(info.replay.seg).to_le_bytes());
        out.extend_from_slice(&info.replay.offset.to_le_bytes());
        out.extend_from_slice(&index.msg_id_hw.to_le_bytes());
        out.extend_from_slice(&(index.meta.len() as u64).to_le_bytes());
        out.extend_from_slice(&(index.live_messages() as u64).to_le_bytes());
        for (k, v) in &index.meta {
            put_len(&mut out, k.len());
            put_len(&mut out, v.len());
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
        let mut live: Vec<_> = index.iter_live().collect();
        live.sort_by_key(|m| m.msg);
        for m in live {
            out.extend_from_slice(&m.msg.0.to_le_bytes());
            out.extend_from_slice(&m.loc.seg.to_le_bytes());
            out.extend_from_slice(&m.loc.offset.to_le_bytes());
            out.extend_from_slice(&m.loc.len.to_le_bytes());
            put_len(&mut out, m.queues.len());
            for q in &m.queues {
                out.extend_from_slice(&q.0.to_le_bytes());
            }
        }
        seal(out)
    }

    /// A version-1 checkpoint of messages 1 and 2 (one queue each) with
    /// `patch` applied to its bytes and its checksum made valid again.
    fn patched_checkpoint(patch: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut ix = Index::default();
        for (msg, offset) in [(1, 32), (2, 96)] {
            let loc = Loc {
                seg: 1,
                offset,
                len: 64,
            };
            ix.insert(MsgId(msg), &[QueueId(7)], loc);
        }
        let info = CheckpointInfo {
            lsn: 2,
            replay: ReplayFrom {
                seg: 1,
                offset: 160,
            },
        };
        let mut bytes = encode_v1(0, info, &ix);
        bytes.truncate(bytes.len() - 4);
        patch(&mut bytes);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Found by the fuzzer (fuzz/fuzz_targets/checkpoint.rs): a message
    /// listed twice left the index's live counts out of step with its
    /// entries (a segment that never gets reclaimed, an assert in
    /// `Index::check`).
    #[test]
    fn a_message_listed_twice_is_refused() {
        // Entries are `msg u64 | seg u32 | offset u32 | len u32 | n u32 | queue u64`.
        const ENTRY: usize = 8 + 4 + 4 + 4 + 4 + 8;
        let bytes = patched_checkpoint(|b| {
            let second = CHECKPOINT_V1_HEADER_BYTES + ENTRY;
            let first_id = b[CHECKPOINT_V1_HEADER_BYTES..CHECKPOINT_V1_HEADER_BYTES + 8].to_vec();
            b[second..second + 8].copy_from_slice(&first_id);
        });
        let Err(e) = decode(0, &bytes, Path::new("c")) else {
            panic!("accepted");
        };
        assert!(e.to_string().contains("twice"), "{e}");
    }

    /// Queue id `u64::MAX` is the index's marker for "several queues": a
    /// checkpoint naming it as a queue is refused, not loaded into an index
    /// that would panic on the message's first ack.
    #[test]
    fn the_reserved_queue_id_is_refused() {
        let bytes = patched_checkpoint(|b| {
            let queue = CHECKPOINT_V1_HEADER_BYTES + 8 + 4 + 4 + 4 + 4;
            b[queue..queue + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        });
        let Err(e) = decode(0, &bytes, Path::new("c")) else {
            panic!("accepted");
        };
        assert!(e.to_string().contains("reserved"), "{e}");
    }

    #[test]
    fn a_message_without_queues_is_refused() {
        let bytes = patched_checkpoint(|b| {
            // The second entry claims no queue and loses its queue id.
            let n = CHECKPOINT_V1_HEADER_BYTES + 2 * (8 + 4 + 4 + 4 + 4 + 8) - 12;
            b[n..n + 4].copy_from_slice(&0u32.to_le_bytes());
            b.truncate(n + 4);
        });
        let Err(e) = decode(0, &bytes, Path::new("c")) else {
            panic!("accepted");
        };
        assert!(e.to_string().contains("no queue"), "{e}");
    }

    /// The index of the golden examples: metadata `k` = `vv`, message 5
    /// in segment 3 at offset 59 (49 bytes) held by queues 1 and 2.
    fn golden_index() -> (CheckpointInfo, Index) {
        let mut ix = Index::default();
        ix.apply(
            &Record::MetaPut {
                key: b"k",
                value: b"vv",
            },
            Loc {
                seg: 3,
                offset: 32,
                len: 27,
            },
        );
        ix.apply(
            &Record::Publish {
                msg: MsgId(5),
                queues: Cow::Borrowed(&[QueueId(1), QueueId(2)]),
                payload: b"x",
            },
            Loc {
                seg: 3,
                offset: 59,
                len: 49,
            },
        );
        let info = CheckpointInfo {
            lsn: 9,
            replay: ReplayFrom {
                seg: 3,
                offset: 108,
            },
        };
        (info, ix)
    }

    /// Version 1, as written before chains (FORMAT.md's old example):
    /// still read, to the same index.
    #[test]
    fn golden_bytes_checkpoint_v1_still_reads() {
        let (info, ix) = golden_index();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            b'B', b'E', b'R', b'T', b'H', b'C', b'K', b'P', // magic
            1, 0, 0, 0,                   // format_version
            2, 0, 0, 0,                   // group
            9, 0, 0, 0, 0, 0, 0, 0,       // lsn
            3, 0, 0, 0, 0, 0, 0, 0,       // replay_seg
            108, 0, 0, 0, 0, 0, 0, 0,     // replay_offset
            5, 0, 0, 0, 0, 0, 0, 0,       // msg_id_hw
            1, 0, 0, 0, 0, 0, 0, 0,       // meta_count
            1, 0, 0, 0, 0, 0, 0, 0,       // msg_count
            1, 0, 0, 0,  2, 0, 0, 0,      // key_len, value_len
            b'k', b'v', b'v',             // key, value
            5, 0, 0, 0, 0, 0, 0, 0,       // msg
            3, 0, 0, 0,                   // seg
            59, 0, 0, 0,                  // offset
            49, 0, 0, 0,                  // rec_len
            2, 0, 0, 0,                   // queue_count
            1, 0, 0, 0, 0, 0, 0, 0,       // queue
            2, 0, 0, 0, 0, 0, 0, 0,       // queue
            0x83, 0x54, 0x51, 0xd0,       // crc32c over all of the above
        ];
        assert_eq!(encode_v1(2, info, &ix), expected);
        let (i2, ix2) = decode(2, expected, Path::new("c")).unwrap();
        assert_eq!(i2, info);
        assert_eq!(ix2.meta, ix.meta);
        assert_eq!(
            ix2.iter_live().collect::<Vec<_>>(),
            ix.iter_live().collect::<Vec<_>>()
        );
        assert_eq!(ix2.msg_id_hw, 5);
    }

    /// Magic and format version of the golden bases.
    fn golden_head(version: u8) -> Vec<u8> {
        [&b"BERTHCKP"[..], &[version, 0, 0, 0]].concat()
    }

    /// The golden bases' bytes after the format version, up to the end
    /// of version 2's body ([`golden_index`]); version 3 adds its stream
    /// section after them.
    #[rustfmt::skip]
    const GOLDEN_BODY_V2: &[u8] = &[
        2, 0, 0, 0,               // group
        9, 0, 0, 0, 0, 0, 0, 0,       // lsn
        3, 0, 0, 0, 0, 0, 0, 0,       // replay_seg
        108, 0, 0, 0, 0, 0, 0, 0,     // replay_offset
        5, 0, 0, 0, 0, 0, 0, 0,       // msg_id_hw
        1, 0, 0, 0,  0, 0, 0, 0,      // kind (base), reserved
        0, 0, 0, 0, 0, 0, 0, 0,       // parent_no
        0, 0, 0, 0, 0, 0, 0, 0,       // parent_lsn
        1, 0, 0, 0, 0, 0, 0, 0,       // meta_count
        1, 0, 0, 0,  2, 0, 0, 0,      // key_len, value_len
        b'k', b'v', b'v',         // key, value
        1, 0, 0, 0, 0, 0, 0, 0,       // run_count
        2, 0, 0, 0,  1, 0, 0, 0,      // queue_count, msg_count
        1, 0, 0, 0, 0, 0, 0, 0,       // queue
        2, 0, 0, 0, 0, 0, 0, 0,       // queue
        5, 0, 0, 0, 0, 0, 0, 0,       // msg
        3, 0, 0, 0,  59, 0, 0, 0,     // seg, offset
        49, 0, 0, 0,              // rec_len
    ];

    /// Version 3 base (FORMAT.md's example): version 2's index plus one
    /// stream. Its checksum was computed independently of the crate (a
    /// bitwise CRC32C in Python).
    #[test]
    fn golden_bytes_checkpoint() {
        let (info, mut ix) = golden_index();
        ix.apply(
            &Record::Append {
                queue: QueueId(4),
                offset: 7,
                payload: &[],
            },
            Loc {
                seg: 3,
                offset: 160,
                len: 40,
            },
        );
        #[rustfmt::skip]
        let tail: &[u8] = &[
            1, 0, 0, 0, 0, 0, 0, 0,       // stream_count
            4, 0, 0, 0, 0, 0, 0, 0,       // queue
            0, 0, 0, 0, 0, 0, 0, 0,       // trimmed_below
            1, 0, 0, 0,                   // span_count
            3, 0, 0, 0,                   // seg
            7, 0, 0, 0, 0, 0, 0, 0,       // last
            200, 0, 0, 0,                 // end
            1, 0, 0, 0, 0, 0, 0, 0,       // count
            40, 0, 0, 0, 0, 0, 0, 0,      // bytes
            1, 0, 0, 0,                   // point_count
            7, 0, 0, 0, 0, 0, 0, 0,       // point: offset
            160, 0, 0, 0,                 // point: pos
            0xd4, 0x54, 0x97, 0xae,       // crc32c over all of the above
        ];
        let expected = &[&golden_head(3)[..], GOLDEN_BODY_V2, tail].concat()[..];
        assert_eq!(expected.len(), 223);
        let bytes = encode(2, info, &ix);
        assert_eq!(&bytes[..], expected);
        let (i2, ix2) = decode(2, &bytes, Path::new("c")).unwrap();
        assert_eq!(i2, info);
        assert_eq!(ix2.meta, ix.meta);
        assert_eq!(ix2.stream(QueueId(4)), ix.stream(QueueId(4)));
        assert_eq!(ix2.seg_live(3), ix.seg_live(3));
        ix2.check();
    }

    /// Version 2 base (written before streams' sections): still read. Its
    /// checksum was computed independently of the crate (a bitwise CRC32C
    /// in Python).
    #[test]
    fn golden_bytes_checkpoint_v2_still_reads() {
        let (info, ix) = golden_index();
        #[rustfmt::skip]
        let crc: &[u8] = &[
            0x1e, 0x19, 0x96, 0xf2,       // crc32c over all of the above
        ];
        let expected = &[&golden_head(2)[..], GOLDEN_BODY_V2, crc].concat()[..];
        assert_eq!(expected.len(), 147);
        let (i2, ix2) = decode(2, expected, Path::new("c")).unwrap();
        assert_eq!(i2, info);
        assert_eq!(ix2.meta, ix.meta);
        assert_eq!(
            ix2.iter_live().collect::<Vec<_>>(),
            ix.iter_live().collect::<Vec<_>>()
        );
    }

    /// A base plus deltas loads to the index the records give, whatever
    /// the records; and a delta names its parent.
    #[test]
    fn a_chain_loads_to_the_index_its_records_give() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("BERTH_TEST_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0xC4A1);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = Index::default();
        let info = |lsn| CheckpointInfo {
            lsn,
            replay: ReplayFrom { seg: 1, offset: 32 },
        };
        let mut chain = vec![encode(0, info(0), &model)];
        let mut lsn = 0;
        let mut next_offset = [0u64; 5];
        for link in 1..30u64 {
            let mut delta = DeltaBuilder::new(0);
            for _ in 0..200 {
                lsn += 1;
                let q = QueueId(rng.random_range(0..5));
                let m = MsgId(rng.random_range(1..400));
                // In journal order, as a delta's records always are: a
                // new segment every 300 records.
                let at = Loc {
                    seg: 1 + u32::try_from(lsn / 300).unwrap(),
                    offset: 32 + u32::try_from(lsn % 300).unwrap() * 64,
                    len: 64,
                };
                let qs = [q, QueueId(rng.random_range(0..5))];
                let r = match rng.random_range(0..13) {
                    10 | 11 => {
                        let o = &mut next_offset[q.0 as usize];
                        *o += rng.random_range(1..3);
                        Record::Append {
                            queue: q,
                            offset: *o,
                            payload: b"",
                        }
                    }
                    12 => Record::Trim {
                        queue: q,
                        below: next_offset[q.0 as usize].saturating_sub(rng.random_range(0..20)),
                    },
                    0..=3 => Record::Publish {
                        msg: m,
                        queues: Cow::Borrowed(&qs[..rng.random_range(1..=2)]),
                        payload: b"",
                    },
                    4 => Record::Relocate {
                        msg: m,
                        queues: Cow::Borrowed(&qs[..1]),
                        payload: b"",
                    },
                    5..=7 => Record::Remove {
                        queue: q,
                        msgs: Cow::Owned(vec![m, MsgId(m.0 + 1)]),
                    },
                    8 => Record::Purge { queue: q },
                    _ => Record::MetaPut {
                        key: b"k",
                        value: b"v",
                    },
                };
                model.apply(&r, at);
                delta.push(&r, at);
            }
            chain.push(delta.encode(0, info(lsn), link - 1, lsn - 200));
        }
        let mut index = Index::default();
        for (i, bytes) in chain.into_iter().enumerate() {
            let p = parse(0, bytes, Path::new("c")).unwrap();
            if i == 0 {
                assert_eq!(p.kind, Kind::Base);
                index = p.load_base().unwrap();
            } else {
                assert!(
                    matches!(p.kind, Kind::Delta { parent_no, .. } if parent_no == i as u64 - 1)
                );
                p.apply_delta(&mut index).unwrap();
            }
            index.check();
        }
        let sorted = |ix: &Index| {
            let mut v: Vec<_> = ix.iter_live().collect();
            v.sort_by_key(|m| m.msg);
            v
        };
        assert_eq!(sorted(&index), sorted(&model), "seed {seed}");
        assert_eq!(index.meta, model.meta);
        let streams = |ix: &Index| {
            ix.streams()
                .map(|(q, s)| (q, s.clone()))
                .collect::<Vec<_>>()
        };
        assert!(model.stream_points() > 0, "the chain holds streams");
        assert_eq!(streams(&index), streams(&model), "seed {seed}");
        let rebased = decode(0, &encode(0, info(lsn), &index), Path::new("c"))
            .unwrap()
            .1;
        assert_eq!(sorted(&rebased), sorted(&model), "seed {seed}");
        assert_eq!(streams(&rebased), streams(&model), "seed {seed}");
        rebased.check();
    }

    #[test]
    fn names_roundtrip() {
        assert_eq!(parse_checkpoint_name(&checkpoint_name(77)), Some(77));
        assert_eq!(parse_checkpoint_name("ckpt.tmp"), None);
    }
}
