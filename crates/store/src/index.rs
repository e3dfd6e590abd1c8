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
//! - RAM per message: one 8-byte key + a 16-byte [`Entry`] in a hash table
//!   (plus a side entry only for messages held by several queues), and 8
//!   to 16 bytes per holding queue in that queue's [`QueueList`]. An entry
//!   names its queue by a 4-byte holder slot, not the 8-byte queue id: a
//!   slot is taken when a queue's list is made and given back when the list
//!   goes, so `holders` stays as long as the number of queues holding
//!   messages, and a slot in an entry always names a listed queue.
//! - Every (queue, message) the index holds is listed in the queue's
//!   [`QueueList`], whose `live` counts them; a list may also hold stale ids
//!   (removed since), at most about as many as live ones, so a purge costs
//!   what the queue holds, never a scan of the index.
//! - A stream's records (Append) are not in `msgs`: each stream has a
//!   sparse [`StreamIndex`] (spans per segment, a point every stride), and
//!   its spans count in `seg_live` like messages do, so a segment holding
//!   a stream's kept records is never deleted, and never compacted (its
//!   records stay where the points say they are).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::limits::LOAD_SLOT_ORDER_CHUNK;
use crate::record::{Record, PUBLISH_OFF_QUEUES, RECORD_HEADER_BYTES};
use crate::report::RecoveredMessage;
use crate::stream_index::{Span, StreamIndex};
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

/// Holder value meaning "held by several queues; see `multi`".
const MULTI: u32 = u32::MAX;

/// A free slot in `holders`.
const FREE_HOLDER: u64 = u64::MAX;

pub use crate::loc::Loc;

/// One live message.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The slot in `Index::holders` of the single queue holding it, or
    /// [`MULTI`]. 4 bytes, not the 8-byte queue id: with it an entry is 16
    /// bytes and a table slot 25, not 33 (a third of a pending message's
    /// cost, docs/BENCHMARKS.md "Pending delayed messages").
    holder: u32,
    loc: Loc,
}
const _: () = assert!(std::mem::size_of::<Entry>() == 16);

/// Live messages of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegLive {
    pub count: u64,
    pub bytes: u64,
}

/// The messages of one queue, for purging it without scanning the index.
#[derive(Default, Clone, Debug)]
struct QueueList {
    /// Ids it held when listed, in no order; stale ids (removed since, or
    /// listed twice by a relocation) are skipped and compacted away.
    ids: Vec<u64>,
    /// How many of them it holds now.
    live: u64,
    /// This queue's slot in `Index::holders`, held while the list exists.
    holder: u32,
    /// Payload sizes of `ids[..loaded.len()]`, as a checkpoint's run
    /// listed them, while the queue has lost none of its messages since:
    /// then those ids are ascending and each is held by this queue alone,
    /// so recovery lists them without looking each one up. Emptied by the
    /// first loss, and by the listing.
    loaded: Vec<u32>,
}

/// Stale ids a list may carry beyond its live ones before it is compacted.
const QUEUE_LIST_SLACK: usize = 32;

/// Whether `queue` holds `msg`, on the index's parts (so a caller may hold
/// another part mutably).
fn holds(
    msgs: &IdMap<Entry>,
    multi: &IdMap<Vec<QueueId>>,
    holders: &[u64],
    queue: QueueId,
    msg: u64,
) -> bool {
    held_by(msgs, multi, holders, queue, msg).is_some()
}

/// Two id-ascending listings as one, an id in both once (it cannot be:
/// a message listed again leaves its queue first, which empties the
/// checkpoint's sizes).
fn merge_by_id(a: Vec<RecoveredMessage>, b: Vec<RecoveredMessage>) -> Vec<RecoveredMessage> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        let next = match x.msg.cmp(&y.msg) {
            std::cmp::Ordering::Less => a.next(),
            std::cmp::Ordering::Greater => b.next(),
            std::cmp::Ordering::Equal => {
                b.next();
                a.next()
            }
        };
        out.push(next.expect("peeked"));
    }
    out.extend(a);
    out.extend(b);
    out
}

/// `msg`'s entry and how many queues hold it, if `queue` is one of them.
fn held_by<'a>(
    msgs: &'a IdMap<Entry>,
    multi: &IdMap<Vec<QueueId>>,
    holders: &[u64],
    queue: QueueId,
    msg: u64,
) -> Option<(&'a Entry, usize)> {
    let e = msgs.get(&msg)?;
    if e.holder == MULTI {
        let qs = &multi[&msg];
        qs.contains(&queue).then_some((e, qs.len()))
    } else {
        (holders[e.holder as usize] == queue.0).then_some((e, 1))
    }
}

#[derive(Default, Clone)]
pub struct Index {
    msgs: IdMap<Entry>,
    multi: IdMap<Vec<QueueId>>,
    by_queue: IdMap<QueueList>,
    /// Queue id by holder slot ([`FREE_HOLDER`] when free).
    holders: Vec<u64>,
    /// Free slots of `holders`, reused before it grows.
    free_holders: Vec<u32>,
    seg_live: BTreeMap<u32, SegLive>,
    /// Streams' sparse indexes, by queue.
    streams: BTreeMap<u64, StreamIndex>,
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
                if let Some(st) = self.streams.remove(&queue.0) {
                    let spans: Vec<Span> = st.spans().cloned().collect();
                    self.unlive_spans(&spans);
                }
                // Taken out first: removals below find no list to update.
                if let Some(list) = self.by_queue.remove(&queue.0) {
                    for m in list.ids {
                        self.remove_from(*queue, m);
                    }
                    // Only now: the entries removed above named it.
                    self.free_holder(list.holder);
                }
            }
            Record::MetaPut { key, value } => {
                self.meta.insert(key.to_vec(), value.to_vec());
            }
            Record::MetaDelete { key } => {
                self.meta.remove(*key);
            }
            Record::Hole { .. } => {}
            Record::Append { queue, offset, .. } => {
                self.streams
                    .entry(queue.0)
                    .or_default()
                    .append(*offset, loc);
                let live = self.seg_live.entry(loc.seg).or_default();
                live.count += 1;
                live.bytes += u64::from(loc.len);
            }
            Record::Trim { queue, below } => {
                let gone = self.streams.entry(queue.0).or_default().trim(*below);
                self.unlive_spans(&gone);
            }
        }
    }

    /// Segments' live counts without these spans (trimmed or purged).
    fn unlive_spans(&mut self, spans: &[Span]) {
        for s in spans {
            let live = self
                .seg_live
                .get_mut(&s.seg)
                .expect("a span's segment is counted");
            live.count -= s.count;
            live.bytes -= s.bytes;
        }
    }

    /// A stream's sparse index, if it has one.
    pub fn stream(&self, queue: QueueId) -> Option<&StreamIndex> {
        self.streams.get(&queue.0)
    }

    /// Every stream's index, by queue.
    pub fn streams(&self) -> impl Iterator<Item = (QueueId, &StreamIndex)> {
        self.streams.iter().map(|(q, s)| (QueueId(*q), s))
    }

    /// A stream loaded from a checkpoint: its index as listed, its spans
    /// counted live.
    pub fn load_stream(&mut self, queue: QueueId, stream: StreamIndex) {
        for s in stream.spans() {
            let live = self.seg_live.entry(s.seg).or_default();
            live.count += s.count;
            live.bytes += s.bytes;
        }
        self.streams.insert(queue.0, stream);
    }

    /// Whether a stream keeps records in segment `seg` (compaction leaves
    /// such a segment alone).
    pub fn segment_has_streams(&self, seg: u32) -> bool {
        self.streams.values().any(|s| s.in_segment(seg))
    }

    /// Forgets the streams' records in segment `seg` (its file is gone);
    /// returns how many there were.
    pub fn drop_stream_segment(&mut self, seg: u32) -> u64 {
        let mut gone = Vec::new();
        for st in self.streams.values_mut() {
            gone.extend(st.drop_segment(seg));
        }
        self.unlive_spans(&gone);
        gone.iter().map(|s| s.count).sum()
    }

    /// Index points held by every stream.
    pub fn stream_points(&self) -> usize {
        self.streams.values().map(StreamIndex::point_count).sum()
    }

    /// Inserts a live message (also used to load a checkpoint).
    pub fn insert(&mut self, msg: MsgId, queues: &[QueueId], loc: Loc) {
        // The common case, one queue, allocates nothing.
        if let [_] = queues {
            self.insert_sorted(msg, queues, loc);
            return;
        }
        let mut qs: Vec<QueueId> = queues.to_vec();
        qs.sort_unstable();
        qs.dedup();
        self.insert_sorted(msg, &qs, loc);
    }

    /// [`Self::insert`] of queues already sorted and without duplicates.
    fn insert_sorted(&mut self, msg: MsgId, qs: &[QueueId], loc: Loc) {
        debug_assert!(qs.windows(2).all(|w| w[0] < w[1]));
        let mut holder = MULTI;
        for q in qs {
            let list = self.list_mut(*q);
            list.ids.push(msg.0);
            list.live += 1;
            holder = list.holder;
        }
        match qs {
            [] => return,
            [_] => {}
            _ => {
                self.multi.insert(msg.0, qs.to_vec());
                holder = MULTI;
            }
        }
        self.msgs.insert(msg.0, Entry { holder, loc });
        let live = self.seg_live.entry(loc.seg).or_default();
        live.count += 1;
        live.bytes += u64::from(loc.len);
    }

    /// `queue`'s list, made (with a holder slot) if it has none.
    fn list_mut(&mut self, queue: QueueId) -> &mut QueueList {
        // One hash lookup on the publish path; the slot is taken only for
        // a new list.
        match self.by_queue.entry(queue.0) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(QueueList {
                ids: Vec::new(),
                live: 0,
                holder: take_holder(&mut self.holders, &mut self.free_holders, queue),
                loaded: Vec::new(),
            }),
        }
    }

    /// A list went: its slot may serve another queue.
    fn free_holder(&mut self, slot: u32) {
        assert_ne!(
            self.holders[slot as usize], FREE_HOLDER,
            "slot {slot} freed twice"
        );
        self.holders[slot as usize] = FREE_HOLDER;
        self.free_holders.push(slot);
    }

    /// The queue an entry names (not [`MULTI`]).
    fn holder_queue(&self, e: &Entry) -> QueueId {
        QueueId(self.holders[e.holder as usize])
    }

    fn forget(&mut self, msg: u64) {
        if let Some(e) = self.msgs.remove(&msg) {
            shrink_if_sparse(&mut self.msgs);
            if e.holder == MULTI {
                for q in self.multi.remove(&msg).expect("multi entry") {
                    self.unlist(q);
                }
                shrink_if_sparse(&mut self.multi);
            } else {
                self.unlist(self.holder_queue(&e));
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
        if e.holder == MULTI {
            let qs = self.multi.get_mut(&msg).expect("multi entry");
            let before = qs.len();
            qs.retain(|q| *q != queue);
            if qs.len() == before {
                return;
            }
            match qs.as_slice() {
                [] => unreachable!("a multi entry names at least two queues"),
                [last] => {
                    e.holder = self.by_queue[&last.0].holder;
                    self.multi.remove(&msg);
                }
                _ => {}
            }
            self.unlist(queue);
        } else if self.holders[e.holder as usize] == queue.0 {
            self.forget(msg);
        }
    }

    /// Each of `msgs` leaves `queue`: a Remove record's effect, from ids
    /// not yet made into a record.
    pub fn remove_ids(&mut self, queue: QueueId, msgs: &[u64]) {
        for &m in msgs {
            self.remove_from(queue, m);
        }
    }

    /// `queue` no longer holds one of its listed messages.
    fn unlist(&mut self, queue: QueueId) {
        // Absent while a purge of `queue` runs: nothing to keep then.
        let Some(list) = self.by_queue.get_mut(&queue.0) else {
            return;
        };
        list.live -= 1;
        if !list.loaded.is_empty() {
            list.loaded = Vec::new();
        }
        if list.live == 0 {
            let slot = list.holder;
            self.by_queue.remove(&queue.0);
            self.free_holder(slot);
        } else if list.ids.len() > 2 * list.live as usize + QUEUE_LIST_SLACK {
            let (msgs, multi, holders) = (&self.msgs, &self.multi, &self.holders);
            list.ids.retain(|&m| holds(msgs, multi, holders, queue, m));
            list.ids.sort_unstable();
            list.ids.dedup();
            if list.ids.capacity() > 4 * list.ids.len() + QUEUE_LIST_SLACK {
                // A drained queue's list gives its memory back too.
                list.ids.shrink_to(2 * list.ids.len());
            }
        }
    }

    /// Location of `msg` if `queue` still holds it.
    pub fn locate(&self, queue: QueueId, msg: MsgId) -> Option<Loc> {
        let held = holds(&self.msgs, &self.multi, &self.holders, queue, msg.0);
        held.then(|| self.msgs[&msg.0].loc)
    }

    /// Whether `msg` is live with its current record at `loc`.
    pub fn is_at(&self, msg: MsgId, loc: Loc) -> bool {
        self.msgs.get(&msg.0).is_some_and(|e| e.loc == loc)
    }

    /// Queues holding `msg`.
    pub fn queues_of(&self, msg: MsgId) -> Vec<QueueId> {
        match self.msgs.get(&msg.0) {
            None => Vec::new(),
            Some(e) if e.holder == MULTI => self.multi[&msg.0].clone(),
            Some(e) => vec![self.holder_queue(e)],
        }
    }

    /// Estimated heap bytes of the message index: every slot of the hash
    /// table (key + entry + one control byte) at its current capacity, and
    /// the side table of multi-queue messages.
    pub fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, Entry)>() + 1;
        let multi_slot = std::mem::size_of::<(u64, Vec<QueueId>)>() + 1;
        let multi_heap: usize = self.multi.values().map(|v| v.capacity() * 8).sum();
        let list_slot = std::mem::size_of::<(u64, QueueList)>() + 1;
        let lists: usize = self.by_queue.values().map(|l| l.ids.capacity() * 8).sum();
        self.msgs.capacity() * slot
            + self.multi.capacity() * multi_slot
            + multi_heap
            + self.by_queue.capacity() * list_slot
            + lists
            + self.holders.capacity() * 8
            + self.free_holders.capacity() * 4
            + self.stream_points() * std::mem::size_of::<crate::stream_index::Point>()
    }

    pub fn live_messages(&self) -> usize {
        self.msgs.len()
    }

    /// Segments holding live messages or stream records, ascending.
    pub fn live_segments(&self) -> impl Iterator<Item = u32> + '_ {
        self.seg_live
            .iter()
            .filter(|(_, l)| l.count > 0)
            .map(|(s, _)| *s)
    }

    /// Live count and bytes of a segment.
    pub fn seg_live(&self, seg: u32) -> SegLive {
        self.seg_live.get(&seg).copied().unwrap_or_default()
    }

    /// Each queue's live messages, ids ascending, with their payload
    /// sizes: what recovery hands the broker, built by each group's
    /// recovery thread, queues ascending, no allocation per message. A
    /// queue's own checkpoint run that lost nothing since is listed from
    /// the sizes kept while it loaded ([`QueueList::loaded`]), in id order
    /// already; the rest of its list (messages of several queues, deltas,
    /// the journal) is sorted and looked up in the table one by one and
    /// merged in. The lookups were 28% of a restart at 10,000,000
    /// (docs/BENCHMARKS.md, "Restart at ten million on a quieter machine"). Lists are shared out
    /// over up to `threads` threads, largest first (one group often holds
    /// most queues and finishes last).
    pub fn live_by_queue(&mut self, threads: usize) -> Vec<(QueueId, Vec<RecoveredMessage>)> {
        let Index {
            msgs,
            multi,
            holders,
            by_queue,
            ..
        } = self;
        let (msgs, multi, holders) = (&*msgs, &*multi, holders.as_slice());
        let mut lists: Vec<(u64, &mut QueueList)> =
            by_queue.iter_mut().map(|(q, l)| (*q, l)).collect();
        lists.sort_unstable_by_key(|(_, l)| std::cmp::Reverse(l.ids.len()));
        let threads = threads.clamp(1, lists.len().max(1));
        // Largest first to the least loaded share.
        let mut shares: Vec<(usize, Vec<(u64, &mut QueueList)>)> =
            (0..threads).map(|_| (0, Vec::new())).collect();
        for (q, l) in lists {
            let share = shares
                .iter_mut()
                .min_by_key(|(load, _)| *load)
                .expect("at least one share");
            share.0 += l.ids.len();
            share.1.push((q, l));
        }
        let list_one = |q: u64, list: &mut QueueList| {
            // The checkpoint's own run, untouched since: no lookups.
            let sizes = std::mem::take(&mut list.loaded);
            let known: Vec<RecoveredMessage> = list
                .ids
                .iter()
                .zip(&sizes)
                .map(|(&m, &payload_len)| RecoveredMessage {
                    msg: MsgId(m),
                    payload_len,
                })
                .collect();
            drop(sizes);
            let rest = &mut list.ids[known.len()..];
            rest.sort_unstable();
            let mut looked_up = Vec::with_capacity(rest.len());
            let mut last = None;
            for &m in rest.iter() {
                if last == Some(m) {
                    continue;
                }
                last = Some(m);
                if let Some((e, queues)) = held_by(msgs, multi, holders, QueueId(q), m) {
                    looked_up.push(RecoveredMessage {
                        msg: MsgId(m),
                        payload_len: payload_len(e.loc.len, queues),
                    });
                }
            }
            let held = if looked_up.is_empty() {
                known
            } else if known.is_empty() {
                looked_up
            } else {
                merge_by_id(known, looked_up)
            };
            (QueueId(q), held)
        };
        let list_share = |share: Vec<(u64, &mut QueueList)>| {
            share
                .into_iter()
                .map(|(q, l)| list_one(q, l))
                .filter(|(_, held)| !held.is_empty())
                .collect::<Vec<_>>()
        };
        let mut shares = shares.into_iter().map(|(_, s)| s);
        let first = shares.next().unwrap_or_default();
        let mut out = std::thread::scope(|s| {
            let others: Vec<_> = shares
                .filter(|share| !share.is_empty())
                .map(|share| s.spawn(move || list_share(share)))
                .collect();
            let mut out = list_share(first);
            for h in others {
                out.extend(h.join().expect("listing thread panicked"));
            }
            out
        });
        out.sort_unstable_by_key(|(q, _)| *q);
        out
    }

    /// Every live message, in no particular order.
    pub fn iter_live(&self) -> impl Iterator<Item = LiveMessage> + '_ {
        self.msgs.iter().map(|(id, e)| LiveMessage {
            msg: MsgId(*id),
            loc: e.loc,
            queues: if e.holder == MULTI {
                self.multi[id].clone()
            } else {
                vec![self.holder_queue(e)]
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
}

/// A slot in `holders` for `queue`'s new list (a free one first).
fn take_holder(holders: &mut Vec<u64>, free: &mut Vec<u32>, queue: QueueId) -> u32 {
    assert_ne!(queue.0, FREE_HOLDER, "queue id {FREE_HOLDER} is reserved");
    if let Some(slot) = free.pop() {
        holders[slot as usize] = queue.0;
        return slot;
    }
    let slot = u32::try_from(holders.len()).expect("fewer than 2^32 queues hold messages");
    assert_ne!(slot, MULTI, "fewer than 2^32 - 1 queues hold messages");
    holders.push(queue.0);
    slot
}

/// Tables at most this large are never shrunk (a few pages).
const SHRINK_CAPACITY_MIN: usize = 4096;

/// A table a quarter full shrinks to twice its length, so a drained
/// backlog's index leaves memory (issue 20 goal 6) instead of keeping the
/// capacity of its deepest moment. As growth doubles, shrinking halves at
/// most once per as many removals as it moves entries: O(1) amortised.
fn shrink_if_sparse<V>(m: &mut IdMap<V>) {
    let capacity = m.capacity();
    if capacity > SHRINK_CAPACITY_MIN && m.len() < capacity / 4 {
        m.shrink_to(m.len() * 2);
    }
}

mod check;
mod load;
#[cfg(test)]
mod tests;
