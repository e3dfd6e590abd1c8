//! Checkpoints: a group's whole index at one journal position, so restart
//! reads the checkpoint plus only the journal after it.
//!
//! File `ckpt-<n:020>.ckpt` in the group directory (`n` counts the group's
//! checkpoints; the newest has the highest), written as
//! `ckpt.tmp` + fdatasync + rename + directory fsync:
//!
//! ```text
//!  header (64 bytes)
//!  0          8        12      16      24           32              40          48          56          64
//!  +----------+--------+-------+-------+------------+---------------+-----------+-----------+-----------+
//!  | BERTHCKP | version| group |  lsn  | replay_seg | replay_offset | msg_id_hw | meta_count| msg_count |
//!  |  8 bytes |  u32   |  u32  |  u64  |    u64     |      u64      |    u64    |    u64    |    u64    |
//!  +----------+--------+-------+-------+------------+---------------+-----------+-----------+-----------+
//!  meta_count × ( key_len u32 | value_len u32 | key | value )
//!  msg_count  × ( msg u64 | seg u32 | offset u32 | rec_len u32 | queue_count u32 | queue u64 × n )
//!  crc32c u32 over every byte before it
//! ```
//!
//! Invariants:
//! - The journal up to `lsn` is fdatasync'ed before the checkpoint is
//!   written, so `replay_seg`/`replay_offset` always point inside (or at
//!   the end of) durable journal.
//! - A checkpoint is trusted only whole: one CRC covers it all; a
//!   checkpoint that fails it is ignored in favour of the previous one.
//! - The two newest checkpoints are kept, and a segment is deleted only if
//!   it lies wholly before the replay position of both, so falling back to
//!   the older checkpoint always finds its journal.

use std::path::Path;

use crate::error::StoreError;
use crate::index::{Index, Loc};
use crate::segment::FORMAT_VERSION;
use crate::{MsgId, QueueId};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"BERTHCKP";
pub const CK_OFF_VERSION: usize = 8;
pub const CK_OFF_GROUP: usize = CK_OFF_VERSION + 4;
pub const CK_OFF_LSN: usize = CK_OFF_GROUP + 4;
pub const CK_OFF_REPLAY_SEG: usize = CK_OFF_LSN + 8;
pub const CK_OFF_REPLAY_OFFSET: usize = CK_OFF_REPLAY_SEG + 8;
pub const CK_OFF_MSG_ID_HW: usize = CK_OFF_REPLAY_OFFSET + 8;
pub const CK_OFF_META_COUNT: usize = CK_OFF_MSG_ID_HW + 8;
pub const CK_OFF_MSG_COUNT: usize = CK_OFF_META_COUNT + 8;
pub const CHECKPOINT_HEADER_BYTES: usize = CK_OFF_MSG_COUNT + 8;
const _: () = assert!(CHECKPOINT_HEADER_BYTES == 64);
pub const CHECKPOINT_TMP_NAME: &str = "ckpt.tmp";

/// Where replay resumes after a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReplayFrom {
    pub seg: u32,
    pub offset: u64,
}

/// A decoded checkpoint's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub lsn: u64,
    pub replay: ReplayFrom,
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

/// Serializes `index` as a checkpoint of `group` at `info`.
pub fn encode(group: u32, info: CheckpointInfo, index: &Index) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + 40 * index.live_messages());
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&info.lsn.to_le_bytes());
    out.extend_from_slice(&u64::from(info.replay.seg).to_le_bytes());
    out.extend_from_slice(&info.replay.offset.to_le_bytes());
    out.extend_from_slice(&index.msg_id_hw.to_le_bytes());
    out.extend_from_slice(&(index.meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&(index.live_messages() as u64).to_le_bytes());
    debug_assert_eq!(out.len(), CHECKPOINT_HEADER_BYTES);
    for (k, v) in &index.meta {
        out.extend_from_slice(&u32::try_from(k.len()).expect("key fits u32").to_le_bytes());
        out.extend_from_slice(
            &u32::try_from(v.len())
                .expect("value fits u32")
                .to_le_bytes(),
        );
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    for m in index.iter_live() {
        out.extend_from_slice(&m.msg.0.to_le_bytes());
        out.extend_from_slice(&m.loc.seg.to_le_bytes());
        out.extend_from_slice(&m.loc.offset.to_le_bytes());
        out.extend_from_slice(&m.loc.len.to_le_bytes());
        out.extend_from_slice(&u32::try_from(m.queues.len()).expect("fits").to_le_bytes());
        for q in &m.queues {
            out.extend_from_slice(&q.0.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

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
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Parses and verifies a checkpoint of `group`.
pub fn decode(
    group: u32,
    bytes: &[u8],
    path: &Path,
) -> Result<(CheckpointInfo, Index), StoreError> {
    let corrupt = |offset: usize, reason: &str| StoreError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason: reason.to_owned(),
    };
    if bytes.len() < CHECKPOINT_HEADER_BYTES + 4 {
        return Err(corrupt(0, "shorter than a checkpoint header"));
    }
    let body_end = bytes.len() - 4;
    let stored = u32::from_le_bytes(bytes[body_end..].try_into().expect("4 bytes"));
    if stored != crc32c::crc32c(&bytes[..body_end]) {
        return Err(corrupt(body_end, "checksum mismatch"));
    }
    if bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt(0, "bad magic"));
    }
    let mut r = Reader {
        buf: &bytes[..body_end],
        at: 8,
    };
    let bad = |r: &Reader<'_>| corrupt(r.at, "truncated or inconsistent body");
    let version = r.u32().ok_or_else(|| bad(&r))?;
    if version != FORMAT_VERSION {
        return Err(StoreError::FormatVersion {
            path: path.to_path_buf(),
            found: version,
            expected: FORMAT_VERSION,
        });
    }
    let g = r.u32().ok_or_else(|| bad(&r))?;
    if g != group {
        return Err(corrupt(
            CK_OFF_GROUP,
            &format!("checkpoint of group {g} in group {group}'s directory"),
        ));
    }
    let lsn = r.u64().ok_or_else(|| bad(&r))?;
    let seg = r.u64().ok_or_else(|| bad(&r))?;
    let offset = r.u64().ok_or_else(|| bad(&r))?;
    let mut index = Index::default();
    index.msg_id_hw = r.u64().ok_or_else(|| bad(&r))?;
    let meta_count = r.u64().ok_or_else(|| bad(&r))?;
    let msg_count = r.u64().ok_or_else(|| bad(&r))?;
    let seg = u32::try_from(seg).map_err(|e| {
        corrupt(
            CK_OFF_REPLAY_SEG,
            &format!("segment number {seg} out of range: {e}"),
        )
    })?;
    for _ in 0..meta_count {
        let kl = r.u32().ok_or_else(|| bad(&r))? as usize;
        let vl = r.u32().ok_or_else(|| bad(&r))? as usize;
        let k = r.take(kl).ok_or_else(|| bad(&r))?.to_vec();
        let v = r.take(vl).ok_or_else(|| bad(&r))?.to_vec();
        index.meta.insert(k, v);
    }
    for _ in 0..msg_count {
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
        let queues: Vec<QueueId> = raw
            .chunks_exact(8)
            .map(|c| QueueId(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .collect();
        index.insert(msg, &queues, loc);
    }
    if r.at != body_end {
        return Err(bad(&r));
    }
    Ok((
        CheckpointInfo {
            lsn,
            replay: ReplayFrom { seg, offset },
        },
        index,
    ))
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

    #[test]
    fn golden_bytes_checkpoint() {
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
        let bytes = encode(2, info, &ix);
        assert_eq!(&bytes[..], expected);
        let (i2, ix2) = decode(2, &bytes, Path::new("c")).unwrap();
        assert_eq!(i2, info);
        assert_eq!(ix2.meta, ix.meta);
    }

    #[test]
    fn names_roundtrip() {
        assert_eq!(parse_checkpoint_name(&checkpoint_name(77)), Some(77));
        assert_eq!(parse_checkpoint_name("ckpt.tmp"), None);
    }
}
