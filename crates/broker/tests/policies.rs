//! Policies through the broker's API over an in-memory journal: a change
//! acts on existing queues at once, deleting a policy puts the declared
//! settings back, policies come back from the journal, and a deleted vhost
//! takes its policies with it.

use std::sync::Arc;

use berth_broker::durable::MemoryJournal;
use berth_broker::message::Message;
use berth_broker::policy::{ApplyTo, Policy, PolicyKind};
use berth_broker::vhost::QueueDeclare;
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;

fn msg(body: &str) -> Arc<Message> {
    Message::new(
        String::new(),
        "q".into(),
        encode_properties(&AMQPProperties::default()),
        Bytes::from(body.to_owned()),
    )
    .unwrap()
}

fn max_length(kind: PolicyKind, vhost: &str, name: &str, n: i64) -> Policy {
    let mut d = FieldTable::default();
    d.insert("max-length".into(), AMQPValue::LongLongInt(n));
    Policy::new(kind, vhost, name, "^q$", ApplyTo::Queues, 0, d).unwrap()
}

#[test]
fn a_policy_trims_an_existing_queue_at_once_and_its_deletion_lifts_the_limit() {
    let broker = Broker::new(["/"]);
    let v = broker.vhost("/").unwrap();
    let now = broker.now();
    v.declare_queue(1, "q", &QueueDeclare::default(), now)
        .unwrap();
    let q = v.find_queue("q").unwrap();
    for i in 0..5 {
        q.enqueue(msg(&i.to_string()), None, now);
    }
    broker
        .set_policy(max_length(PolicyKind::Policy, "/", "p", 2))
        .unwrap();
    assert_eq!(q.stats().ready, 2);
    assert_eq!(q.args().max_length, Some(2));
    broker
        .set_policy(max_length(PolicyKind::Operator, "/", "o", 1))
        .unwrap();
    assert_eq!(q.stats().ready, 1, "the operator policy's lower limit wins");
    broker
        .delete_policy(PolicyKind::Operator, "/", "o")
        .unwrap();
    broker.delete_policy(PolicyKind::Policy, "/", "p").unwrap();
    assert_eq!(q.args().max_length, None);
    for i in 0..5 {
        q.enqueue(msg(&i.to_string()), None, now);
    }
    assert_eq!(q.stats().ready, 6);
    assert!(broker.delete_policy(PolicyKind::Policy, "/", "p").is_err());
}

#[test]
fn policies_come_back_from_the_journal_and_go_with_their_vhost() {
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    broker.add_vhost("other").unwrap();
    broker
        .set_policy(max_length(PolicyKind::Policy, "/", "p", 3))
        .unwrap();
    broker
        .set_policy(max_length(PolicyKind::Operator, "other", "o", 4))
        .unwrap();
    let meta: Vec<(Vec<u8>, Vec<u8>)> = journal
        .meta
        .lock()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let restarted = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let (skipped, _) = restarted.restore_access(&meta);
    assert!(skipped.is_empty(), "{skipped:?}");
    let p = restarted.vhost("/").unwrap().policies();
    assert_eq!(p.policies["p"].settings.max_length, Some(3));
    let o = restarted.vhost("other").unwrap().policies();
    assert_eq!(o.operator["o"].settings.max_length, Some(4));

    restarted.delete_vhost("other").unwrap();
    assert!(
        !journal.meta.lock().keys().any(|k| k.starts_with(b"o\0")),
        "the deleted vhost's operator policy is gone from the journal"
    );
    assert!(journal.meta.lock().contains_key(&b"y\0/\0p"[..]));
}
