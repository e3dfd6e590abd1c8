//! The journal record codec: bytes in, typed records out and back. No I/O.
//!
//! Layout (docs/FORMAT.md §Records), all integers little-endian:
//!
//! ```text
//!  0        4          8                16     17        20
//!  +--------+----------+----------------+------+---------+----------------+
//!  | crc32c | body_len |      lsn       | kind | reserved| body (body_len)|
//!  |  u32   |   u32    |      u64       |  u8  | 3 × 0   |                |
//!  +--------+----------+----------------+------+---------+----------------+
//!  crc32c covers bytes 4 .. 20 + body_len (everything after itself),
//!  seeded with the store's record salt: crc32c_append(salt, bytes).
//! ```
//!
//! The salt is a random `u32` fixed when the store is created and kept in
//! its manifest (0 for stores created before manifest version 2, which
//! gives the plain CRC32C). It is not a MAC: it exists because the
//! resynchronising scan after damage looks for valid records at every
//! offset, including inside message payloads that publishers chose. A
//! publisher never sees the salt, so a record it embeds in a payload fails
//! the checksum (but for a 2^-32 chance) and is never taken for a journal
//! record.
//!
//! Invariants:
//! - `decode` never panics and never allocates more than the input's size,
//!   whatever the input (fuzzed: `fuzz/fuzz_targets/record.rs`).
//! - `decode(encode(r)) == r` for every record (property-tested).
//! - A record whose checksum passes but whose body does not parse is
//!   reported as `Unparseable`, never silently skipped: the writer wrote it,
//!   so it is a newer format or a bug, and recovery must stop.
//! - The offsets below are computed from one another and the header size is
//!   asserted at compile time.

use std::borrow::Cow;

use crate::limits::RECORD_BODY_BYTES_MAX;
use crate::{MsgId, QueueId};

pub const OFF_CRC: usize = 0;
pub const OFF_BODY_LEN: usize = OFF_CRC + 4;
pub const OFF_LSN: usize = OFF_BODY_LEN + 4;
pub const OFF_KIND: usize = OFF_LSN + 8;
pub const OFF_RESERVED: usize = OFF_KIND + 1;
/// Bytes before a record's body.
pub const RECORD_HEADER_BYTES: usize = OFF_RESERVED + 3;
const _: () = assert!(RECORD_HEADER_BYTES == 20);

/// Publish / relocate body: `msg u64 | queue_count u32 | queues u64 × n | payload`.
pub const PUBLISH_OFF_MSG: usize = 0;
pub const PUBLISH_OFF_QUEUE_COUNT: usize = PUBLISH_OFF_MSG + 8;
pub const PUBLISH_OFF_QUEUES: usize = PUBLISH_OFF_QUEUE_COUNT + 4;
const _: () = assert!(PUBLISH_OFF_QUEUES == 12);
/// Remove body: `queue u64 | msg_count u32 | msgs u64 × n`.
pub const REMOVE_OFF_QUEUE: usize = 0;
pub const REMOVE_OFF_MSG_COUNT: usize = REMOVE_OFF_QUEUE + 8;
pub const REMOVE_OFF_MSGS: usize = REMOVE_OFF_MSG_COUNT + 4;
const _: () = assert!(REMOVE_OFF_MSGS == 12);
/// Metadata put body: `key_len u32 | key | value`.
pub const META_OFF_KEY_LEN: usize = 0;
pub const META_OFF_KEY: usize = META_OFF_KEY_LEN + 4;
/// Purge body: `queue u64`.
pub const PURGE_BODY_BYTES: usize = 8;
/// Append body (a stream's message): `queue u64 | offset u64 | payload`.
pub const APPEND_OFF_QUEUE: usize = 0;
pub const APPEND_OFF_OFFSET: usize = APPEND_OFF_QUEUE + 8;
pub const APPEND_OFF_PAYLOAD: usize = APPEND_OFF_OFFSET + 8;
const _: () = assert!(APPEND_OFF_PAYLOAD == 16);
/// Trim body: `queue u64 | below u64`.
pub const TRIM_OFF_QUEUE: usize = 0;
pub const TRIM_OFF_BELOW: usize = TRIM_OFF_QUEUE + 8;
pub const TRIM_BODY_BYTES: usize = TRIM_OFF_BELOW + 8;

/// Record kinds; the numbers are on disk and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Publish = 1,
    Remove = 2,
    MetaPut = 3,
    MetaDelete = 4,
    Purge = 5,
    Relocate = 6,
    Hole = 7,
    Append = 8,
    Trim = 9,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Publish,
            2 => Kind::Remove,
            3 => Kind::MetaPut,
            4 => Kind::MetaDelete,
            5 => Kind::Purge,
            6 => Kind::Relocate,
            7 => Kind::Hole,
            8 => Kind::Append,
            9 => Kind::Trim,
            _ => return None,
        })
    }
}

/// One journal record, borrowing its variable parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A message stored once for all its `queues` in this group.
    Publish {
        msg: MsgId,
        queues: Cow<'a, [QueueId]>,
        payload: &'a [u8],
    },
    /// Compaction's copy of a live message: same body layout as `Publish`;
    /// replaces the message's location and queue set.
    Relocate {
        msg: MsgId,
        queues: Cow<'a, [QueueId]>,
        payload: &'a [u8],
    },
    /// Acknowledged / removed from `queue`.
    Remove {
        queue: QueueId,
        msgs: Cow<'a, [MsgId]>,
    },
    /// Metadata key set to value (last write wins).
    MetaPut { key: &'a [u8], value: &'a [u8] },
    /// Metadata key removed.
    MetaDelete { key: &'a [u8] },
    /// Every message then in `queue` removed from it.
    Purge { queue: QueueId },
    /// Recovery's patch over quarantined bytes: `body_len` bytes of zeros.
    /// Its `lsn` is 0; the records after it may skip sequence numbers.
    Hole { body_len: u32 },
    /// A stream's message at `offset` of stream `queue`: indexed sparsely
    /// (`stream_index.rs`), never one index entry per record.
    Append {
        queue: QueueId,
        offset: u64,
        payload: &'a [u8],
    },
    /// Every Append of stream `queue` below offset `below` leaves it.
    Trim { queue: QueueId, below: u64 },
}

impl Record<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Record::Publish { .. } => Kind::Publish,
            Record::Relocate { .. } => Kind::Relocate,
            Record::Remove { .. } => Kind::Remove,
            Record::MetaPut { .. } => Kind::MetaPut,
            Record::MetaDelete { .. } => Kind::MetaDelete,
            Record::Purge { .. } => Kind::Purge,
            Record::Hole { .. } => Kind::Hole,
            Record::Append { .. } => Kind::Append,
            Record::Trim { .. } => Kind::Trim,
        }
    }

    /// Size of the body this record encodes to.
    pub fn body_len(&self) -> usize {
        match self {
            Record::Publish {
                queues, payload, ..
            }
            | Record::Relocate {
                queues, payload, ..
            } => PUBLISH_OFF_QUEUES + 8 * queues.len() + payload.len(),
            Record::Remove { msgs, .. } => REMOVE_OFF_MSGS + 8 * msgs.len(),
            Record::MetaPut { key, value } => META_OFF_KEY + key.len() + value.len(),
            Record::MetaDelete { key } => key.len(),
            Record::Purge { .. } => PURGE_BODY_BYTES,
            Record::Hole { body_len } => *body_len as usize,
            Record::Append { payload, .. } => APPEND_OFF_PAYLOAD + payload.len(),
            Record::Trim { .. } => TRIM_BODY_BYTES,
        }
    }

    /// The message a Publish or Relocate carries: its id, queues and
    /// payload.
    pub fn message(&self) -> Option<(MsgId, &[QueueId], &[u8])> {
        match self {
            Record::Publish {
                msg,
                queues,
                payload,
            }
            | Record::Relocate {
                msg,
                queues,
                payload,
            } => Some((*msg, queues, payload)),
            _ => None,
        }
    }

    /// Size of the whole encoded record.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES + self.body_len()
    }
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends the encoding of `record` with sequence number `lsn` to `out`,
/// its checksum seeded with the store's record `salt`.
///
/// # Panics
/// If the body exceeds [`RECORD_BODY_BYTES_MAX`] or a count does not fit its
/// field; callers check sizes against the configured limits first.
pub fn encode(salt: u32, lsn: u64, record: &Record<'_>, out: &mut Vec<u8>) {
    encode_continued(salt, lsn, record, &[], out);
}

/// [`encode`] of a record whose payload goes on past the one it holds:
/// the bytes of `more`, in order, follow its payload. The result is the
/// bytes [`encode`] gives for the record with the whole payload in one
/// slice; the writer uses it to copy a payload handed over in pieces
/// ([`crate::payload::Payload`]) straight into its batch.
///
/// # Panics
/// As [`encode`]; and if `more` is not empty for a record that carries no
/// payload (only Publish, Relocate and Append end with one).
pub fn encode_continued(
    salt: u32,
    lsn: u64,
    record: &Record<'_>,
    more: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let more_len: usize = more.iter().map(|m| m.len()).sum();
    assert!(
        more_len == 0
            || matches!(
                record,
                Record::Publish { .. } | Record::Relocate { .. } | Record::Append { .. }
            ),
        "only a payload can be continued"
    );
    let body_len = record.body_len() + more_len;
    assert!(
        body_len <= RECORD_BODY_BYTES_MAX as usize,
        "record body of {body_len} bytes"
    );
    let start = out.len();
    out.reserve(RECORD_HEADER_BYTES + body_len);
    out.extend_from_slice(&[0; 4]); // crc, filled below
    out.extend_from_slice(&u32::try_from(body_len).expect("checked").to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.push(record.kind() as u8);
    out.extend_from_slice(&[0; 3]);
    match record {
        Record::Publish { .. } | Record::Relocate { .. } => {
            let (msg, queues, payload) = record.message().expect("a message record");
            out.extend_from_slice(&msg.0.to_le_bytes());
            let n = u32::try_from(queues.len()).expect("queue count fits u32");
            out.extend_from_slice(&n.to_le_bytes());
            for q in queues.iter() {
                out.extend_from_slice(&q.0.to_le_bytes());
            }
            out.extend_from_slice(payload);
        }
        Record::Remove { queue, msgs } => {
            out.extend_from_slice(&queue.0.to_le_bytes());
            let n = u32::try_from(msgs.len()).expect("msg count fits u32");
            out.extend_from_slice(&n.to_le_bytes());
            for m in msgs.iter() {
                out.extend_from_slice(&m.0.to_le_bytes());
            }
        }
        Record::MetaPut { key, value } => {
            let n = u32::try_from(key.len()).expect("key fits u32");
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(value);
        }
        Record::MetaDelete { key } => out.extend_from_slice(key),
        Record::Purge { queue } => out.extend_from_slice(&queue.0.to_le_bytes()),
        Record::Hole { body_len } => out.resize(out.len() + *body_len as usize, 0),
        Record::Append {
            queue,
            offset,
            payload,
        } => {
            out.extend_from_slice(&queue.0.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(payload);
        }
        Record::Trim { queue, below } => {
            out.extend_from_slice(&queue.0.to_le_bytes());
            out.extend_from_slice(&below.to_le_bytes());
        }
    }
    // The payload is the last field of every record that has one.
    for m in more {
        out.extend_from_slice(m);
    }
    debug_assert_eq!(out.len() - start, RECORD_HEADER_BYTES + body_len);
    let crc = crc32c::crc32c_append(salt, &out[start + OFF_BODY_LEN..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Re-seals the records of `buf`, one after another from its start, under
/// the salt `to`: each frame whose checksum passes under `from` gets the
/// checksum `to` gives it, nothing else changes. Stops at the first frame
/// that does not check out under `from` (or the end) and returns its
/// offset; what follows is the caller's to judge. (Restore gives a new
/// store a new salt this way, so an unsalted store does not stay so.)
pub fn reseal(from: u32, to: u32, buf: &mut [u8]) -> usize {
    let mut at = 0;
    while let Decoded::Record { len, .. } | Decoded::Unparseable { len, .. } =
        decode(from, &buf[at..])
    {
        let frame = &mut buf[at..at + len];
        let crc = crc32c::crc32c_append(to, &frame[OFF_BODY_LEN..]);
        frame[OFF_CRC..OFF_BODY_LEN].copy_from_slice(&crc.to_le_bytes());
        at += len;
    }
    at
}

/// Why a frame is not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// `body_len` exceeds [`RECORD_BODY_BYTES_MAX`].
    LengthTooLarge(u32),
    /// Stored and computed CRC32C differ.
    Checksum { stored: u32, computed: u32 },
}

/// Result of looking at the bytes where a record should start.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, checksummed, parsed record of `len` bytes.
    Record {
        lsn: u64,
        record: Record<'a>,
        len: usize,
    },
    /// The bytes end before the frame does: `needed` bytes in total would be
    /// required to check it. Not an error for a reader of a growing file; a
    /// torn tail for recovery.
    Incomplete { needed: usize },
    /// The frame is damaged.
    Corrupt(Corruption),
    /// The checksum passes but the body does not parse.
    Unparseable {
        lsn: u64,
        len: usize,
        reason: String,
    },
}

/// The payload of message `msg` from the record at the start of `buf`, if
/// that record checks out (under `salt`) and is `msg`'s Publish or
/// Relocate; otherwise what was found there instead.
pub fn message_payload(salt: u32, buf: &[u8], msg: MsgId) -> Result<&[u8], Decoded<'_>> {
    match decode(salt, buf) {
        Decoded::Record {
            record:
                Record::Publish {
                    msg: m, payload, ..
                }
                | Record::Relocate {
                    msg: m, payload, ..
                },
            ..
        } if m == msg => Ok(payload),
        other => Err(other),
    }
}

/// Checks (under the store's record `salt`) and parses the record at the
/// start of `buf`.
pub fn decode(salt: u32, buf: &[u8]) -> Decoded<'_> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Decoded::Incomplete {
            needed: RECORD_HEADER_BYTES,
        };
    }
    let body_len = u32_at(buf, OFF_BODY_LEN);
    if body_len > RECORD_BODY_BYTES_MAX {
        return Decoded::Corrupt(Corruption::LengthTooLarge(body_len));
    }
    let len = RECORD_HEADER_BYTES + body_len as usize;
    if buf.len() < len {
        return Decoded::Incomplete { needed: len };
    }
    let stored = u32_at(buf, OFF_CRC);
    let computed = crc32c::crc32c_append(salt, &buf[OFF_BODY_LEN..len]);
    if stored != computed {
        return Decoded::Corrupt(Corruption::Checksum { stored, computed });
    }
    let lsn = u64_at(buf, OFF_LSN);
    let body = &buf[RECORD_HEADER_BYTES..len];
    match parse_body(
        buf[OFF_KIND],
        &buf[OFF_RESERVED..RECORD_HEADER_BYTES],
        lsn,
        body,
    ) {
        Ok(record) => Decoded::Record { lsn, record, len },
        Err(reason) => Decoded::Unparseable { lsn, len, reason },
    }
}

fn parse_body<'a>(
    kind: u8,
    reserved: &[u8],
    lsn: u64,
    body: &'a [u8],
) -> Result<Record<'a>, String> {
    if reserved.iter().any(|&b| b != 0) {
        return Err(format!("reserved header bytes {reserved:?} are not zero"));
    }
    let kind = Kind::from_u8(kind).ok_or_else(|| format!("unknown record kind {kind}"))?;
    if (kind == Kind::Hole) != (lsn == 0) {
        return Err(format!("{kind:?} record with lsn {lsn}"));
    }
    match kind {
        Kind::Publish | Kind::Relocate => parse_publish(kind, body),
        Kind::Remove => parse_remove(body),
        Kind::MetaPut => parse_meta_put(body),
        Kind::MetaDelete => Ok(Record::MetaDelete { key: body }),
        Kind::Purge => {
            if body.len() != PURGE_BODY_BYTES {
                return Err(format!("purge body of {} bytes", body.len()));
            }
            Ok(Record::Purge {
                queue: QueueId(u64_at(body, 0)),
            })
        }
        Kind::Append => {
            if body.len() < APPEND_OFF_PAYLOAD {
                return Err(too_short(kind, body, "its header"));
            }
            let queue = QueueId(u64_at(body, APPEND_OFF_QUEUE));
            if queue.0 == u64::MAX {
                return Err("append names the reserved queue id u64::MAX".into());
            }
            Ok(Record::Append {
                queue,
                offset: u64_at(body, APPEND_OFF_OFFSET),
                payload: &body[APPEND_OFF_PAYLOAD..],
            })
        }
        Kind::Trim => {
            if body.len() != TRIM_BODY_BYTES {
                return Err(format!("trim body of {} bytes", body.len()));
            }
            Ok(Record::Trim {
                queue: QueueId(u64_at(body, TRIM_OFF_QUEUE)),
                below: u64_at(body, TRIM_OFF_BELOW),
            })
        }
        Kind::Hole => {
            if body.iter().any(|&b| b != 0) {
                return Err("hole body is not all zeros".into());
            }
            Ok(Record::Hole {
                body_len: u32::try_from(body.len()).expect("bounded by RECORD_BODY_BYTES_MAX"),
            })
        }
    }
}

fn too_short(kind: Kind, body: &[u8], what: &str) -> String {
    format!("{kind:?} body of {} bytes too short for {what}", body.len())
}

/// A Publish or Relocate body (same layout).
fn parse_publish(kind: Kind, body: &[u8]) -> Result<Record<'_>, String> {
    if body.len() < PUBLISH_OFF_QUEUES {
        return Err(too_short(kind, body, "its header"));
    }
    let msg = MsgId(u64_at(body, PUBLISH_OFF_MSG));
    let n = u32_at(body, PUBLISH_OFF_QUEUE_COUNT) as usize;
    if n == 0 {
        return Err("publish to no queue".into());
    }
    let queues_end = n
        .checked_mul(8)
        .and_then(|b| b.checked_add(PUBLISH_OFF_QUEUES))
        .filter(|&e| e <= body.len())
        .ok_or_else(|| too_short(kind, body, "its queue list"))?;
    let queues: Vec<QueueId> = body[PUBLISH_OFF_QUEUES..queues_end]
        .chunks_exact(8)
        .map(|c| QueueId(u64_at(c, 0)))
        .collect();
    if queues.contains(&QueueId(u64::MAX)) {
        // The index's "several queues" marker; the store's API
        // never writes it (Store::publish refuses it).
        return Err("publish names the reserved queue id u64::MAX".into());
    }
    let payload = &body[queues_end..];
    let queues = Cow::Owned(queues);
    Ok(if kind == Kind::Publish {
        Record::Publish {
            msg,
            queues,
            payload,
        }
    } else {
        Record::Relocate {
            msg,
            queues,
            payload,
        }
    })
}

fn parse_remove(body: &[u8]) -> Result<Record<'_>, String> {
    if body.len() < REMOVE_OFF_MSGS {
        return Err(too_short(Kind::Remove, body, "its header"));
    }
    let queue = QueueId(u64_at(body, REMOVE_OFF_QUEUE));
    let n = u32_at(body, REMOVE_OFF_MSG_COUNT) as usize;
    if n == 0
        || n.checked_mul(8)
            .and_then(|b| b.checked_add(REMOVE_OFF_MSGS))
            != Some(body.len())
    {
        return Err(format!(
            "remove of {n} messages in a {}-byte body",
            body.len()
        ));
    }
    let msgs = body[REMOVE_OFF_MSGS..]
        .chunks_exact(8)
        .map(|c| MsgId(u64_at(c, 0)))
        .collect::<Vec<_>>();
    Ok(Record::Remove {
        queue,
        msgs: Cow::Owned(msgs),
    })
}

fn parse_meta_put(body: &[u8]) -> Result<Record<'_>, String> {
    if body.len() < META_OFF_KEY {
        return Err(too_short(Kind::MetaPut, body, "its key length"));
    }
    let key_len = u32_at(body, META_OFF_KEY_LEN) as usize;
    let key_end = META_OFF_KEY
        .checked_add(key_len)
        .filter(|&e| e <= body.len())
        .ok_or_else(|| too_short(Kind::MetaPut, body, "its key"))?;
    Ok(Record::MetaPut {
        key: &body[META_OFF_KEY..key_end],
        value: &body[key_end..],
    })
}

/// Best-effort reading of a damaged record's header, for the loss report:
/// if the bytes at `buf` look like a publish header, the message and queues
/// it names. Unverified (the checksum failed), so only ever *reported*.
pub fn salvage_publish_header(buf: &[u8]) -> Option<(MsgId, Vec<QueueId>)> {
    let kind = *buf.get(OFF_KIND)?;
    if kind != Kind::Publish as u8 && kind != Kind::Relocate as u8 {
        return None;
    }
    let body = buf.get(RECORD_HEADER_BYTES..)?;
    let msg = MsgId(u64::from_le_bytes(body.get(0..8)?.try_into().ok()?));
    let n = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?) as usize;
    if n == 0 || n > 1024 {
        return None;
    }
    let queues = body
        .get(PUBLISH_OFF_QUEUES..PUBLISH_OFF_QUEUES + 8 * n)?
        .chunks_exact(8)
        .map(|c| QueueId(u64_at(c, 0)))
        .collect();
    Some((msg, queues))
}

#[cfg(test)]
mod tests;
