//! Delayed retry on a queue (`x-delayed-retry-*`, docs/DELAYED.md),
//! measured against the broker's injected clock, never wall time: each
//! return waits its backoff (linear, constant, exponential, capped) before
//! it is ready again, is counted in `x-delivery-count`, and past the
//! delivery limit (20 by default with delayed retry) is dead-lettered with
//! reason `delivery_limit`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::args::as_string;
use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{Durability, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::policy::{ApplyTo, Policy, PolicyKind};
use berth_broker::queue::{Queue, QueuedMessage};
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn int(n: i64) -> AMQPValue {
    AMQPValue::LongLongInt(n)
}

struct World {
    clock: Arc<ManualClock>,
    broker: Arc<Broker>,
    v: Arc<VHost>,
}

impl World {
    fn new() -> Self {
        let journal = Arc::new(MemoryJournal::default());
        let clock = Arc::new(ManualClock::new(Instant::now(), 1_700_000_000));
        let dur = Durability::new(journal, 1, 1);
        let broker = Broker::with_parts(["/"], dur, clock.clone() as Arc<dyn Clock>);
        let v = broker.vhost("/").unwrap();
        Self { clock, broker, v }
    }

    fn queue(&self, name: &str, args: &[(&str, AMQPValue)]) -> Arc<Queue> {
        let d = QueueDeclare {
            durable: true,
            arguments: table(args),
            ..Default::default()
        };
        self.v.declare_queue(1, name, &d, self.clock.now()).unwrap();
        self.v.queue(1, name).unwrap()
    }

    fn publish(&self, queue: &str, body: &str) {
        let p = AMQPProperties::default().with_delivery_mode(2);
        let m = Message::new(
            String::new(),
            queue.into(),
            encode_properties(&p),
            Bytes::from(body.to_owned()),
        )
        .unwrap();
        self.v
            .publish("", &m, self.clock.now(), &mut || Box::new(|_| {}))
            .unwrap();
    }

    fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.broker.run_timers(self.clock.now());
    }

    /// The waits (ms) between each of `returns` nacks with requeue and the
    /// message being ready again, stepping the clock 1 ms at a time.
    fn backoffs(&self, q: &Arc<Queue>, returns: usize) -> Vec<u64> {
        self.backoffs_holding(q, returns).0
    }

    /// [`World::backoffs`], and the message, delivered again and unacked.
    fn backoffs_holding(&self, q: &Arc<Queue>, returns: usize) -> (Vec<u64>, QueuedMessage) {
        let mut waits = Vec::new();
        let mut m = q.get(false, self.clock.now()).expect("a message").0;
        for _ in 0..returns {
            q.requeue(vec![m], self.clock.now(), None);
            let s = q.stats();
            assert_eq!(
                (s.ready, s.unacked, s.retrying),
                (0, 0, 1),
                "waiting, counted"
            );
            let mut waited = 0;
            m = loop {
                if let Some((m, _)) = q.get(false, self.clock.now()) {
                    break m;
                }
                self.advance_ms(1);
                waited += 1;
                assert!(waited < 100_000, "never came back");
            };
            waits.push(waited);
        }
        (waits, m)
    }
}

#[test]
fn backoff_sequences_are_linear_constant_exponential_and_capped() {
    let w = World::new();
    type Case<'a> = (&'a str, &'a [(&'a str, AMQPValue)], [u64; 5]);
    let cases: [Case; 4] = [
        (
            "linear",
            &[("x-delayed-retry-min", int(10))],
            [10, 20, 30, 40, 50],
        ),
        (
            "constant",
            &[
                ("x-delayed-retry-min", int(10)),
                ("x-delayed-retry-multiplier", int(1)),
            ],
            [10; 5],
        ),
        (
            "exponential",
            &[
                ("x-delayed-retry-min", int(10)),
                ("x-delayed-retry-multiplier", int(2)),
            ],
            [10, 20, 40, 80, 160],
        ),
        (
            "capped",
            &[
                ("x-delayed-retry-min", int(10)),
                ("x-delayed-retry-multiplier", int(3)),
                ("x-delayed-retry-max", int(100)),
            ],
            [10, 30, 90, 100, 100],
        ),
    ];
    for (name, args, expected) in cases {
        let q = w.queue(name, args);
        w.publish(name, "m");
        assert_eq!(w.backoffs(&q, 5), expected, "{name}");
    }
}

#[test]
fn a_waiting_message_carries_its_count_and_goes_back_to_its_place() {
    let w = World::new();
    let q = w.queue("q", &[("x-delayed-retry-min", int(50))]);
    for b in ["first", "second"] {
        w.publish("q", b);
    }
    let first = q.get(false, w.clock.now()).unwrap().0;
    q.requeue(vec![first], w.clock.now(), None);
    let got = q.get(false, w.clock.now()).unwrap().0;
    assert_eq!(
        &got.msg.body[..],
        b"second",
        "a waiting message holds nothing back"
    );
    q.requeue(vec![got], w.clock.now(), None);
    w.advance_ms(50);
    let again = q.get(true, w.clock.now()).unwrap().0;
    assert_eq!(&again.msg.body[..], b"first", "back in publish order");
    assert!(again.redelivered);
    let h = again.msg.headers().unwrap();
    assert_eq!(h.inner().get("x-delivery-count"), Some(&int(1)));
}

#[test]
fn past_the_delivery_limit_a_message_is_dead_lettered_with_reason_delivery_limit() {
    let w = World::new();
    let dlq = w.queue("dlq", &[]);
    let q = w.queue(
        "q",
        &[
            ("x-delayed-retry-min", int(1)),
            ("x-delayed-retry-multiplier", int(1)),
            ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
            (
                "x-dead-letter-routing-key",
                AMQPValue::LongString("dlq".into()),
            ),
        ],
    );
    w.publish("q", "m");
    // No x-delivery-limit: 20 by default with delayed retry.
    let (waits, m) = w.backoffs_holding(&q, 20);
    assert_eq!(waits, [1; 20]);
    assert_eq!(
        m.msg.headers().unwrap().inner().get("x-delivery-count"),
        Some(&int(20))
    );
    q.requeue(vec![m], w.clock.now(), None); // the 21st return
    let s = q.stats();
    assert_eq!((s.ready, s.unacked, s.retrying), (0, 0, 0));
    let dead = dlq.get(true, w.clock.now()).expect("dead-lettered").0;
    let h = dead.msg.headers().unwrap();
    let deaths = match h.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        other => panic!("x-death: {other:?}"),
    };
    let AMQPValue::FieldTable(first) = &deaths[0] else {
        panic!("x-death entry")
    };
    let reason = first.inner().get("reason").and_then(as_string);
    assert_eq!(reason.as_deref(), Some("delivery_limit"));
}

#[test]
fn delayed_retry_arguments_are_checked() {
    let w = World::new();
    let declare = |args: &[(&str, AMQPValue)]| {
        let d = QueueDeclare {
            arguments: table(args),
            ..Default::default()
        };
        w.v.declare_queue(1, "bad", &d, w.clock.now())
    };
    for args in [
        &[("x-delayed-retry-min", int(0))][..],
        &[("x-delayed-retry-min", int(-1))],
        &[("x-delayed-retry-min", AMQPValue::LongString("10".into()))],
        &[
            ("x-delayed-retry-min", int(10)),
            ("x-delayed-retry-multiplier", int(0)),
        ],
        &[
            ("x-delayed-retry-min", int(10)),
            ("x-delayed-retry-max", int(5)),
        ],
        &[("x-delayed-retry-max", int(5))],
    ] {
        let e = declare(args).unwrap_err();
        assert_eq!(e.reply_code, 406, "{args:?}: {}", e.text);
    }
    declare(&[("x-delayed-retry-min", int(10))]).unwrap();
    let e = declare(&[("x-delayed-retry-min", int(20))]).unwrap_err();
    assert_eq!(e.reply_code, 406, "inequivalent: {}", e.text);
}

#[test]
fn a_policy_enables_delayed_retry() {
    let w = World::new();
    let q = w.queue("retry.q", &[]);
    let p = Policy::new(
        PolicyKind::Policy,
        "/",
        "retry",
        "^retry\\.",
        ApplyTo::Queues,
        0,
        table(&[
            ("delayed-retry-min", int(5)),
            ("delayed-retry-multiplier", int(2)),
        ]),
    )
    .unwrap();
    w.broker.set_policy(p).unwrap();
    w.publish("retry.q", "m");
    assert_eq!(w.backoffs(&q, 3), [5, 10, 20]);
    let e = Policy::new(
        PolicyKind::Operator,
        "/",
        "op",
        ".*",
        ApplyTo::Queues,
        0,
        table(&[("delayed-retry-min", int(5))]),
    );
    assert!(e.is_err(), "not an operator policy key");
}

/// Issue 48: on a queue with delayed retry the broker owns
/// `x-delivery-count` (the number of returns); one a client put in its
/// publish used to reach consumers as if the broker had counted it.
#[test]
fn a_client_supplied_delivery_count_is_stripped_where_delayed_retry_owns_it() {
    let w = World::new();
    let q = w.queue("q", &[("x-delayed-retry-min", int(10))]);
    let plain = w.queue("plain", &[]);
    for queue in ["q", "plain"] {
        let p = AMQPProperties::default()
            .with_delivery_mode(2)
            .with_headers(table(&[("x-delivery-count", int(7)), ("app", int(1))]));
        let m = Message::new(
            String::new(),
            queue.into(),
            encode_properties(&p),
            "m".into(),
        );
        w.v.publish("", &m.unwrap(), w.clock.now(), &mut || Box::new(|_| {}))
            .unwrap();
    }
    let count = |m: &QueuedMessage| {
        let h = m.msg.headers().unwrap();
        assert_eq!(h.inner().get("app"), Some(&int(1)), "other headers kept");
        h.inner().get("x-delivery-count").cloned()
    };
    let first = q.get(false, w.clock.now()).unwrap().0;
    assert_eq!(
        count(&first),
        None,
        "the client's count is not the broker's"
    );
    q.requeue(vec![first], w.clock.now(), None);
    w.advance_ms(10);
    let again = q.get(false, w.clock.now()).unwrap().0;
    assert_eq!(count(&again), Some(int(1)), "the broker's count of returns");
    let other = plain.get(false, w.clock.now()).unwrap().0;
    assert_eq!(
        count(&other),
        Some(int(7)),
        "without delayed retry: untouched"
    );
}
