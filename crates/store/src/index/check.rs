//! The index's counting invariants, asserted by tests and fuzz targets
//! (and debug recovery): every live message held by its queues' lists,
//! every list's and segment's count equal to what the entries say.

use super::*;

impl Index {
    /// Asserts the counting invariants (tests, and debug recovery).
    pub fn check(&self) {
        let mut counted: BTreeMap<u32, SegLive> = BTreeMap::new();
        for (id, e) in &self.msgs {
            let c = counted.entry(e.loc.seg).or_default();
            c.count += 1;
            c.bytes += u64::from(e.loc.len);
            assert_eq!(
                e.holder == MULTI,
                self.multi.contains_key(id),
                "multi side table out of sync for {id}"
            );
        }
        assert_eq!(
            self.multi.len(),
            self.msgs.values().filter(|e| e.holder == MULTI).count()
        );
        for st in self.streams.values() {
            st.check();
            for span in st.spans() {
                let c = counted.entry(span.seg).or_default();
                c.count += span.count;
                c.bytes += span.bytes;
            }
        }
        for (q, list) in &self.by_queue {
            assert_eq!(self.holders[list.holder as usize], *q, "holder slot of {q}");
            let known = &list.ids[..list.loaded.len()];
            assert!(
                known.windows(2).all(|w| w[0] < w[1]),
                "queue {q}'s checkpoint ids not ascending"
            );
            for (m, size) in known.iter().zip(&list.loaded) {
                let e = self
                    .msgs
                    .get(m)
                    .expect("a checkpoint id of a queue is live");
                assert_ne!(
                    e.holder, MULTI,
                    "message {m} listed with its size is in one queue"
                );
                assert_eq!(self.holder_queue(e), QueueId(*q), "message {m}'s holder");
                assert_eq!(payload_len(e.loc.len, 1), *size, "message {m}'s size");
            }
        }
        let free = self.holders.iter().filter(|q| **q == FREE_HOLDER).count();
        assert_eq!(free, self.free_holders.len(), "free holder slots");
        assert_eq!(
            self.holders.len() - free,
            self.by_queue.len(),
            "one slot per list"
        );
        for (seg, live) in &self.seg_live {
            assert_eq!(
                counted.get(seg).copied().unwrap_or_default(),
                *live,
                "segment {seg} live count"
            );
        }
        let mut held: BTreeMap<u64, u64> = BTreeMap::new();
        for m in self.iter_live() {
            for q in &m.queues {
                *held.entry(q.0).or_default() += 1;
                let list = self.by_queue.get(&q.0).expect("holding queue is listed");
                assert!(list.ids.contains(&m.msg.0), "{q} does not list {}", m.msg);
            }
        }
        let lives: BTreeMap<u64, u64> = self.by_queue.iter().map(|(q, l)| (*q, l.live)).collect();
        assert_eq!(held, lives, "queue list live counts");
    }
}
