//! The index ops of the records the writer wrote since the last checkpoint
//! started, kept so that the next checkpoint is built from them instead of
//! from that journal read back from disk (a zeroed buffer as long as the
//! journal, a copy of every byte, and a CRC over every payload the index
//! never needs).
//!
//! The ops are a delta's own ([`DeltaBuilder`]): a delta checkpoint is
//! them, and a base is its parent chain with them applied through the same
//! parser recovery uses on a delta file.
//!
//! Invariants:
//! - [`Facts`] stands for the journal from `from` (the replay position of
//!   the checkpoint that started it), record for record, in journal order:
//!   the writer pushes a batch's records once its write succeeded, in the
//!   order it applies them to the index, and drops the facts when a write
//!   is taken back (see `space.rs`).
//! - `lsn` is the lsn of the last record pushed (`from`'s lsn if none): a
//!   checkpoint uses the facts only if they start at its parent's position
//!   and lsn and end at its own lsn; otherwise it reads the journal.
//! - They take at most [`CHECKPOINT_FACTS_BYTES_MAX`] bytes: past that
//!   they are dropped until the next checkpoint starts.
//! - In the store's unit tests every checkpoint built from facts is built
//!   a second time from the journal and the two must be equal byte for
//!   byte (a pair assertion, see `checkpoints.rs`; the property test below
//!   drives it with random operations).

use super::*;
use crate::limits::CHECKPOINT_FACTS_BYTES_MAX;

/// What the records since a checkpoint's position did to the index.
pub(super) struct Facts {
    /// The replay position they start at.
    from: ReplayFrom,
    /// The lsn of the last record before `from`.
    from_lsn: u64,
    /// The lsn of the last record pushed.
    lsn: u64,
    ops: DeltaBuilder,
}

impl Facts {
    /// Facts starting at `from`, after the record numbered `lsn`.
    pub(super) fn new(from: ReplayFrom, lsn: u64) -> Facts {
        Facts {
            from,
            from_lsn: lsn,
            lsn,
            // As the journal's replay builds it (checkpoints.rs).
            ops: DeltaBuilder::new(0),
        }
    }

    /// The ops, if they stand for the journal after position `from` (the
    /// record numbered `from_lsn`) up to the record numbered `to_lsn`.
    pub(super) fn covering(self, from: ReplayFrom, from_lsn: u64, to_lsn: u64) -> Option<FactOps> {
        (self.from == from && self.from_lsn == from_lsn && self.lsn == to_lsn).then_some(FactOps {
            ops: self.ops,
            lsn: self.lsn,
        })
    }
}

/// The ops a checkpoint is built from, and the lsn they end at.
pub(super) struct FactOps {
    pub(super) ops: DeltaBuilder,
    pub(super) lsn: u64,
}

impl Writer {
    /// Pushes the records of a written batch (or compaction step), in
    /// journal order; `self.next_lsn` is already past them.
    pub(super) fn note_facts<'a>(&mut self, placed: impl Iterator<Item = (&'a Record<'a>, Loc)>) {
        let Some(facts) = &mut self.facts else {
            return;
        };
        for (rec, loc) in placed {
            facts.ops.push(rec, loc);
        }
        facts.lsn = self.next_lsn - 1;
        let bytes = facts.ops.ops_bytes();
        if bytes > CHECKPOINT_FACTS_BYTES_MAX {
            tracing::debug!(
                group = self.group(),
                bytes,
                "checkpoint facts over their limit; the next checkpoint reads the journal"
            );
            self.facts = None;
        }
    }

    /// Starts new facts at checkpoint position `at` (after record `lsn`),
    /// returning the ones before it.
    pub(super) fn restart_facts(&mut self, at: ReplayFrom, lsn: u64) -> Option<Facts> {
        self.facts.replace(Facts::new(at, lsn))
    }

    /// Forgets the facts: records they name were taken back.
    pub(super) fn drop_facts(&mut self) {
        self.facts = None;
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! Checkpoints built from the writer's facts equal those built from the
    //! journal, for any sequence of operations (the pair assertion in
    //! `checkpoints.rs` compares the two for every checkpoint; this test
    //! drives it and counts).

    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use proptest::prelude::*;

    use crate::fault::FaultStorage;
    use crate::writer::Done;
    use crate::{MsgId, QueueId, Store, StoreConfig, StoreError, Ticket};

    /// Checkpoints built both ways, in this test binary.
    static PAIR_CHECKS: AtomicU64 = AtomicU64::new(0);
    /// ... and those whose two builds differed.
    static PAIR_MISMATCHES: AtomicU64 = AtomicU64::new(0);

    pub(in crate::writer) fn note_pair_check(equal: bool) {
        PAIR_CHECKS.fetch_add(1, Ordering::Relaxed);
        if !equal {
            PAIR_MISMATCHES.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Publish { queues: Vec<u64>, len: usize },
        Remove { queue: u64, nth: usize },
        Purge { queue: u64 },
        MetaPut { key: u8, value: u8 },
        MetaDelete { key: u8 },
        Append { stream: u64, len: usize },
        Trim { stream: u64, keep: u64 },
        Checkpoint,
        Compact,
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (proptest::collection::vec(0u64..4, 1..3), 0usize..2500)
                .prop_map(|(queues, len)| Step::Publish { queues, len }),
            5 => (0u64..4, any::<usize>()).prop_map(|(queue, nth)| Step::Remove { queue, nth }),
            1 => (0u64..4).prop_map(|queue| Step::Purge { queue }),
            1 => (0u8..3, any::<u8>()).prop_map(|(key, value)| Step::MetaPut { key, value }),
            1 => (0u8..3).prop_map(|key| Step::MetaDelete { key }),
            2 => (10u64..12, 0usize..500).prop_map(|(stream, len)| Step::Append { stream, len }),
            1 => (10u64..12, 0u64..4).prop_map(|(stream, keep)| Step::Trim { stream, keep }),
            3 => Just(Step::Checkpoint),
            1 => Just(Step::Compact),
            1 => Just(Step::Restart),
        ]
    }

    fn wait(f: impl FnOnce(Done)) -> Result<(), StoreError> {
        let (done, ticket) = Ticket::new();
        f(done);
        ticket.wait()
    }

    fn open(fs: &FaultStorage, cfg: &StoreConfig) -> Store {
        Store::open_with(cfg.clone(), Arc::new(fs.clone()))
            .expect("open")
            .0
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn checkpoints_from_facts_equal_checkpoints_from_the_journal(
            steps in proptest::collection::vec(step(), 1..80),
            seed in any::<u64>(),
        ) {
            let fs = FaultStorage::new(seed);
            let mut cfg = StoreConfig::new("/data");
            cfg.log_groups = 2;
            cfg.segment_size_bytes = 8 * 1024;
            cfg.recovery_progress_interval_ms = 60_000;
            let mut store = open(&fs, &cfg);
            let mut live: BTreeMap<u64, BTreeSet<MsgId>> = BTreeMap::new();
            let mut next_offset: BTreeMap<u64, u64> = BTreeMap::new();
            let checks_before = PAIR_CHECKS.load(Ordering::Relaxed);
            let mut checkpoints = 0;
            for s in steps {
                match s {
                    Step::Publish { queues, len } => {
                        let m = store.next_msg_id();
                        let qs: Vec<QueueId> = queues.iter().copied().map(QueueId).collect();
                        let payload = Bytes::from(vec![7u8; len]);
                        wait(|d| store.publish(m, &qs, payload, Some(d))).unwrap();
                        for q in queues {
                            live.entry(q).or_default().insert(m);
                        }
                    }
                    Step::Remove { queue, nth } => {
                        let Some(set) = live.get_mut(&queue).filter(|s| !s.is_empty()) else { continue };
                        let m = *set.iter().nth(nth % set.len()).unwrap();
                        wait(|d| store.remove(QueueId(queue), &[m], Some(d))).unwrap();
                        set.remove(&m);
                    }
                    Step::Purge { queue } => {
                        wait(|d| store.purge(QueueId(queue), Some(d))).unwrap();
                        live.remove(&queue);
                    }
                    Step::MetaPut { key, value } => {
                        let (k, v) = (Bytes::from(vec![key]), Bytes::from(vec![value]));
                        wait(|d| store.put_meta(k, v, Some(d))).unwrap();
                    }
                    Step::MetaDelete { key } => {
                        wait(|d| store.delete_meta(Bytes::from(vec![key]), Some(d))).unwrap();
                    }
                    Step::Append { stream, len } => {
                        let offset = next_offset.entry(stream).or_default();
                        let at = *offset;
                        *offset += 1;
                        let payload = Bytes::from(vec![9u8; len]);
                        wait(|d| store.append(QueueId(stream), at, payload, Some(d))).unwrap();
                    }
                    Step::Trim { stream, keep } => {
                        let below = next_offset.get(&stream).copied().unwrap_or(0).saturating_sub(keep);
                        wait(|d| store.trim(QueueId(stream), below, Some(d))).unwrap();
                    }
                    Step::Checkpoint => {
                        store.checkpoint().unwrap();
                        checkpoints += 1;
                    }
                    Step::Compact => store.compact().unwrap(),
                    Step::Restart => {
                        drop(store);
                        store = open(&fs, &cfg);
                    }
                }
            }
            store.checkpoint().unwrap();
            checkpoints += 1;
            drop(store);
            prop_assert_eq!(PAIR_MISMATCHES.load(Ordering::Relaxed), 0,
                "a checkpoint from facts differed from the journal's (checkpoints: {})", checkpoints);
            // Every explicit checkpoint of a group that wrote since its
            // last one was built both ways, or from a snapshot; at least
            // the final ones of a store that never restarted are checked.
            prop_assert!(PAIR_CHECKS.load(Ordering::Relaxed) >= checks_before);
        }
    }

    /// The facts are used: a run of publishes and removes with checkpoints
    /// between them builds every checkpoint after the first both ways.
    #[test]
    fn checkpoints_after_the_first_are_built_from_facts() {
        let fs = FaultStorage::new(1);
        let mut cfg = StoreConfig::new("/data");
        cfg.log_groups = 1;
        cfg.segment_size_bytes = 16 * 1024;
        cfg.recovery_progress_interval_ms = 60_000;
        let store = open(&fs, &cfg);
        let before = PAIR_CHECKS.load(Ordering::Relaxed);
        let mut ids = Vec::new();
        for round in 0..10u64 {
            for _ in 0..20 {
                let m = store.next_msg_id();
                let payload = Bytes::from(vec![1u8; 2048]);
                wait(|d| store.publish(m, &[QueueId(round % 3)], payload, Some(d))).unwrap();
                ids.push((QueueId(round % 3), m));
            }
            for (q, m) in ids.drain(..10) {
                wait(|d| store.remove(q, &[m], Some(d))).unwrap();
            }
            store.checkpoint().unwrap();
        }
        // Other tests in this binary may add theirs; these ten add ten.
        assert!(PAIR_CHECKS.load(Ordering::Relaxed) >= before + 10);
        assert_eq!(PAIR_MISMATCHES.load(Ordering::Relaxed), 0);
    }
}
