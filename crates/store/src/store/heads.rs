//! Reading the first bytes of stored messages' payloads without their
//! bodies: what a restart needs to learn a delayed message's due time
//! (the first 8 bytes of its payload, docs/FORMAT.md "Delayed message
//! payload"), in time and memory proportional to the messages, not to
//! their bytes.
//!
//! Invariants:
//! - A head is read only from where the index says the message's record
//!   is, and only if the bytes there are a Publish or Relocate record of
//!   that message with the length the index knows (the pair assertion of
//!   a read that cannot check the record's checksum without reading it
//!   all); anything else is a `Corrupt` error naming the file and offset.
//!   The whole record is checked when the message itself is read.
//! - Memory used is bounded by [`HEADS_READ_BYTES_MAX`] per read, whatever
//!   the messages' sizes.

use std::sync::Arc;

use bytes::Bytes;

use super::Store;
use crate::error::StoreError;
use crate::index::Loc;
use crate::record::{
    Kind, OFF_BODY_LEN, OFF_KIND, PUBLISH_OFF_MSG, PUBLISH_OFF_QUEUES, PUBLISH_OFF_QUEUE_COUNT,
    RECORD_HEADER_BYTES,
};
use crate::storage::StorageFile;
use crate::{MsgId, QueueId};

/// Largest gap between two heads still read with one `pread` (the bytes
/// in between are read and dropped): below a page, a second read costs
/// more than the bytes.
const HEADS_GAP_BYTES_MAX: u64 = 4 * 1024;
/// Largest single read of heads.
const HEADS_READ_BYTES_MAX: u64 = 1024 * 1024;

/// Bytes of a Publish or Relocate record before its payload when it names
/// one queue (a delayed message's record names its exchange alone).
const ONE_QUEUE_PAYLOAD_OFF: usize = RECORD_HEADER_BYTES + PUBLISH_OFF_QUEUES + 8;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Where a head lies in a record whose first bytes are `rec` (at least
/// up to its queue count), if the record is `msg`'s Publish or Relocate of
/// `loc.len` bytes: (payload start, payload length) within the record.
fn payload_span(rec: &[u8], msg: MsgId, loc: Loc) -> Result<(usize, usize), String> {
    let kind = rec[OFF_KIND];
    if kind != Kind::Publish as u8 && kind != Kind::Relocate as u8 {
        return Err(format!("record kind {kind} where message {} was", msg.0));
    }
    let body_len = u32_at(rec, OFF_BODY_LEN) as usize;
    if RECORD_HEADER_BYTES + body_len != loc.len as usize {
        return Err(format!(
            "record of {body_len} body bytes where message {} has {}",
            msg.0, loc.len
        ));
    }
    let body = &rec[RECORD_HEADER_BYTES..];
    let id = u64_at(body, PUBLISH_OFF_MSG);
    if id != msg.0 {
        return Err(format!("record of message {id} where {} was", msg.0));
    }
    let queues = u32_at(body, PUBLISH_OFF_QUEUE_COUNT) as usize;
    let start = RECORD_HEADER_BYTES + PUBLISH_OFF_QUEUES + 8 * queues;
    if queues == 0 || start > loc.len as usize {
        return Err(format!("record of message {} names {queues} queues", msg.0));
    }
    Ok((start, loc.len as usize - start))
}

impl Store {
    /// The first `len` bytes of each message's payload (all of it when
    /// shorter), without reading the rest: heads close to each other in
    /// a segment are read with one read, as [`Store::read_many`] reads
    /// (past the page cache where the segment was appended past it, so a
    /// restart does not fill the cache with segments nobody reads soon).
    /// One result per message, in the order asked.
    pub fn read_heads(
        &self,
        queue: QueueId,
        msgs: &[MsgId],
        len: usize,
    ) -> Vec<Result<Bytes, StoreError>> {
        let group = &self.groups[self.group_of(queue) as usize];
        let located: Vec<Option<(Arc<dyn StorageFile>, Loc)>> = {
            let inner = group.shared.inner.lock();
            msgs.iter()
                .map(|m| {
                    let loc = inner.index.locate(queue, *m)?;
                    let file = inner.files.get(&loc.seg)?;
                    Some((Arc::clone(file), loc))
                })
                .collect()
        };
        // What of a record is read: its header up to the payload of a
        // one-queue record, and the head asked for.
        let window = |l: &Loc| (ONE_QUEUE_PAYLOAD_OFF + len).min(l.len as usize) as u64;
        let mut out: Vec<Result<Bytes, StoreError>> = msgs
            .iter()
            .map(|m| {
                Err(StoreError::NotFound {
                    queue: queue.0,
                    msg: m.0,
                })
            })
            .collect();
        let mut order: Vec<usize> = (0..msgs.len()).filter(|&i| located[i].is_some()).collect();
        order.sort_by_key(|&i| located[i].as_ref().map(|(_, l)| (l.seg, l.offset)));
        let mut at = 0;
        while at < order.len() {
            let (file, first) = located[order[at]].clone().expect("located");
            let start = u64::from(first.offset);
            let mut end = start + window(&first);
            let mut run_end = at + 1;
            while let Some(&j) = order.get(run_end) {
                let (_, l) = located[j].as_ref().expect("located");
                let (lo, hi) = (u64::from(l.offset), u64::from(l.offset) + window(l));
                if l.seg != first.seg
                    || lo > end + HEADS_GAP_BYTES_MAX
                    || hi - start > HEADS_READ_BYTES_MAX
                {
                    break;
                }
                end = end.max(hi);
                run_end += 1;
            }
            let path = crate::segment::segment_path(&group.shared.dir, first.seg);
            let read = file.read_owned(start, usize::try_from(end - start).expect("at most 1 MiB"));
            for &i in &order[at..run_end] {
                let (file, l) = located[i].as_ref().expect("located");
                let from = (u64::from(l.offset) - start) as usize;
                out[i] = match &read {
                    Err(e) => Err(StoreError::io(
                        "read",
                        &path,
                        std::io::Error::new(e.kind(), e.to_string()),
                    )),
                    Ok(buf) => {
                        let rec = &buf[from..from + window(l) as usize];
                        head_of(file.as_ref(), rec, msgs[i], *l, len).map_err(|reason| {
                            StoreError::Corrupt {
                                path: path.clone(),
                                offset: u64::from(l.offset),
                                reason,
                            }
                        })
                    }
                };
            }
            at = run_end;
        }
        out
    }
}

/// The head of `msg`'s payload from `rec`, the first bytes of its record
/// (read again from `file` when the record names several queues, so its
/// payload starts past them).
fn head_of(
    file: &dyn StorageFile,
    rec: &[u8],
    msg: MsgId,
    loc: Loc,
    len: usize,
) -> Result<Bytes, String> {
    if rec.len() < RECORD_HEADER_BYTES + PUBLISH_OFF_QUEUES {
        return Err(format!("record of message {} too short", msg.0));
    }
    let (payload, payload_len) = payload_span(rec, msg, loc)?;
    let take = len.min(payload_len);
    if payload + take <= rec.len() {
        return Ok(Bytes::copy_from_slice(&rec[payload..payload + take]));
    }
    let at = u64::from(loc.offset) + payload as u64;
    let head = (file.read_owned(at, take))
        .map_err(|e| format!("reading the head of message {}: {e}", msg.0))?;
    // Copied: the read may hold a whole block.
    Ok(Bytes::copy_from_slice(&head))
}
