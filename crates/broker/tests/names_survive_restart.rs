//! Issue 16: whatever names and keys an entrance of the broker accepts —
//! exchange and queue names, binding and publish routing keys,
//! `x-dead-letter-exchange` and `x-dead-letter-routing-key` — survive a
//! restart unchanged, and whatever it refuses gets an error, never a
//! panic. The restart is the journal's content read back by a new broker
//! (`MemoryJournal` stands for a perfect store).

use std::sync::Arc;
use std::time::Instant;

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::durable::{Done, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::{AmqpResult, Broker};
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;

mod common;
use common::{recovered, Bodies};

/// (exchange, routing key, body) of every message handed out.
#[derive(Default)]
struct Sink(Mutex<Vec<(String, String, Vec<u8>)>>);

impl Outlet for Sink {
    fn deliver(&self, _: u16, _: &str, _: u64, _: bool, m: &Message) {
        self.note(m);
    }
    fn get_ok(&self, _: u16, _: u64, _: bool, m: &Message, _: u32) {
        self.note(m);
    }
    fn consumer_cancelled(&self, _: u16, _: &str) {}
    fn is_congested(&self) -> bool {
        false
    }
}

impl Sink {
    fn note(&self, m: &Message) {
        self.0
            .lock()
            .push((m.exchange.clone(), m.routing_key.clone(), m.body.to_vec()));
    }
}

fn channel(broker: &Broker, out: &Arc<Sink>) -> Arc<Channel> {
    Channel::new(
        1,
        Arc::new(Session {
            connection_id: 1,
            vhost: broker.vhost("/").unwrap(),
            outlet: Arc::clone(out) as Arc<dyn Outlet>,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: Arc::from("guest"),
            events: None,
        }),
    )
}

/// Names as a user might type them, and as an attacker might: zero
/// bytes, multi-byte UTF-8, and lengths on both sides of 255 bytes.
fn any_name() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        8 => Just('a'),
        2 => Just('\0'),
        2 => Just('é'),
        2 => Just('€'),
        2 => Just('𝄞'),
        1 => Just('.'),
        1 => any::<char>(),
    ];
    prop_oneof![
        proptest::collection::vec(ch.clone(), 1..20),
        proptest::collection::vec(ch.clone(), 60..130),
        // Exactly at the limit, and one byte past it.
        (0usize..2).prop_map(|extra| vec!['a'; 255 + extra]),
        // A multi-byte character straddling byte 255.
        (0usize..4).prop_map(|k| {
            let mut v = vec!['a'; 253 + k];
            v.push('€');
            v
        }),
    ]
    .prop_map(|v| v.into_iter().collect())
}

fn fits(s: &str) -> bool {
    s.len() <= 255
}

/// An entrance refused `what`: with a precise AMQP error, which names
/// the limit when the name was too long.
fn refused<T: std::fmt::Debug>(r: AmqpResult<T>, what: &str, name: &str) {
    let e = r.expect_err(what);
    if !fits(name) {
        assert!(
            e.reply_text().contains("255"),
            "{what}: the error says why: {e}"
        );
    }
}

fn persistent(exchange: &str, key: &str, body: &str) -> AmqpResult<Arc<Message>> {
    Message::new(
        exchange.to_owned(),
        key.to_owned(),
        encode_properties(&AMQPProperties::default().with_delivery_mode(2)),
        Bytes::from(body.to_owned()),
    )
}

fn publish(v: &VHost, m: &Arc<Message>, t0: Instant, exchange: &str) -> usize {
    let mut done = || -> Done { Box::new(|r| r.expect("journaled")) };
    v.publish(exchange, m, t0, &mut done).unwrap().queues
}

/// What the broker must hold again after a restart.
#[derive(Default)]
struct Expect {
    exchange: bool,
    queue: Option<String>,
    dlq_args: Option<FieldTable>,
    /// (exchange, routing key, body) in the queue, in order.
    messages: Vec<(String, String, Vec<u8>)>,
}

fn entrances(v: &VHost, broker: &Broker, x: &str, q: &str, rk: &str, t0: Instant) -> Expect {
    let mut want = Expect::default();
    let durable_x = ExchangeDeclare {
        kind: "direct".into(),
        durable: true,
        ..Default::default()
    };
    let r = v.declare_exchange(x, &durable_x);
    if fits(x) && !x.starts_with("amq.") {
        r.unwrap();
        want.exchange = true;
    } else {
        refused(r, "exchange.declare", x);
    }
    let durable_q = QueueDeclare {
        durable: true,
        ..Default::default()
    };
    let r = v.declare_queue(1, q, &durable_q, t0);
    let Ok((qname, _, _)) = r else {
        assert!(!fits(q) || q.starts_with("amq."), "refused {q:?}: {r:?}");
        refused(r, "queue.declare", q);
        return want;
    };
    assert!(fits(q), "queue.declare accepted a {}-byte name", q.len());
    want.queue = Some(qname.clone());

    // Through the default exchange: the queue's name is the routing key.
    let m = persistent("", &qname, "by-name").unwrap();
    assert_eq!(publish(v, &m, t0, ""), 1);
    want.messages
        .push((String::new(), qname.clone(), b"by-name".to_vec()));

    let r = v.bind_queue(1, &qname, x, rk, &FieldTable::default());
    let bound = want.exchange && fits(rk);
    if bound {
        r.unwrap();
    } else if want.exchange {
        refused(r, "queue.bind", rk);
    } else {
        assert_eq!(r.expect_err("no exchange to bind to").reply_code, 404);
    }
    match persistent(x, rk, "by-key") {
        Ok(m) => {
            assert!(fits(x) && fits(rk), "basic.publish accepted {x:?}/{rk:?}");
            if want.exchange {
                assert_eq!(publish(v, &m, t0, x), usize::from(bound));
                if bound {
                    want.messages
                        .push((x.to_owned(), rk.to_owned(), b"by-key".to_vec()));
                }
            }
        }
        Err(e) => {
            assert!(!fits(x) || !fits(rk), "refused {x:?}/{rk:?}: {e}");
            assert!(e.reply_text().contains("255"), "says why: {e}");
        }
    }

    // A queue that dead-letters to `x` with routing key `rk`.
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(x.as_bytes().to_vec().into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(rk.as_bytes().to_vec().into()),
    );
    let dl = QueueDeclare {
        durable: true,
        arguments: args.clone(),
        ..Default::default()
    };
    let r = v.declare_queue(1, "dl-source", &dl, t0);
    if !(fits(x) && fits(rk)) {
        refused(
            r,
            "queue.declare x-dead-letter-*",
            if fits(x) { rk } else { x },
        );
        return want;
    }
    r.unwrap();
    want.dlq_args = Some(args);
    let m = persistent("", "dl-source", "dead").unwrap();
    assert_eq!(publish(v, &m, t0, ""), 1);
    let out = Arc::new(Sink::default());
    let ch = channel(broker, &out);
    assert!(ch.get(&v.queue(1, "dl-source").unwrap(), false, t0));
    ch.nack(1, false, false, t0).unwrap();
    if bound {
        want.messages
            .push((x.to_owned(), rk.to_owned(), b"dead".to_vec()));
    }
    want
}

fn check(x: &str, q: &str, rk: &str) {
    let t0 = Instant::now();
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let want = entrances(&v, &broker, x, q, rk, t0);

    // "Crash": a new broker from what the journal holds.
    let r = recovered(&journal, Bodies::InMemory);
    let (next_msg, next_queue) = r.next_ids();
    let stored_ids: Vec<u64> = v.queues().iter().filter_map(|q| q.store_id).collect();
    assert!(
        stored_ids.iter().all(|id| *id < next_queue),
        "a new queue would reuse a stored id: {stored_ids:?} vs {next_queue}"
    );
    let broker2 = Broker::with_journal(["/"], journal.clone(), next_msg, next_queue);
    let report = broker2.restore(r, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let v2 = broker2.vhost("/").unwrap();
    assert_eq!(v2.exchange(x).is_ok(), want.exchange, "exchange {x:?}");
    if let Some(args) = &want.dlq_args {
        assert_eq!(&v2.queue(1, "dl-source").unwrap().arguments, args);
    }
    let Some(qname) = want.queue else {
        return;
    };
    let out = Arc::new(Sink::default());
    let ch = channel(&broker2, &out);
    let q2 = v2.queue(1, &qname).expect("the queue came back");
    while ch.get(&q2, true, t0) {}
    assert_eq!(*out.0.lock(), want.messages, "messages of {qname:?}");
}

#[test]
fn a_queue_with_a_zero_byte_in_its_name_keeps_its_messages_across_a_restart() {
    check("ex", "odd\0name", "key");
}

#[test]
fn names_one_byte_past_a_shortstr_are_refused_not_cut() {
    let long = "a".repeat(256);
    check(&long, "q", "k");
    check("ex", "q", &long);
    check("ex", &long, "k");
    // 253 bytes then a 3-byte character: cut at 255 it is not UTF-8.
    let straddle = format!("{}€", "a".repeat(253));
    check("ex", "q", &straddle);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn whatever_an_entrance_accepts_survives_a_restart_unchanged(
        x in any_name(),
        q in any_name(),
        rk in any_name(),
    ) {
        check(&x, &q, &rk);
    }
}
