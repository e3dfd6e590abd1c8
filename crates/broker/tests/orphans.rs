//! Stored messages of a queue that no longer exists (a publish that raced
//! the queue's deletion, or a crash between the definition's delete and
//! its purge) are reclaimed: at run time the racing publish is removed
//! again, and at restart the queue id is reported orphaned so the server
//! purges it. Messages of a queue whose definition is only unreadable are
//! never reclaimed.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use berth_broker::durable::{Done, Journal, JournalError, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::AMQPProperties;
use bytes::Bytes;

mod common;
use common::{recovered, restart, Bodies};

const CONNECTION: u64 = 1;

fn persistent(body: &str) -> Arc<Message> {
    let p = AMQPProperties::default().with_delivery_mode(2);
    Message::new(
        String::new(),
        "dq".into(),
        encode_properties(&p),
        Bytes::from(body.to_owned()),
    )
    .unwrap()
}

fn durable() -> QueueDeclare {
    QueueDeclare {
        durable: true,
        ..QueueDeclare::default()
    }
}

fn no_completion() -> Done {
    Box::new(|r: Result<(), JournalError>| r.expect("stored"))
}

#[test]
fn messages_of_a_queue_without_definition_are_reported_orphaned_at_restore() {
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    v.declare_queue(CONNECTION, "dq", &durable(), t0).unwrap();
    v.publish("", &persistent("kept"), t0, &mut no_completion)
        .unwrap();
    // What a publish that raced the deletion of queue 77 leaves behind.
    journal.publish(900, &[77], Bytes::from_static(b"orphan"), None);

    let (_restarted, report) = restart(&journal, Bodies::InMemory, t0);
    assert_eq!(
        report.orphaned_queues,
        vec![77],
        "queue 77 has stored messages and no definition (skipped: {:?})",
        report.skipped
    );
    assert_eq!(report.messages, 1, "dq's message is restored");
    assert!(
        report.skipped.is_empty(),
        "an orphan is reclaimed, not reported as unusable: {:?}",
        report.skipped
    );
}

#[test]
fn messages_of_a_queue_whose_definition_is_unreadable_are_kept_and_reported() {
    let journal = Arc::new(MemoryJournal::default());
    // A queue definition whose value cannot be decoded: whose messages
    // 77's are cannot be known, so nothing may be reclaimed.
    journal
        .put_meta(b"q\0/\0broken", b"not a field table")
        .unwrap();
    journal.publish(900, &[77], Bytes::from_static(b"whose?"), None);
    let r = recovered(&journal, Bodies::InMemory);
    let broker = Broker::with_journal(["/"], journal.clone(), 1000, 100);
    let report = broker.restore(r, Instant::now());
    assert!(
        report.orphaned_queues.is_empty(),
        "a definition could not be read: keep every message ({:?})",
        report.orphaned_queues
    );
    assert!(
        report.skipped.iter().any(|s| s.contains("queue id 77")),
        "{:?}",
        report.skipped
    );
}

/// The memory journal, with the queue `dq` deleted the moment a publish
/// reaches the journal: after routing chose `dq`, before its record is
/// written — the race, made certain.
struct DeleteDuringPublish {
    inner: Arc<MemoryJournal>,
    vhost: OnceLock<Arc<VHost>>,
}

impl Journal for DeleteDuringPublish {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        if let Some(v) = self.vhost.get() {
            v.delete_queue(CONNECTION, "dq", false, false)
                .expect("delete dq");
        }
        self.inner.publish(msg, queues, payload, done);
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.inner.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.inner.purge(queue, done);
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.inner.delete_meta(key)
    }
}

#[test]
fn a_publish_racing_the_deletion_of_its_queue_leaves_no_stored_message() {
    let memory = Arc::new(MemoryJournal::default());
    let journal = Arc::new(DeleteDuringPublish {
        inner: Arc::clone(&memory),
        vhost: OnceLock::new(),
    });
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    v.declare_queue(CONNECTION, "dq", &durable(), t0).unwrap();
    let qid = v
        .queue(CONNECTION, "dq")
        .unwrap()
        .store_id
        .expect("durable");
    let _ = journal.vhost.set(Arc::clone(&v));
    v.publish("", &persistent("late"), t0, &mut no_completion)
        .unwrap();
    assert!(v.queue(CONNECTION, "dq").is_err(), "dq was deleted");
    let left = memory
        .messages
        .lock()
        .get(&qid)
        .map_or(0, std::collections::BTreeMap::len);
    assert_eq!(
        left, 0,
        "the publish written after dq's purge must be removed again, \
         or its record stays live with no queue to reclaim it"
    );
}
