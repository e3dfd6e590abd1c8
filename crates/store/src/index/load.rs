//! Loading an index from a checkpoint's runs (one queue set and its
//! messages per run) and listing it back as runs for the next checkpoint.
//!
//! Invariants:
//! - A run is loaded in the slot order of the index's table, a chunk at a
//!   time, so loading millions of messages does not miss the cache once
//!   per message; a message listed twice is refused, not loaded twice.
//! - `for_each_run` lists each live message once, in the run of its
//!   queue set.

use super::*;

impl Index {
    /// Whether `msg` is live (held by any queue).
    pub fn contains(&self, msg: MsgId) -> bool {
        self.msgs.contains_key(&msg.0)
    }

    /// Makes room for `additional` more messages in the table.
    pub fn reserve_messages(&mut self, additional: usize) {
        self.msgs.reserve(additional);
    }

    /// Makes room for `additional` more messages held by `queues`, so a
    /// checkpoint's run loads without rehashing or regrowing per message.
    pub fn reserve_run(&mut self, queues: &[QueueId], additional: usize) {
        self.msgs.reserve(additional);
        if queues.len() > 1 {
            self.multi.reserve(additional);
        }
        for q in queues {
            self.list_mut(*q).ids.reserve(additional);
        }
    }

    /// Loads one run of a checkpoint: messages none of which is live yet,
    /// each held by exactly `queues` (sorted, no duplicates, not empty).
    /// Refuses (and leaves the index partly loaded, to be dropped) a
    /// message already live: a checkpoint lists each message once.
    ///
    /// The table's writes go in slot order: up to [`LOAD_SLOT_ORDER_CHUNK`]
    /// messages at a time are sorted by where the table will put them and
    /// inserted so, one sweep through memory instead of a cache and TLB
    /// miss per message (7,000,000 ids: 0.71-0.81 s in id order, 0.51 s in
    /// slot order by chunks of 1,048,576, sort included; docs/BENCHMARKS.md
    /// "Restart at ten million, again"). The slot is the hash's low bits,
    /// as std's table places entries; were that to change, only the speed
    /// would. A message listed twice is found by the insert.
    pub fn load_run(
        &mut self,
        queues: &[QueueId],
        entries: impl Iterator<Item = (MsgId, Loc)>,
    ) -> Result<(), MsgId> {
        assert!(!queues.is_empty() && queues.windows(2).all(|w| w[0] < w[1]));
        let mut seg_cache: Option<(u32, SegLive)> = None;
        let flush = |ix: &mut Index, c: Option<(u32, SegLive)>| {
            if let Some((seg, add)) = c {
                let live = ix.seg_live.entry(seg).or_default();
                live.count += add.count;
                live.bytes += add.bytes;
            }
        };
        let mut result = Ok(());
        let mut loaded = 0u64;
        // The run's holder, looked up once (a message of several queues
        // is listed in `multi` instead).
        let single = match queues {
            [q] => Some(self.list_mut(*q).holder),
            _ => None,
        };
        // A queue's own run, loaded first into its empty list, keeps its
        // payload sizes for the listing (see `QueueList::loaded`), as long
        // as its ids come ascending, as a checkpoint writes them.
        let mut sizes = match queues {
            [q] if self.list_mut(*q).ids.is_empty() => Some(0u64),
            _ => None,
        };
        if let ([q], Some(_)) = (queues, sizes) {
            let hint = entries.size_hint().0;
            self.list_mut(*q).loaded.reserve(hint);
        }
        let slot_mask = self.slot_mask();
        let mut pending: Vec<(u64, u64, Entry)> =
            Vec::with_capacity(entries.size_hint().0.min(LOAD_SLOT_ORDER_CHUNK));
        for (msg, loc) in entries {
            let holder = single.unwrap_or_else(|| {
                self.multi.insert(msg.0, queues.to_vec());
                MULTI
            });
            let slot = self.msgs.hasher().hash_one(msg.0) & slot_mask;
            pending.push((slot, msg.0, Entry { holder, loc }));
            if pending.len() == LOAD_SLOT_ORDER_CHUNK {
                if let Err(m) = self.insert_in_slot_order(&mut pending) {
                    result = Err(m);
                    break;
                }
            }
            for q in queues {
                let list = self.list_mut(*q);
                list.ids.push(msg.0);
                match sizes {
                    Some(prev) if prev < msg.0 || list.loaded.is_empty() => {
                        list.loaded.push(payload_len(loc.len, 1));
                        sizes = Some(msg.0);
                    }
                    Some(_) => {
                        list.loaded = Vec::new();
                        sizes = None;
                    }
                    None => {}
                }
            }
            loaded += 1;
            match &mut seg_cache {
                Some((seg, add)) if *seg == loc.seg => {
                    add.count += 1;
                    add.bytes += u64::from(loc.len);
                }
                c => {
                    let old = c.take();
                    flush(self, old);
                    *c = Some((
                        loc.seg,
                        SegLive {
                            count: 1,
                            bytes: u64::from(loc.len),
                        },
                    ));
                }
            }
        }
        if result.is_ok() {
            result = self.insert_in_slot_order(&mut pending);
        }
        flush(self, seg_cache);
        for q in queues {
            self.list_mut(*q).live += loaded;
        }
        result
    }

    /// The low bits of a hash that pick a slot of the message table as it
    /// is sized now (std's table: a power of two of slots, 7/8 of them
    /// usable).
    pub(super) fn slot_mask(&self) -> u64 {
        let slots = (self.msgs.capacity().max(8) / 7 * 8).next_power_of_two();
        slots as u64 - 1
    }

    /// Inserts `pending` (slot, id, entry) in slot order and empties it;
    /// an id already in the table is refused.
    pub(super) fn insert_in_slot_order(
        &mut self,
        pending: &mut Vec<(u64, u64, Entry)>,
    ) -> Result<(), MsgId> {
        pending.sort_unstable_by_key(|(slot, _, _)| *slot);
        for (_, msg, e) in pending.drain(..) {
            if self.msgs.insert(msg, e).is_some() {
                return Err(MsgId(msg));
            }
        }
        Ok(())
    }

    /// Every live message grouped in runs of one queue set, each run's ids
    /// ascending, runs ordered by queue set: what a base checkpoint lists.
    /// Memory beyond the index: one queue's list at a time, and the
    /// multi-queue messages.
    pub fn for_each_run(&self, mut f: impl FnMut(&[QueueId], &[(MsgId, Loc)])) {
        let mut queues: Vec<u64> = self.by_queue.keys().copied().collect();
        queues.sort_unstable();
        let mut run: Vec<(MsgId, Loc)> = Vec::new();
        for q in queues {
            let list = &self.by_queue[&q];
            let mut ids = list.ids.clone();
            ids.sort_unstable();
            ids.dedup();
            run.clear();
            run.extend(ids.into_iter().filter_map(|m| {
                let e = self.msgs.get(&m)?;
                (e.holder != MULTI && self.holders[e.holder as usize] == q)
                    .then_some((MsgId(m), e.loc))
            }));
            if !run.is_empty() {
                f(&[QueueId(q)], &run);
            }
        }
        let mut multi: Vec<(&[QueueId], u64)> = self
            .multi
            .iter()
            .map(|(m, qs)| (qs.as_slice(), *m))
            .collect();
        multi.sort_unstable();
        for chunk in multi.chunk_by(|a, b| a.0 == b.0) {
            run.clear();
            run.extend(chunk.iter().map(|(_, m)| (MsgId(*m), self.msgs[m].loc)));
            f(chunk[0].0, &run);
        }
    }
}
