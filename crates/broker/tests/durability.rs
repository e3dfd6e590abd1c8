//! What the broker writes to its journal, checked through an in-memory
//! journal that stands for a perfect store: whatever it holds is what a
//! restart gets back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::durable::{Done, JournalError, MemoryJournal, PAGING_BIT};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

mod common;
use common::{recovered, restart, Bodies};

#[derive(Default)]
struct Sink(Mutex<Vec<(u64, bool, Vec<u8>)>>);

impl Sink {
    /// (redelivered, body) of everything delivered so far.
    fn got(&self) -> Vec<(bool, Vec<u8>)> {
        self.0
            .lock()
            .iter()
            .map(|(_, r, b)| (*r, b.clone()))
            .collect()
    }
}
impl Outlet for Sink {
    fn deliver(&self, _: u16, _: &str, tag: u64, redelivered: bool, m: &Message) {
        self.0.lock().push((tag, redelivered, m.body.to_vec()));
    }
    fn get_ok(&self, _: u16, tag: u64, redelivered: bool, m: &Message, _: u32) {
        self.0.lock().push((tag, redelivered, m.body.to_vec()));
    }
    fn consumer_cancelled(&self, _: u16, _: &str) {}
    fn is_congested(&self) -> bool {
        false
    }
}

fn session(broker: &Broker, out: &Arc<Sink>) -> Arc<Channel> {
    Channel::new(
        1,
        Arc::new(Session {
            connection_id: 1,
            vhost: broker.vhost("/").unwrap(),
            outlet: Arc::clone(out) as Arc<dyn Outlet>,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: std::sync::Arc::from("guest"),
            events: None,
        }),
    )
}

fn msg(key: &str, body: &str, persistent: bool) -> Arc<Message> {
    let mut p = AMQPProperties::default();
    if persistent {
        p = p.with_delivery_mode(2);
    }
    Message::new(
        "ex".into(),
        key.into(),
        encode_properties(&p),
        Bytes::from(body.to_owned()),
    )
    .unwrap()
}

/// A broker over a fresh in-memory journal, its vhost `/` and a start time.
fn journaled_broker() -> (
    Arc<MemoryJournal>,
    Arc<Broker>,
    Arc<berth_broker::vhost::VHost>,
    Instant,
) {
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    (journal, broker, v, Instant::now())
}

#[test]
fn persistent_messages_in_durable_queues_survive_a_restart_and_acked_ones_do_not() {
    let (journal, broker, v, t0) = journaled_broker();
    v.declare_exchange(
        "ex",
        &ExchangeDeclare {
            kind: "topic".into(),
            durable: true,
            ..Default::default()
        },
    )
    .unwrap();
    v.declare_queue(
        1,
        "dq",
        &QueueDeclare {
            durable: true,
            ..Default::default()
        },
        t0,
    )
    .unwrap();
    v.declare_queue(1, "tq", &QueueDeclare::default(), t0)
        .unwrap();
    v.bind_queue(1, "dq", "ex", "a.#", &FieldTable::default())
        .unwrap();
    v.bind_queue(1, "tq", "ex", "a.#", &FieldTable::default())
        .unwrap();

    let confirmed = Arc::new(Mutex::new(0));
    let mut done = || -> Done {
        let c = Arc::clone(&confirmed);
        Box::new(move |r| {
            r.unwrap();
            *c.lock() += 1;
        })
    };
    for (body, persistent) in [("p1", true), ("t1", false), ("p2", true), ("p3", true)] {
        v.publish("ex", &msg("a.b", body, persistent), t0, &mut done)
            .unwrap();
    }
    assert_eq!(
        *confirmed.lock(),
        3,
        "one completion per journaled (persistent) publish"
    );

    // Consume p1 and ack it; take p2 and leave it unacked.
    let out = Arc::new(Sink::default());
    let ch = session(&broker, &out);
    let q = v.queue(1, "dq").unwrap();
    assert!(ch.get(&q, false, t0));
    ch.ack(1, false, t0).unwrap();
    assert!(ch.get(&q, false, t0));

    // "Crash": a new broker from what the journal holds.
    let (broker2, report) = restart(&journal, Bodies::InMemory, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(
        (
            report.exchanges,
            report.queues,
            report.bindings,
            report.messages
        ),
        (1, 1, 1, 2)
    );
    let v2 = broker2.vhost("/").unwrap();
    assert!(v2.queue(1, "tq").is_err(), "transient queue is gone");
    let out2 = Arc::new(Sink::default());
    let ch2 = session(&broker2, &out2);
    let q2 = v2.queue(1, "dq").unwrap();
    while ch2.get(&q2, true, t0) {}
    let got: Vec<(bool, Vec<u8>)> = out2.got();
    assert_eq!(
        got,
        [(true, b"p2".to_vec()), (true, b"p3".to_vec())],
        "acked p1 is gone; the rest come back flagged redelivered"
    );

    // The binding came back too: routing works after the restart.
    let r = v2
        .publish("ex", &msg("a.z", "p4", true), t0, &mut || {
            Box::new(|r| r.unwrap())
        })
        .unwrap();
    assert_eq!(r.queues, 1);
    assert!(
        journal.messages.lock().values().all(|m| m.len() == 1),
        "no-ack gets removed p2/p3 from the journal"
    );
}

#[test]
fn deleting_a_durable_queue_removes_its_definition_bindings_and_messages() {
    let (journal, _broker, v, t0) = journaled_broker();
    v.declare_queue(
        1,
        "dq",
        &QueueDeclare {
            durable: true,
            ..Default::default()
        },
        t0,
    )
    .unwrap();
    v.bind_queue(1, "dq", "amq.direct", "k", &FieldTable::default())
        .unwrap();
    v.publish("amq.direct", &msg("k", "m", true), t0, &mut || {
        Box::new(|r| r.unwrap())
    })
    .unwrap();
    assert_eq!(journal.meta.lock().len(), 2);
    v.delete_queue(1, "dq", false, false).unwrap();
    assert!(
        journal.meta.lock().is_empty(),
        "{:?}",
        journal.meta.lock().keys().collect::<Vec<_>>()
    );
    assert!(journal
        .messages
        .lock()
        .values()
        .all(std::collections::BTreeMap::is_empty));
}

#[test]
fn tx_commit_waits_for_the_removal_of_acked_stored_messages() {
    let (journal, broker, v, t0) = journaled_broker();
    v.declare_queue(
        1,
        "dq",
        &QueueDeclare {
            durable: true,
            ..Default::default()
        },
        t0,
    )
    .unwrap();
    v.publish(
        "",
        &Message::new(
            "".into(),
            "dq".into(),
            encode_properties(&AMQPProperties::default().with_delivery_mode(2)),
            Bytes::from_static(b"m"),
        )
        .unwrap(),
        t0,
        &mut || Box::new(|r| r.unwrap()),
    )
    .unwrap();
    let out = Arc::new(Sink::default());
    let ch = session(&broker, &out);
    ch.tx_select();
    assert!(ch.get(&v.queue(1, "dq").unwrap(), false, t0));
    ch.ack(1, false, t0).unwrap();
    assert_eq!(
        journal
            .messages
            .lock()
            .values()
            .map(|m| m.len())
            .sum::<usize>(),
        1,
        "ack buffered until commit"
    );
    let mut waits = 0;
    ch.tx_commit(t0, &mut || {
        waits += 1;
        Box::new(|r| r.unwrap())
    })
    .unwrap();
    assert_eq!(waits, 1, "the commit waits for one journal write");
    assert_eq!(
        journal
            .messages
            .lock()
            .values()
            .map(|m| m.len())
            .sum::<usize>(),
        0
    );
}

fn durable_queue(v: &berth_broker::vhost::VHost, name: &str, arguments: FieldTable, t0: Instant) {
    v.declare_queue(
        1,
        name,
        &QueueDeclare {
            durable: true,
            arguments,
            ..Default::default()
        },
        t0,
    )
    .unwrap();
    v.bind_queue(1, name, "amq.direct", name, &FieldTable::default())
        .unwrap();
}

fn drain(broker: &Broker, queue: &str, now: Instant) -> Vec<(bool, Vec<u8>)> {
    let out = Arc::new(Sink::default());
    let ch = session(broker, &out);
    let q = broker.vhost("/").unwrap().queue(1, queue).unwrap();
    while ch.get(&q, true, now) {}
    out.got()
}

#[test]
fn a_deep_queue_keeps_bodies_on_disk_and_delivers_them_in_order() {
    let (journal, broker, v, t0) = journaled_broker();
    broker.set_resident_messages_max(10);
    durable_queue(&v, "deep", FieldTable::default(), t0);
    let mut expected = Vec::new();
    for i in 0..1000 {
        // Every tenth message is transient: it cannot be paged out.
        let persistent = i % 10 != 0;
        let body = format!("m{i}");
        v.publish(
            "amq.direct",
            &msg("deep", &body, persistent),
            t0,
            &mut || Box::new(|r| r.unwrap()),
        )
        .unwrap();
        expected.push((false, body.into_bytes()));
    }
    let stats = v.queue(1, "deep").unwrap().stats();
    assert_eq!(stats.ready, 1000);
    assert!(
        stats.paged_out >= 900,
        "persistent and transient messages past the window leave memory: {stats:?}"
    );
    let paging_copies: usize = journal
        .messages
        .lock()
        .iter()
        .filter(|(q, _)| **q & PAGING_BIT != 0)
        .map(|(_, m)| m.len())
        .sum();
    assert!(
        (80..=100).contains(&paging_copies),
        "the transient tenth is written as paging copies: {paging_copies}"
    );
    assert_eq!(drain(&broker, "deep", t0), expected);
    assert!(
        journal.messages.lock().values().all(BTreeMap::is_empty),
        "delivered without ack: every removal was journaled"
    );
}

/// Paging counted messages only: a backlog of 1 MiB messages kept 4096 of
/// them (4 GiB) in memory, and a cluster leader holding a 1 GiB backlog
/// grew to ~1.1 GB. Bodies past `queue_resident_bytes_max` leave memory
/// too, whatever the count allows.
#[test]
fn a_backlog_of_large_messages_keeps_only_the_byte_bound_in_memory() {
    let (_journal, broker, v, t0) = journaled_broker();
    const MIB: usize = 1024 * 1024;
    broker.set_resident_bytes_max(8 * MIB as u64);
    durable_queue(&v, "large", FieldTable::default(), t0);
    let body = "x".repeat(MIB);
    for _ in 0..200 {
        v.publish("amq.direct", &msg("large", &body, true), t0, &mut || {
            Box::new(|r| r.unwrap())
        })
        .unwrap();
    }
    let stats = v.queue(1, "large").unwrap().stats();
    let resident = stats.ready - stats.paged_out;
    assert_eq!(stats.ready, 200);
    // The bound, plus what may arrive before a scan (twice the bound).
    assert!(
        resident <= 2 * 8 + 1,
        "{resident} of 200 messages of 1 MiB stay in memory under an 8 MiB bound: {stats:?}"
    );
    let got = drain(&broker, "large", t0);
    assert_eq!(got.len(), 200);
    assert!(got.iter().all(|(_, b)| b.len() == MIB), "read back whole");
}

/// Reading a paged-out message back reads its neighbours with it, up to
/// 64 of them whatever their size: one `basic.get` from a backlog of
/// 1 MiB messages made 64 MiB resident under an 8 MiB bound (with
/// 128 MiB bodies it would be 8 GiB). The read-ahead is now bounded by
/// bytes too.
#[test]
fn reading_back_a_backlog_of_large_messages_reads_ahead_by_bytes() {
    let (_journal, broker, v, t0) = journaled_broker();
    const MIB: usize = 1024 * 1024;
    broker.set_resident_bytes_max(8 * MIB as u64);
    durable_queue(&v, "large", FieldTable::default(), t0);
    let body = "x".repeat(MIB);
    for _ in 0..200 {
        v.publish("amq.direct", &msg("large", &body, true), t0, &mut || {
            Box::new(|r| r.unwrap())
        })
        .unwrap();
    }
    let q = v.queue(1, "large").unwrap();
    let out = Arc::new(Sink::default());
    let ch = session(&broker, &out);
    // Past the resident front, into the paged-out rest.
    for _ in 0..30 {
        assert!(ch.get(&q, true, t0));
    }
    let stats = q.stats();
    let resident = stats.ready - stats.paged_out;
    assert!(
        resident <= 2 * 8 + 1,
        "{resident} of {} ready messages of 1 MiB are in memory after 30 gets under an 8 MiB \
         bound: {stats:?}",
        stats.ready
    );
}

#[test]
fn a_deep_non_durable_queue_pages_out_through_paging_copies() {
    let (journal, broker, v, t0) = journaled_broker();
    broker.set_resident_messages_max(10);
    v.declare_queue(1, "mem", &QueueDeclare::default(), t0)
        .unwrap();
    v.bind_queue(1, "mem", "amq.direct", "mem", &FieldTable::default())
        .unwrap();
    let mut expected = Vec::new();
    for i in 0..500 {
        let body = format!("t{i}");
        v.publish(
            "amq.direct",
            &msg("mem", &body, i % 2 == 0),
            t0,
            &mut || Box::new(|r| r.unwrap()),
        )
        .unwrap();
        expected.push((false, body.into_bytes()));
    }
    let q = v.queue(1, "mem").unwrap();
    assert!(q.stats().paged_out >= 400, "{:?}", q.stats());
    assert!(
        journal.messages.lock().keys().all(|q| q & PAGING_BIT != 0),
        "a non-durable queue writes nothing but paging copies"
    );
    // Requeued and redelivered copies keep their place and content.
    let out = Arc::new(Sink::default());
    let ch = session(&broker, &out);
    assert!(ch.get(&q, false, t0));
    ch.nack(1, false, true, t0).unwrap();
    assert_eq!(drain(&broker, "mem", t0)[1..], expected[1..]);
    assert!(journal.messages.lock().values().all(BTreeMap::is_empty));
    // Deleting the queue drops its paging copies too.
    for i in 0..100 {
        v.publish(
            "amq.direct",
            &msg("mem", &format!("u{i}"), false),
            t0,
            &mut || Box::new(|r| r.unwrap()),
        )
        .unwrap();
    }
    assert!(!journal.messages.lock().is_empty());
    v.delete_queue(1, "mem", false, false).unwrap();
    assert!(journal.messages.lock().values().all(BTreeMap::is_empty));
}

#[test]
fn a_restart_reads_no_bodies_until_delivery_and_keeps_priorities() {
    let (journal, _broker, v, t0) = journaled_broker();
    durable_queue(&v, "plain", FieldTable::default(), t0);
    let mut prio_args = FieldTable::default();
    prio_args.insert(
        "x-max-priority".into(),
        berth_protocol::AMQPValue::ShortShortUInt(9),
    );
    durable_queue(&v, "prio", prio_args, t0);
    let publish = |queue: &str, body: &str, props: AMQPProperties| {
        let m = Message::new(
            String::new(),
            queue.into(),
            encode_properties(&props.with_delivery_mode(2)),
            Bytes::from(body.to_owned()),
        )
        .unwrap();
        v.publish("amq.direct", &m, t0, &mut || Box::new(|r| r.unwrap()))
            .unwrap();
    };
    for i in 0..50 {
        publish("plain", &format!("p{i}"), AMQPProperties::default());
    }
    publish("prio", "low", AMQPProperties::default().with_priority(1));
    publish("prio", "high", AMQPProperties::default().with_priority(8));
    publish(
        "plain",
        "short-lived",
        AMQPProperties::default().with_expiration("5".into()),
    );

    // Restart: the journal gives back ids and sizes only.
    let (broker2, report) = restart(&journal, Bodies::OnDisk, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.messages, 53);
    let v2 = broker2.vhost("/").unwrap();
    assert_eq!(v2.queue(1, "plain").unwrap().stats().paged_out, 51);

    let prio = drain(&broker2, "prio", t0);
    assert_eq!(
        prio,
        [(true, b"high".to_vec()), (true, b"low".to_vec())],
        "priorities survive a lazy restore"
    );
    // Read 10 ms after the restart: the 5 ms expiration (counted from
    // the restart) has passed, so that one is dropped, the rest delivered.
    let later = t0 + std::time::Duration::from_millis(10);
    // The first read brings the messages behind it along (read-ahead).
    let q = v2.queue(1, "plain").unwrap();
    let out = Arc::new(Sink::default());
    assert!(session(&broker2, &out).get(&q, true, later));
    let stats = q.stats();
    assert_eq!((stats.ready, stats.paged_out), (50, 0), "{stats:?}");
    let mut plain: Vec<(bool, Vec<u8>)> = out.got();
    plain.extend(drain(&broker2, "plain", later));
    let expected: Vec<(bool, Vec<u8>)> = (0..50)
        .map(|i| (true, format!("p{i}").into_bytes()))
        .collect();
    assert_eq!(plain, expected);
    assert!(journal.messages.lock().values().all(BTreeMap::is_empty));
}

#[test]
fn a_restored_message_expires_after_the_shorter_of_queue_ttl_and_its_own_expiration() {
    let (journal, broker, v, t0) = journaled_broker();
    let ttl = |ms: i32| {
        let mut t = FieldTable::default();
        t.insert(
            "x-message-ttl".into(),
            berth_protocol::AMQPValue::LongInt(ms),
        );
        t
    };
    durable_queue(&v, "q", ttl(60_000), t0);
    let props = AMQPProperties::default()
        .with_delivery_mode(2)
        .with_expiration("100".into());
    let m = Message::new(
        "amq.direct".into(),
        "q".into(),
        encode_properties(&props),
        Bytes::from_static(b"short-lived"),
    )
    .unwrap();
    v.publish("amq.direct", &m, t0, &mut || Box::new(|r| r.unwrap()))
        .unwrap();
    drop((broker, v));

    // Restored with its body in memory (as the journal hands back a
    // payload it has already read).
    let restarted = Broker::with_journal(["/"], journal.clone(), 1_000, 1_000);
    let report = restarted.restore(recovered(&journal, Bodies::InMemory), t0);
    assert_eq!(report.messages, 1, "{report:?}");
    restarted.run_timers(t0 + Duration::from_millis(200));
    assert_eq!(
        drain(&restarted, "q", t0 + Duration::from_millis(200)),
        Vec::<(bool, Vec<u8>)>::new(),
        "its own 100 ms expiration is shorter than the queue's 60 s TTL"
    );
}

/// A journal that logs what it is asked to do, in order, and holds
/// publish completions until the test releases them (a slow disk).
#[derive(Default)]
struct SlowJournal {
    inner: MemoryJournal,
    log: Mutex<Vec<String>>,
    held: Mutex<Vec<Done>>,
}

impl SlowJournal {
    fn release(&self) {
        for d in std::mem::take(&mut *self.held.lock()) {
            d(Ok(()));
        }
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().clone()
    }
}

impl berth_broker::durable::Journal for SlowJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.log.lock().push(format!("publish {msg} to {queues:?}"));
        self.inner.publish(msg, queues, payload, None);
        self.held.lock().extend(done);
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.log
            .lock()
            .push(format!("remove {msgs:?} from {queue}"));
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
fn a_dead_lettered_message_leaves_its_queue_only_after_its_copy_is_durable() {
    let journal = Arc::new(SlowJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let t0 = Instant::now();
    let mut dlx = FieldTable::default();
    dlx.insert(
        "x-dead-letter-exchange".into(),
        berth_protocol::AMQPValue::LongString("amq.direct".into()),
    );
    dlx.insert(
        "x-dead-letter-routing-key".into(),
        berth_protocol::AMQPValue::LongString("dead".into()),
    );
    durable_queue(&v, "src", dlx, t0);
    durable_queue(&v, "dead", FieldTable::default(), t0);
    let m = msg("src", "m", true);
    let m = Message::new(
        "amq.direct".into(),
        "src".into(),
        m.properties.clone(),
        m.body.clone(),
    )
    .unwrap();
    v.publish("amq.direct", &m, t0, &mut || Box::new(|r| r.unwrap()))
        .unwrap();
    journal.release();

    let out = Arc::new(Sink::default());
    let ch = session(&broker, &out);
    let q = v.queue(1, "src").unwrap();
    assert!(ch.get(&q, false, t0));
    ch.nack(1, false, false, t0).unwrap(); // reject: dead-letter it
    let log = journal.log();
    assert_eq!(
        log.last().map(String::as_str),
        Some("publish 2 to [2]"),
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.starts_with("remove")),
        "the source's removal waits for the copy: {log:?}"
    );

    // The copy becomes durable; the next tick journals the removal.
    journal.release();
    broker.run_timers(t0);
    assert_eq!(
        journal.log().last().map(String::as_str),
        Some("remove [1] from 1")
    );
    let stored = journal.inner.messages.lock();
    assert!(stored.get(&1).is_none_or(BTreeMap::is_empty), "left src");
    assert_eq!(stored.get(&2).map(BTreeMap::len), Some(1), "is in dead");
}

/// A journal may give one queue's messages both ways, some with bodies
/// (`Recovered::messages`) and some as ids and sizes (`Recovered::paged`):
/// they go back as one queue, in publish order.
#[test]
fn a_queue_given_back_both_ways_is_restored_in_order() {
    let (journal, _broker, v, t0) = journaled_broker();
    durable_queue(&v, "mixed", FieldTable::default(), t0);
    for i in 0..40 {
        let m = msg("mixed", &format!("m{i}"), true);
        v.publish("amq.direct", &m, t0, &mut || Box::new(|r| r.unwrap()))
            .unwrap();
    }
    let mut r = recovered(&journal, Bodies::OnDisk);
    let (&qid, list) = r.paged.iter_mut().next().expect("the queue's list");
    // Every other message moves to the list with bodies, as a journal
    // that kept some bodies in memory would give them.
    let bodies = journal.messages.lock()[&qid].clone();
    let (odd, even): (Vec<_>, Vec<_>) = list.drain(..).partition(|(id, _)| id % 2 == 1);
    *list = even;
    r.messages.insert(
        qid,
        odd.iter()
            .map(|(id, _)| (*id, berth_broker::StoredBody::Payload(bodies[id].clone())))
            .collect(),
    );
    let (next_msg, next_queue) = r.next_ids();
    let broker2 = Broker::with_journal(["/"], journal.clone(), next_msg, next_queue);
    let report = broker2.restore(r, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.messages, 40);
    let got = drain(&broker2, "mixed", t0);
    let want: Vec<(bool, Vec<u8>)> = (0..40)
        .map(|i| (true, format!("m{i}").into_bytes()))
        .collect();
    assert_eq!(got, want);
}
