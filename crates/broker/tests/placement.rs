//! Durable queues are spread over the journal's log groups: a new queue
//! goes to the group holding the fewest live durable queues, whatever the
//! group function does with consecutive ids, and the counts follow
//! deletes and restarts.

mod common;

use std::sync::Arc;
use std::time::Instant;

use berth_broker::durable::{Done, Journal, JournalError, MemoryJournal};
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use bytes::Bytes;
use common::{recovered, Bodies};

/// A memory journal with two groups and a group function that puts only
/// every fourth id in group 1: consecutive ids, placed by the function
/// alone, would land 3 to 1.
struct Skewed(Arc<MemoryJournal>);

fn skewed_group(queue: u64) -> u32 {
    u32::from(queue.is_multiple_of(4))
}

impl Journal for Skewed {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.0.publish(msg, queues, payload, done);
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.0.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.0.purge(queue, done);
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.0.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.0.delete_meta(key)
    }
    fn groups(&self) -> u32 {
        2
    }
    fn group_of(&self, queue: u64) -> u32 {
        skewed_group(queue)
    }
}

fn durable() -> QueueDeclare {
    QueueDeclare {
        durable: true,
        ..Default::default()
    }
}

/// Durable queues of `v` per group, by their journal ids.
fn per_group(v: &VHost) -> [usize; 2] {
    let mut n = [0; 2];
    for q in v.queues() {
        if let Some(id) = q.store_id {
            n[skewed_group(id) as usize] += 1;
        }
    }
    n
}

fn declare(v: &VHost, names: impl IntoIterator<Item = String>, now: Instant) {
    for name in names {
        v.declare_queue(1, &name, &durable(), now).unwrap();
    }
}

#[test]
fn ten_durable_queues_split_five_and_five_over_two_groups() {
    let mem = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], Arc::new(Skewed(mem)), 1, 1);
    let v = broker.vhost("/").unwrap();
    let now = Instant::now();
    declare(&v, (0..10).map(|i| format!("q{i}")), now);
    // Neither transient nor exclusive queues are stored, so they count nowhere.
    v.declare_queue(1, "transient", &QueueDeclare::default(), now)
        .unwrap();
    assert_eq!(
        per_group(&v),
        [5, 5],
        "ten durable queues must split evenly over two groups, not as consecutive ids fall"
    );
    let ids: Vec<u64> = v.queues().iter().filter_map(|q| q.store_id).collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        ids.len(),
        "a queue id was handed out twice: {ids:?}"
    );
}

#[test]
fn deleted_queues_free_their_group_and_a_restart_counts_what_it_restores() {
    let mem = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], Arc::new(Skewed(mem.clone())), 1, 1);
    let v = broker.vhost("/").unwrap();
    let now = Instant::now();
    declare(&v, (0..8).map(|i| format!("q{i}")), now);
    assert_eq!(per_group(&v), [4, 4]);
    // Empty group 1 but for one queue: the next three go there.
    let in_group_1: Vec<String> = v
        .queues()
        .iter()
        .filter(|q| q.store_id.is_some_and(|id| skewed_group(id) == 1))
        .map(|q| q.name.clone())
        .collect();
    for name in &in_group_1[1..] {
        v.delete_queue(1, name, false, false).unwrap();
    }
    assert_eq!(per_group(&v), [4, 1]);
    declare(&v, (0..3).map(|i| format!("after-delete-{i}")), now);
    assert_eq!(
        per_group(&v),
        [4, 4],
        "new queues must fill the group that deletes emptied"
    );

    // A restart counts the restored queues: 4 and 4, so two new ones split.
    let r = recovered(&mem, Bodies::InMemory);
    let (next_msg, next_queue) = r.next_ids();
    drop(broker);
    let broker = Broker::with_journal(["/"], Arc::new(Skewed(mem)), next_msg, next_queue);
    broker.restore(r, now);
    let v = broker.vhost("/").unwrap();
    assert_eq!(per_group(&v), [4, 4]);
    declare(&v, ["r0".to_owned(), "r1".to_owned()], now);
    assert_eq!(
        per_group(&v),
        [5, 5],
        "a restart must count the queues it restored"
    );
}
