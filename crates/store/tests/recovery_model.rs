//! Property test: any sequence of operations, interleaved with checkpoints,
//! compactions, clean restarts and power losses, recovers to exactly the
//! state a simple model computes (in `SyncMode::Always` every completed
//! operation is durable, so nothing may differ).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use berth_store::fault::FaultStorage;
use berth_store::{MsgId, QueueId, Recovered};
use bytes::Bytes;
use common::{config, open, wait};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Publish {
        queues: Vec<u64>,
        len: usize,
    },
    /// Remove the `nth` live message of `queue` (if any).
    Remove {
        queue: u64,
        nth: usize,
    },
    Purge {
        queue: u64,
    },
    MetaPut {
        key: u8,
        value: u8,
    },
    MetaDelete {
        key: u8,
    },
    Checkpoint,
    Compact,
    Restart,
    PowerLoss,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (proptest::collection::vec(0u64..5, 1..3), 0usize..3000).prop_map(|(queues, len)| Step::Publish { queues, len }),
        4 => (0u64..5, any::<usize>()).prop_map(|(queue, nth)| Step::Remove { queue, nth }),
        1 => (0u64..5).prop_map(|queue| Step::Purge { queue }),
        1 => (0u8..4, any::<u8>()).prop_map(|(key, value)| Step::MetaPut { key, value }),
        1 => (0u8..4).prop_map(|key| Step::MetaDelete { key }),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Compact),
        1 => Just(Step::Restart),
        1 => Just(Step::PowerLoss),
    ]
}

#[derive(Default, Debug, PartialEq)]
struct Model {
    queues: BTreeMap<QueueId, BTreeSet<MsgId>>,
    meta: BTreeMap<Bytes, Bytes>,
}

fn observed(rec: &Recovered) -> Model {
    Model {
        queues: rec
            .queues
            .iter()
            .map(|(q, ms)| (*q, ms.iter().map(|m| m.msg).collect()))
            .collect(),
        meta: rec.metadata.clone(),
    }
}

fn payload(m: MsgId, len: usize) -> Bytes {
    Bytes::from(vec![u8::try_from(m.0 % 256).unwrap(); len])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn recovery_rebuilds_exactly_the_completed_operations(steps in proptest::collection::vec(step(), 1..60), seed in any::<u64>()) {
        let fs = FaultStorage::new(seed);
        let mut cfg = config(2);
        cfg.segment_size_bytes = 8 * 1024;
        let (mut store, _) = open(&fs, &cfg);
        let mut model = Model::default();
        let mut lens: BTreeMap<MsgId, usize> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Publish { queues, len } => {
                    let m = store.next_msg_id();
                    let qs: Vec<QueueId> = queues.into_iter().map(QueueId).collect();
                    wait(|d| store.publish(m, &qs, payload(m, len), Some(d))).unwrap();
                    for q in qs {
                        model.queues.entry(q).or_default().insert(m);
                    }
                    lens.insert(m, len);
                }
                Step::Remove { queue, nth } => {
                    let q = QueueId(queue);
                    let Some(set) = model.queues.get_mut(&q) else { continue };
                    let m = *set.iter().nth(nth % set.len()).unwrap();
                    wait(|d| store.remove(q, &[m], Some(d))).unwrap();
                    set.remove(&m);
                    if set.is_empty() {
                        model.queues.remove(&q);
                    }
                }
                Step::Purge { queue } => {
                    wait(|d| store.purge(QueueId(queue), Some(d))).unwrap();
                    model.queues.remove(&QueueId(queue));
                }
                Step::MetaPut { key, value } => {
                    let (k, v) = (Bytes::from(vec![key]), Bytes::from(vec![value]));
                    wait(|d| store.put_meta(k.clone(), v.clone(), Some(d))).unwrap();
                    model.meta.insert(k, v);
                }
                Step::MetaDelete { key } => {
                    let k = Bytes::from(vec![key]);
                    wait(|d| store.delete_meta(k.clone(), Some(d))).unwrap();
                    model.meta.remove(&k);
                }
                Step::Checkpoint => store.checkpoint().unwrap(),
                Step::Compact => store.compact().unwrap(),
                Step::Restart | Step::PowerLoss => {
                    let power_loss = matches!(s, Step::PowerLoss);
                    if power_loss {
                        fs.crash();
                    }
                    drop(store);
                    fs.power_on();
                    let (s2, rec) = open(&fs, &cfg);
                    store = s2;
                    prop_assert!(rec.damage.is_empty(), "damage: {:?}", rec.damage);
                    prop_assert_eq!(observed(&rec), Model { queues: model.queues.clone(), meta: model.meta.clone() });
                    for (q, ms) in &model.queues {
                        for m in ms {
                            prop_assert_eq!(store.read(*q, *m).unwrap(), payload(*m, lens[m]));
                        }
                    }
                }
            }
        }
        fs.crash();
        drop(store);
        fs.power_on();
        let (_s, rec) = open(&fs, &cfg);
        prop_assert_eq!(observed(&rec), model);
    }
}
