//! A vhost's totals, kept as its queues change (`totals.rs`), equal a walk
//! over its queues after every operation of a seeded random sequence:
//! publishes (some expiring, some over a length limit, some dead-lettered),
//! consumers with prefetch, acks, requeues, rejects, gets, purges, queue
//! deletes and redeclares, timers, channel closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::clock::ManualClock;
use berth_broker::durable::{Durability, NoJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;

/// Remembers the delivery tags it was given, for later acks.
#[derive(Default)]
struct Tags(Mutex<Vec<u64>>);

impl Outlet for Tags {
    fn deliver(&self, _: u16, _: &str, delivery_tag: u64, _: bool, _: &Message) {
        self.0.lock().push(delivery_tag);
    }
    fn get_ok(&self, _: u16, delivery_tag: u64, _: bool, _: &Message, _: u32) {
        self.0.lock().push(delivery_tag);
    }
    fn consumer_cancelled(&self, _: u16, _: &str) {}
    fn is_congested(&self) -> bool {
        false
    }
}

const QUEUES: [&str; 4] = ["plain", "ttl", "limited", "dead"];

fn arguments(queue: &str) -> FieldTable {
    let mut t = FieldTable::default();
    let mut put = |k: &str, v: AMQPValue| {
        t.insert(k.into(), v);
    };
    match queue {
        "ttl" => put("x-message-ttl", AMQPValue::LongInt(100)),
        "limited" => {
            put("x-max-length", AMQPValue::LongInt(3));
            put("x-dead-letter-exchange", AMQPValue::LongString("".into()));
            put(
                "x-dead-letter-routing-key",
                AMQPValue::LongString("dead".into()),
            );
        }
        _ => {}
    }
    t
}

#[derive(Debug, Clone)]
enum Op {
    Publish(usize, usize),
    Consume(usize, u16),
    Cancel(usize),
    Ack(usize, bool),
    Nack(usize, bool, bool),
    Get(usize, bool),
    Purge(usize),
    Delete(usize),
    Declare(usize),
    Tick(u64),
    CloseChannel,
}

fn op() -> impl Strategy<Value = Op> {
    let q = 0..QUEUES.len();
    prop_oneof![
        4 => (q.clone(), 1..200usize).prop_map(|(q, n)| Op::Publish(q, n)),
        1 => (q.clone(), 0..4u16).prop_map(|(q, p)| Op::Consume(q, p)),
        1 => (0..4usize).prop_map(Op::Cancel),
        2 => (0..8usize, any::<bool>()).prop_map(|(i, m)| Op::Ack(i, m)),
        1 => (0..8usize, any::<bool>(), any::<bool>()).prop_map(|(i, m, r)| Op::Nack(i, m, r)),
        1 => (q.clone(), any::<bool>()).prop_map(|(q, a)| Op::Get(q, a)),
        1 => q.clone().prop_map(Op::Purge),
        1 => q.clone().prop_map(Op::Delete),
        1 => q.prop_map(Op::Declare),
        1 => (0..300u64).prop_map(Op::Tick),
        1 => Just(Op::CloseChannel),
    ]
}

struct World {
    broker: Arc<Broker>,
    vhost: Arc<VHost>,
    clock: Arc<ManualClock>,
    tags: Arc<Tags>,
    ch: Arc<Channel>,
    /// Consumer tags on `ch`.
    consumers: Vec<String>,
    next_channel: u16,
}

fn session(vhost: Arc<VHost>, tags: &Arc<Tags>) -> Arc<Session> {
    Arc::new(Session {
        connection_id: 1,
        vhost,
        outlet: Arc::clone(tags) as Arc<dyn Outlet>,
        cancel_notify: true,
        consumer_timeout_ms: None,
        user: Arc::from("guest"),
        events: None,
    })
}

impl World {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(Instant::now(), 1_700_000_000));
        let broker = Broker::with_parts(
            ["/"],
            Durability::new(Arc::new(NoJournal), 1, 1),
            Arc::clone(&clock) as Arc<dyn berth_broker::clock::Clock>,
        );
        let vhost = broker.vhost("/").expect("default vhost");
        let tags = Arc::new(Tags::default());
        let ch = Channel::new(1, session(Arc::clone(&vhost), &tags));
        let w = Self {
            broker,
            vhost,
            clock,
            tags,
            ch,
            consumers: Vec::new(),
            next_channel: 1,
        };
        for q in 0..QUEUES.len() {
            w.declare(q);
        }
        w
    }

    fn now(&self) -> Instant {
        self.broker.now()
    }

    fn declare(&self, q: usize) {
        let d = QueueDeclare {
            durable: true,
            arguments: arguments(QUEUES[q]),
            ..Default::default()
        };
        self.vhost
            .declare_queue(1, QUEUES[q], &d, self.now())
            .expect("declare");
    }

    fn tag(&self, i: usize) -> Option<u64> {
        let tags = self.tags.0.lock();
        (!tags.is_empty()).then(|| tags[i % tags.len()])
    }

    fn apply(&mut self, op: &Op) {
        let now = self.now();
        match *op {
            Op::Publish(q, size) => {
                let msg = Message::new(
                    String::new(),
                    QUEUES[q].into(),
                    encode_properties(&AMQPProperties::default()),
                    Bytes::from(vec![b'x'; size]),
                )
                .expect("message");
                let _ = self
                    .ch
                    .publish("", msg, false, now, &mut || Box::new(|_| {}));
            }
            Op::Consume(q, prefetch) => {
                if let Ok(queue) = self.vhost.queue(1, QUEUES[q]) {
                    self.ch.qos(prefetch, false, now);
                    if let Ok(tag) = self.ch.consume(queue, "", false, false, now, |_| {}) {
                        self.consumers.push(tag);
                    }
                }
            }
            Op::Cancel(i) => {
                if !self.consumers.is_empty() {
                    let tag = self.consumers.remove(i % self.consumers.len());
                    self.ch.cancel(&tag, now);
                }
            }
            Op::Ack(i, multiple) => {
                if let Some(t) = self.tag(i) {
                    let _ = self.ch.ack(t, multiple, now);
                }
            }
            Op::Nack(i, multiple, requeue) => {
                if let Some(t) = self.tag(i) {
                    let _ = self.ch.nack(t, multiple, requeue, now);
                }
            }
            Op::Get(q, no_ack) => {
                if let Ok(queue) = self.vhost.queue(1, QUEUES[q]) {
                    self.ch.get(&queue, no_ack, now);
                }
            }
            Op::Purge(q) => {
                let _ = self.vhost.purge_queue(1, QUEUES[q], now);
            }
            Op::Delete(q) => {
                let _ = self.vhost.delete_queue(1, QUEUES[q], false, false);
            }
            Op::Declare(q) => self.declare(q),
            Op::Tick(ms) => {
                self.clock.advance(Duration::from_millis(ms));
                self.broker.run_timers(self.now());
            }
            Op::CloseChannel => {
                self.ch.close(now);
                self.tags.0.lock().clear();
                self.consumers.clear();
                self.next_channel += 1;
                self.ch = Channel::new(
                    self.next_channel,
                    session(Arc::clone(&self.vhost), &self.tags),
                );
            }
        }
    }

    /// (queues, ready, ready bytes, unacked, consumers) by a walk over the
    /// queues.
    fn walked(&self) -> (u64, u64, u64, u64, u64) {
        let mut w = (0, 0, 0, 0, 0);
        for q in self.vhost.queues() {
            let s = q.stats();
            w.0 += 1;
            w.1 += s.ready as u64;
            w.2 += s.ready_bytes;
            w.3 += s.unacked as u64;
            w.4 += s.consumers as u64;
        }
        w
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn totals_equal_a_walk_over_the_queues_after_every_operation(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        let mut w = World::new();
        let mut published = 0;
        for (i, op) in ops.iter().enumerate() {
            w.apply(op);
            let t = w.vhost.totals();
            let walked = w.walked();
            prop_assert_eq!(
                (t.queues, t.ready, t.ready_bytes, t.unacked, t.consumers),
                walked,
                "after op {} ({:?})", i, op
            );
            prop_assert_eq!(t.messages, walked.1 + walked.3);
            // Counters only grow, deleted queues' counts included.
            prop_assert!(t.counters.published >= published);
            published = t.counters.published;
        }
    }
}
