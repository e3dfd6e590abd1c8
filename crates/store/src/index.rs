//! A group's in-memory state: where each live message is, which queues
//! still hold it, per-segment live counts, and the metadata map. Built by
//! applying records in journal order, by the writer and by recovery alike.
//!
//! Invariants:
//! - [`Index::apply`] is the only mutator of message state, and it is a
//!   pure function of the record and its location: replaying a journal
//!   rebuilds exactly the state the writer had.
//! - A message is in `msgs` iff at least one queue still holds it; it is
//!   counted live in exactly the segment its current record is in.
//! - `seg_live[s].count` equals the number of entries located in `s`
//!   (checked by [`Index::check`] in tests).
//! - RAM per message: one 8-byte key + a 24-byte [`Entry`] in a hash table
//!   (plus a side entry only for messages held by several queues).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::record::{Record, PUBLISH_OFF_QUEUES, RECORD_HEADER_BYTES};
use crate::{MsgId, QueueId};

/// Hasher for ids we allocate ourselves: a multiply-xorshift finalizer is
/// enough and much cheaper than SipHash.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z ^= z >> 32;
        z
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Queue field value meaning "held by several queues; see `multi`".
const MULTI: u64 = u64::MAX;

/// Where a record is: segment, byte offset, total record length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub seg: u32,
    pub offset: u32,
    pub len: u32,
}

/// One live message.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The single queue holding it, or [`MULTI`].
    queue: u64,
    loc: Loc,
}
const _: () = assert!(std::mem::size_of::<Entry>() == 24);

/// Live messages of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegLive {
    pub count: u64,
    pub bytes: u64,
}

#[derive(Default, Clone)]
pub struct Index {
    msgs: IdMap<Entry>,
    multi: IdMap<Vec<QueueId>>,
    seg_live: BTreeMap<u32, SegLive>,
    pub meta: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Highest message id ever published in this group.
    pub msg_id_hw: u64,
}

/// A live message as listed for a checkpoint or for recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveMessage {
    pub msg: MsgId,
    pub loc: Loc,
    pub queues: Vec<QueueId>,
}

/// Payload bytes of a publish record of `rec_len` bytes naming `queues`.
pub fn payload_len(rec_len: u32, queues: usize) -> u32 {
    let overhead = RECORD_HEADER_BYTES + PUBLISH_OFF_QUEUES + 8 * queues;
    rec_len.saturating_sub(u32::try_from(overhead).unwrap_or(u32::MAX))
}

impl Index {
    /// Applies one record found (or written) at `loc`.
    pub fn apply(&mut self, record: &Record<'_>, loc: Loc) {
        match record {
            Record::Publish { msg, queues, .. } | Record::Relocate { msg, queues, .. } => {
                self.msg_id_hw = self.msg_id_hw.max(msg.0);
                self.forget(msg.0);
                self.insert(*msg, queues, loc);
            }
            Record::Remove { queue, msgs } => {
                for m in msgs.iter() {
                    self.remove_from(*queue, m.0);
                }
            }
            Record::Purge { queue } => {
                let held: Vec<u64> = self
                    .msgs
                    .iter()
                    .filter(|(id, e)| {
                        e.queue == queue.0 || (e.queue == MULTI && self.multi[*id].contains(queue))
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for m in held {
                    self.remove_from(*queue, m);
                }
            }
            Record::MetaPut { key, value } => {
                self.meta.insert(key.to_vec(), value.to_vec());
            }
            Record::MetaDelete { key } => {
                self.meta.remove(*key);
            }
            Record::Hole { .. } => {}
        }
    }

    /// Inserts a live message (also used to load a checkpoint).
    pub fn insert(&mut self, msg: MsgId, queues: &[QueueId], loc: Loc) {
        let mut qs: Vec<QueueId> = queues.to_vec();
        qs.sort_unstable();
        qs.dedup();
        let queue = match qs.as_slice() {
            [] => return,
            [q] => q.0,
            _ => {
                self.multi.insert(msg.0, qs);
                MULTI
            }
        };
        self.msgs.insert(msg.0, Entry { queue, loc });
        let live = self.seg_live.entry(loc.seg).or_default();
        live.count += 1;
        live.bytes += u64::from(loc.len);
    }

    fn forget(&mut self, msg: u64) {
        if let Some(e) = self.msgs.remove(&msg) {
            if e.queue == MULTI {
                self.multi.remove(&msg);
            }
            let live = self
                .seg_live
                .get_mut(&e.loc.seg)
                .expect("live entry's segment is counted");
            live.count -= 1;
            live.bytes -= u64::from(e.loc.len);
        }
    }

    fn remove_from(&mut self, queue: QueueId, msg: u64) {
        let Some(e) = self.msgs.get_mut(&msg) else {
            return;
        };
        if e.queue == MULTI {
            let qs = self.multi.get_mut(&msg).expect("multi entry");
            qs.retain(|q| *q != queue);
            match qs.as_slice() {
                [] => self.forget(msg),
                [last] => {
                    e.queue = last.0;
                    self.multi.remove(&msg);
                }
                _ => {}
            }
        } else if e.queue == queue.0 {
            self.forget(msg);
        }
    }

    /// Location of `msg` if `queue` still holds it.
    pub fn locate(&self, queue: QueueId, msg: MsgId) -> Option<Loc> {
        let e = self.msgs.get(&msg.0)?;
        let held = e.queue == queue.0 || (e.queue == MULTI && self.multi[&msg.0].contains(&queue));
        held.then_some(e.loc)
    }

    /// Whether `msg` is live with its current record at `loc`.
    pub fn is_at(&self, msg: MsgId, loc: Loc) -> bool {
        self.msgs.get(&msg.0).is_some_and(|e| e.loc == loc)
    }

    /// Queues holding `msg`.
    pub fn queues_of(&self, msg: MsgId) -> Vec<QueueId> {
        match self.msgs.get(&msg.0) {
            None => Vec::new(),
            Some(e) if e.queue == MULTI => self.multi[&msg.0].clone(),
            Some(e) => vec![QueueId(e.queue)],
        }
    }

    /// Estimated heap bytes of the message index: every slot of the hash
    /// table (key + entry + one control byte) at its current capacity, and
    /// the side table of multi-queue messages.
    pub fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, Entry)>() + 1;
        let multi_slot = std::mem::size_of::<(u64, Vec<QueueId>)>() + 1;
        let multi_heap: usize = self.multi.values().map(|v| v.capacity() * 8).sum();
        self.msgs.capacity() * slot + self.multi.capacity() * multi_slot + multi_heap
    }

    pub fn live_messages(&self) -> usize {
        self.msgs.len()
    }

    /// Live count and bytes of a segment.
    pub fn seg_live(&self, seg: u32) -> SegLive {
        self.seg_live.get(&seg).copied().unwrap_or_default()
    }

    /// Every live message, in no particular order.
    pub fn iter_live(&self) -> impl Iterator<Item = LiveMessage> + '_ {
        self.msgs.iter().map(|(id, e)| LiveMessage {
            msg: MsgId(*id),
            loc: e.loc,
            queues: if e.queue == MULTI {
                self.multi[id].clone()
            } else {
                vec![QueueId(e.queue)]
            },
        })
    }

    /// Live messages whose record is in segment `seg`, by offset.
    pub fn live_in_segment(&self, seg: u32) -> Vec<(MsgId, Loc)> {
        let mut v: Vec<(MsgId, Loc)> = self
            .msgs
            .iter()
            .filter(|(_, e)| e.loc.seg == seg)
            .map(|(id, e)| (MsgId(*id), e.loc))
            .collect();
        v.sort_unstable_by_key(|(_, l)| l.offset);
        v
    }

    /// Removes every message located in `seg` (its file is gone); returns them.
    pub fn drop_segment(&mut self, seg: u32) -> Vec<LiveMessage> {
        let lost: Vec<LiveMessage> = self.iter_live().filter(|m| m.loc.seg == seg).collect();
        for m in &lost {
            self.forget(m.msg.0);
        }
        lost
    }

    /// Asserts the counting invariants (tests, and debug recovery).
    pub fn check(&self) {
        let mut counted: BTreeMap<u32, SegLive> = BTreeMap::new();
        for (id, e) in &self.msgs {
            let c = counted.entry(e.loc.seg).or_default();
            c.count += 1;
            c.bytes += u64::from(e.loc.len);
            assert_eq!(
                e.queue == MULTI,
                self.multi.contains_key(id),
                "multi side table out of sync for {id}"
            );
        }
        assert_eq!(
            self.multi.len(),
            self.msgs.values().filter(|e| e.queue == MULTI).count()
        );
        for (seg, live) in &self.seg_live {
            assert_eq!(
                counted.get(seg).copied().unwrap_or_default(),
                *live,
                "segment {seg} live count"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn loc(seg: u32, offset: u32) -> Loc {
        Loc {
            seg,
            offset,
            len: 100,
        }
    }

    #[test]
    fn message_lives_until_every_queue_removed_it() {
        let mut ix = Index::default();
        let qs = [QueueId(1), QueueId(2)];
        ix.apply(
            &Record::Publish {
                msg: MsgId(7),
                queues: Cow::Borrowed(&qs),
                payload: b"",
            },
            loc(1, 32),
        );
        assert_eq!(ix.seg_live(1).count, 1);
        ix.apply(
            &Record::Remove {
                queue: QueueId(1),
                msgs: Cow::Borrowed(&[MsgId(7)]),
            },
            loc(1, 200),
        );
        assert_eq!(ix.locate(QueueId(2), MsgId(7)), Some(loc(1, 32)));
        assert_eq!(ix.locate(QueueId(1), MsgId(7)), None);
        ix.check();
        ix.apply(&Record::Purge { queue: QueueId(2) }, loc(1, 300));
        assert_eq!(ix.live_messages(), 0);
        assert_eq!(ix.seg_live(1).count, 0);
        ix.check();
    }

    #[test]
    fn relocate_moves_the_live_count() {
        let mut ix = Index::default();
        ix.apply(
            &Record::Publish {
                msg: MsgId(1),
                queues: Cow::Borrowed(&[QueueId(1)]),
                payload: b"",
            },
            loc(1, 32),
        );
        ix.apply(
            &Record::Relocate {
                msg: MsgId(1),
                queues: Cow::Borrowed(&[QueueId(1)]),
                payload: b"",
            },
            loc(3, 32),
        );
        assert_eq!(ix.seg_live(1).count, 0);
        assert_eq!(ix.seg_live(3).count, 1);
        ix.check();
    }
}
