//! Quorum-queue semantics as RabbitMQ documents them, through a journal
//! whose completions the test releases by hand (a cluster's commit, a
//! store's fdatasync): every message is written whatever its delivery
//! mode, and none is delivered before its write is durable.

use std::sync::Arc;
use std::time::Instant;

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::durable::{Done, Journal, JournalError, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

mod common;
use common::{restart, Bodies};

/// A journal that stores at once but completes only when told
/// (`release`), or fails the held writes (`fail`).
#[derive(Default)]
struct HeldJournal {
    inner: MemoryJournal,
    held: Mutex<Vec<Option<Done>>>,
}

impl HeldJournal {
    fn release(&self, result: impl Fn() -> Result<(), JournalError>) {
        let held: Vec<_> = self.held.lock().drain(..).collect();
        for done in held.into_iter().flatten() {
            done(result());
        }
    }
    fn stored(&self) -> usize {
        self.inner.messages.lock().values().map(|m| m.len()).sum()
    }
}

impl Journal for HeldJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.inner.publish(msg, queues, payload, None);
        self.held.lock().push(done);
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
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.inner.read(queue, msg)
    }
}

#[derive(Default)]
struct Sink(Mutex<Vec<Vec<u8>>>, Mutex<Vec<Option<i128>>>);

fn delivery_count(m: &Message) -> Option<i128> {
    let v = m.headers()?.inner().get("x-delivery-count").cloned()?;
    berth_broker::args::as_i128(&v)
}

impl Outlet for Sink {
    fn deliver(&self, _: u16, _: &str, _: u64, _: bool, m: &Message) {
        self.0.lock().push(m.body.to_vec());
        self.1.lock().push(delivery_count(m));
    }
    fn get_ok(&self, _: u16, _: u64, _: bool, m: &Message, _: u32) {
        self.0.lock().push(m.body.to_vec());
        self.1.lock().push(delivery_count(m));
    }
    fn consumer_cancelled(&self, _: u16, _: &str) {}
    fn is_congested(&self) -> bool {
        false
    }
}

fn channel(v: &Arc<VHost>, out: &Arc<Sink>) -> Arc<Channel> {
    Channel::new(
        1,
        Arc::new(Session {
            connection_id: 1,
            vhost: Arc::clone(v),
            outlet: Arc::clone(out) as Arc<dyn Outlet>,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: Arc::from("guest"),
            events: None,
        }),
    )
}

fn transient(body: &str) -> Arc<Message> {
    let p = encode_properties(&AMQPProperties::default());
    Message::new(String::new(), "qq".into(), p, Bytes::from(body.to_owned())).unwrap()
}

fn quorum_queue() -> (Arc<HeldJournal>, Arc<VHost>, Instant) {
    let journal = Arc::new(HeldJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let d = QueueDeclare {
        durable: true,
        arguments: args,
        ..Default::default()
    };
    v.declare_queue(1, "qq", &d, t0).unwrap();
    (journal, v, t0)
}

fn publish(v: &VHost, body: &str, t0: Instant, confirmed: &Arc<Mutex<Vec<bool>>>) {
    let c = Arc::clone(confirmed);
    v.publish("", &transient(body), t0, &mut || {
        let c = Arc::clone(&c);
        Box::new(move |r| c.lock().push(r.is_ok()))
    })
    .unwrap();
}

/// Transient messages to a quorum queue were confirmed at once and kept
/// in memory only (lost at failover); consumers got them before their
/// write was durable (a dirty read a new leader may not have).
#[test]
fn a_quorum_queue_writes_every_message_and_delivers_it_once_durable() {
    let (journal, v, t0) = quorum_queue();
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::new(Sink::default());
    let ch = channel(&v, &out);
    let q = v.queue(1, "qq").unwrap();
    ch.consume(Arc::clone(&q), "c", true, false, t0, |_| {})
        .unwrap();

    publish(&v, "m1", t0, &confirmed);
    publish(&v, "m2", t0, &confirmed);
    assert_eq!(journal.stored(), 2, "a transient message is written too");
    assert!(confirmed.lock().is_empty(), "confirmed only once durable");
    assert!(out.0.lock().is_empty(), "delivered before it was durable");

    journal.release(|| Ok(()));
    assert_eq!(*confirmed.lock(), [true, true]);
    assert_eq!(*out.0.lock(), [b"m1".to_vec(), b"m2".to_vec()]);
}

#[test]
fn basic_get_finds_nothing_until_the_write_is_durable() {
    let (journal, v, t0) = quorum_queue();
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::new(Sink::default());
    let ch = channel(&v, &out);
    let q = v.queue(1, "qq").unwrap();
    publish(&v, "m1", t0, &confirmed);
    assert!(!ch.get(&q, true, t0), "fetched before it was durable");
    journal.release(|| Ok(()));
    assert!(ch.get(&q, true, t0));
    assert_eq!(*out.0.lock(), [b"m1".to_vec()]);
}

/// A write that failed was nacked; the message must never reach a
/// consumer, and its record is removed.
#[test]
fn a_message_whose_write_failed_is_never_delivered() {
    let (journal, v, t0) = quorum_queue();
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::new(Sink::default());
    let ch = channel(&v, &out);
    let q = v.queue(1, "qq").unwrap();
    ch.consume(Arc::clone(&q), "c", true, false, t0, |_| {})
        .unwrap();
    publish(&v, "lost", t0, &confirmed);
    journal.release(|| Err(JournalError::new("injected: not committed")));
    publish(&v, "kept", t0, &confirmed);
    journal.release(|| Ok(()));
    assert_eq!(*confirmed.lock(), [false, true]);
    assert_eq!(*out.0.lock(), [b"kept".to_vec()]);
    assert_eq!(journal.stored(), 0, "the failed write's record is removed");
}

/// A classic durable queue keeps today's behaviour: a transient message
/// is neither written nor held back.
#[test]
fn a_classic_queue_is_unchanged() {
    let journal = Arc::new(HeldJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    let d = QueueDeclare {
        durable: true,
        ..Default::default()
    };
    v.declare_queue(1, "qq", &d, t0).unwrap();
    let out = Arc::new(Sink::default());
    let ch = channel(&v, &out);
    let q = v.queue(1, "qq").unwrap();
    publish(&v, "t", t0, &Arc::new(Mutex::new(Vec::new())));
    assert_eq!(journal.stored(), 0);
    assert!(ch.get(&q, true, t0));
}

/// The count of returns lived in the leader's memory only: a restart or a
/// failover gave a poison message a fresh `x-delivery-limit` quota, and
/// there was no `x-delivery-count` header.
#[test]
fn delivery_counts_and_the_limit_survive_a_restart() {
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(2));
    let d = QueueDeclare {
        durable: true,
        arguments: args,
        ..Default::default()
    };
    v.declare_queue(1, "qq", &d, t0).unwrap();
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    publish(&v, "poison", t0, &confirmed);
    let out = Arc::new(Sink::default());
    let ch = channel(&v, &out);
    let q = v.queue(1, "qq").unwrap();
    for tag in 1..=2 {
        assert!(ch.get(&q, false, t0));
        ch.nack(tag, false, true, t0).unwrap();
    }
    assert_eq!(
        *out.1.lock(),
        [None, Some(1)],
        "x-delivery-count per delivery"
    );

    let (broker2, _) = restart(&journal, Bodies::OnDisk, t0);
    let v2 = broker2.vhost("/").unwrap();
    let out2 = Arc::new(Sink::default());
    let ch2 = channel(&v2, &out2);
    let q2 = v2.queue(1, "qq").unwrap();
    assert!(ch2.get(&q2, false, t0), "still there after two returns");
    assert_eq!(*out2.1.lock(), [Some(2)], "the count came back");
    ch2.nack(1, false, true, t0).unwrap();
    assert!(
        !ch2.get(&q2, false, t0),
        "a third return is over the limit of 2"
    );
}

/// A delivery still out when its member died never came back as a
/// return, so it was not counted: a message whose consumer takes the
/// leader down with it (a poison message) got a fresh quota at every
/// failover and looped forever. Each restart here stands for one.
#[test]
fn a_delivery_lost_with_its_member_counts_against_the_limit() {
    let journal = Arc::new(MemoryJournal::default());
    let t0 = Instant::now();
    {
        let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
        let v = broker.vhost("/").unwrap();
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert("x-delivery-limit".into(), AMQPValue::LongInt(2));
        let d = QueueDeclare {
            durable: true,
            arguments: args,
            ..Default::default()
        };
        v.declare_queue(1, "qq", &d, t0).unwrap();
        let confirmed = Arc::new(Mutex::new(Vec::new()));
        publish(&v, "poison", t0, &confirmed);
        let ch = channel(&v, &Arc::new(Sink::default()));
        assert!(ch.get(&v.queue(1, "qq").unwrap(), false, t0));
        // Never acked, never returned: the member dies with it.
    }
    let mut seen = Vec::new();
    for _failover in 0..3 {
        let (broker, _) = restart(&journal, Bodies::OnDisk, t0);
        let v = broker.vhost("/").unwrap();
        let out = Arc::new(Sink::default());
        let ch = channel(&v, &out);
        if ch.get(&v.queue(1, "qq").unwrap(), false, t0) {
            seen.extend(out.1.lock().iter().copied());
        }
    }
    assert_eq!(
        seen,
        [Some(1), Some(2)],
        "delivered again with its lost deliveries counted, then over the limit of 2"
    );
}
