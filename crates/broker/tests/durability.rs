//! What the broker writes to its journal, checked through an in-memory
//! journal that stands for a perfect store: whatever it holds is what a
//! restart gets back.

use std::sync::Arc;
use std::time::Instant;

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::durable::{Done, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare};
use berth_broker::{Broker, Recovered};
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

#[derive(Default)]
struct Sink(Mutex<Vec<(u64, bool, Vec<u8>)>>);
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

fn recovered(j: &MemoryJournal) -> Recovered {
    Recovered {
        meta: j
            .meta
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        messages: j
            .messages
            .lock()
            .iter()
            .map(|(q, m)| (*q, m.iter().map(|(id, p)| (*id, p.clone())).collect()))
            .collect(),
    }
}

#[test]
fn persistent_messages_in_durable_queues_survive_a_restart_and_acked_ones_do_not() {
    let journal = Arc::new(MemoryJournal::default());
    let t0 = Instant::now();
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
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
    let r = recovered(&journal);
    let (next_msg, next_queue) = r.next_ids();
    let broker2 = Broker::with_journal(["/"], journal.clone(), next_msg, next_queue);
    let report = broker2.restore(r, t0);
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
    let got: Vec<(bool, Vec<u8>)> = out2
        .0
        .lock()
        .iter()
        .map(|(_, r, b)| (*r, b.clone()))
        .collect();
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
    let journal = Arc::new(MemoryJournal::default());
    let t0 = Instant::now();
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
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
    let journal = Arc::new(MemoryJournal::default());
    let t0 = Instant::now();
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
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
