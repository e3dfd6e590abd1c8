//! Deterministic tests of the broker's rules, without a network: a recording
//! outlet stands in for the connection, and time is passed in explicitly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::clock::ManualClock;
use berth_broker::durable::{Durability, NoJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::{decode_properties, encode_properties};
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

#[derive(Debug, Clone, PartialEq)]
struct Delivered {
    tag: u64,
    consumer: String,
    redelivered: bool,
    body: Vec<u8>,
    headers: Option<FieldTable>,
}

#[derive(Default)]
struct Recorder {
    got: Mutex<Vec<Delivered>>,
    cancelled: Mutex<Vec<String>>,
    congested: std::sync::atomic::AtomicBool,
}

impl Outlet for Recorder {
    fn deliver(
        &self,
        _ch: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
    ) {
        self.got.lock().push(Delivered {
            tag: delivery_tag,
            consumer: consumer_tag.into(),
            redelivered,
            body: msg.body.to_vec(),
            headers: decode_properties(&msg.properties)
                .unwrap()
                .headers()
                .clone(),
        });
    }
    fn get_ok(&self, _ch: u16, delivery_tag: u64, redelivered: bool, msg: &Message, _count: u32) {
        self.got.lock().push(Delivered {
            tag: delivery_tag,
            consumer: String::new(),
            redelivered,
            body: msg.body.to_vec(),
            headers: None,
        });
    }
    fn consumer_cancelled(&self, _ch: u16, consumer_tag: &str) {
        self.cancelled.lock().push(consumer_tag.into());
    }
    fn is_congested(&self) -> bool {
        self.congested.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Recorder {
    fn bodies(&self) -> Vec<String> {
        self.got
            .lock()
            .iter()
            .map(|d| String::from_utf8(d.body.clone()).unwrap())
            .collect()
    }
    fn take(&self) -> Vec<Delivered> {
        std::mem::take(&mut *self.got.lock())
    }
}

struct World {
    broker: Arc<Broker>,
    vhost: Arc<VHost>,
    out: Arc<Recorder>,
    ch: Arc<Channel>,
    t0: Instant,
}

/// Wall-clock seconds the test clock starts at (what `x-death` says).
const UNIX_START_S: u64 = 1_700_000_000;

fn world() -> World {
    let t0 = Instant::now();
    let clock = Arc::new(ManualClock::new(t0, UNIX_START_S));
    let broker = Broker::with_parts(["/"], Durability::new(Arc::new(NoJournal), 1, 1), clock);
    let vhost = broker.vhost("/").unwrap();
    let out = Arc::new(Recorder::default());
    let session = Arc::new(Session {
        connection_id: 1,
        vhost: Arc::clone(&vhost),
        outlet: Arc::clone(&out) as Arc<dyn Outlet>,
        cancel_notify: true,
        consumer_timeout_ms: None,
        user: std::sync::Arc::from("guest"),
        events: None,
    });
    World {
        broker,
        vhost,
        out,
        ch: Channel::new(1, session),
        t0,
    }
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn no_wait() -> berth_broker::durable::Done {
    Box::new(|r| r.unwrap())
}

fn msg(exchange: &str, key: &str, body: &str, props: AMQPProperties) -> Arc<Message> {
    Message::new(
        exchange.into(),
        key.into(),
        encode_properties(&props),
        Bytes::from(body.to_owned()),
    )
    .unwrap()
}

impl World {
    fn declare(&self, name: &str, args: FieldTable) {
        self.vhost
            .declare_queue(
                1,
                name,
                &QueueDeclare {
                    arguments: args,
                    ..Default::default()
                },
                self.t0,
            )
            .unwrap();
    }
    fn publish(&self, queue: &str, body: &str) -> berth_broker::vhost::PublishResult {
        self.publish_with(queue, body, AMQPProperties::default())
    }
    fn publish_with(
        &self,
        queue: &str,
        body: &str,
        props: AMQPProperties,
    ) -> berth_broker::vhost::PublishResult {
        self.vhost
            .publish("", &msg("", queue, body, props), self.t0, &mut no_wait)
            .unwrap()
    }
    fn consume(&self, queue: &str, tag: &str, no_ack: bool) {
        let q = self.vhost.queue(1, queue).unwrap();
        self.ch
            .consume(q, tag, no_ack, false, self.t0, |_| {})
            .unwrap();
    }
    fn ready(&self, queue: &str) -> usize {
        self.vhost.queue(1, queue).unwrap().stats().ready
    }
}

#[test]
fn per_consumer_prefetch_limits_unacked_deliveries() {
    let w = world();
    w.declare("q", FieldTable::default());
    for i in 0..5 {
        w.publish("q", &format!("m{i}"));
    }
    w.ch.qos(2, false, w.t0);
    w.consume("q", "c1", false);
    assert_eq!(w.out.bodies(), ["m0", "m1"]);
    w.ch.ack(1, false, w.t0).unwrap();
    assert_eq!(w.out.bodies(), ["m0", "m1", "m2"]);
    w.ch.ack(3, true, w.t0).unwrap();
    assert_eq!(w.out.bodies(), ["m0", "m1", "m2", "m3", "m4"]);
}

#[test]
fn global_prefetch_is_shared_by_the_channels_consumers() {
    let w = world();
    w.declare("a", FieldTable::default());
    w.declare("b", FieldTable::default());
    for i in 0..3 {
        w.publish("a", &format!("a{i}"));
        w.publish("b", &format!("b{i}"));
    }
    w.ch.qos(3, true, w.t0);
    w.consume("a", "ca", false);
    w.consume("b", "cb", false);
    assert_eq!(
        w.out.take().len(),
        3,
        "channel limit of 3 across both consumers"
    );
}

#[test]
fn requeued_message_returns_to_its_place_flagged_redelivered() {
    let w = world();
    w.declare("q", FieldTable::default());
    for i in 0..3 {
        w.publish("q", &format!("m{i}"));
    }
    let q = w.vhost.queue(1, "q").unwrap();
    assert!(w.ch.get(&q, false, w.t0)); // m0, tag 1
    assert!(w.ch.get(&q, false, w.t0)); // m1, tag 2
    w.ch.nack(1, false, true, w.t0).unwrap();
    w.out.take();
    assert!(w.ch.get(&q, true, w.t0));
    let d = w.out.take();
    assert_eq!((d[0].body.as_slice(), d[0].redelivered), (&b"m0"[..], true));
}

#[test]
fn unknown_delivery_tag_is_precondition_failed() {
    let w = world();
    assert_eq!(w.ch.ack(99, false, w.t0).unwrap_err().reply_code, 406);
}

#[test]
fn closing_a_channel_requeues_its_unacked_messages() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.publish("q", "m0");
    w.consume("q", "c", false);
    assert_eq!(w.ready("q"), 0);
    w.ch.close(w.t0);
    assert_eq!(w.ready("q"), 1);
}

#[test]
fn expired_messages_are_dead_lettered_with_x_death() {
    let w = world();
    w.declare("dead", FieldTable::default());
    w.declare(
        "q",
        table(&[
            ("x-message-ttl", AMQPValue::LongInt(100)),
            ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
            (
                "x-dead-letter-routing-key",
                AMQPValue::LongString("dead".into()),
            ),
        ]),
    );
    w.publish("q", "m0");
    w.broker.run_timers(w.t0 + Duration::from_millis(50));
    assert_eq!((w.ready("q"), w.ready("dead")), (1, 0), "not yet expired");
    w.broker.run_timers(w.t0 + Duration::from_millis(150));
    assert_eq!((w.ready("q"), w.ready("dead")), (0, 1));
    w.consume("dead", "c", true);
    let d = w.out.take();
    let headers = d[0].headers.clone().unwrap();
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        panic!("no x-death: {headers:?}")
    };
    let AMQPValue::FieldTable(first) = &deaths.as_slice()[0] else {
        panic!()
    };
    assert_eq!(
        first.inner().get("reason"),
        Some(&AMQPValue::LongString("expired".into()))
    );
    assert_eq!(
        first.inner().get("queue"),
        Some(&AMQPValue::LongString("q".into()))
    );
    assert_eq!(first.inner().get("count"), Some(&AMQPValue::LongLongInt(1)));
    assert_eq!(
        first.inner().get("time"),
        Some(&AMQPValue::Timestamp(UNIX_START_S)),
        "x-death's time comes from the broker's clock"
    );
}

#[test]
fn max_length_drop_head_drops_the_oldest() {
    let w = world();
    w.declare("q", table(&[("x-max-length", AMQPValue::LongInt(2))]));
    for i in 0..4 {
        assert_eq!(w.publish("q", &format!("m{i}")).queues, 1);
    }
    w.consume("q", "c", true);
    assert_eq!(w.out.bodies(), ["m2", "m3"]);
}

#[test]
fn max_length_reject_publish_refuses_new_messages() {
    let w = world();
    w.declare(
        "q",
        table(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
        ]),
    );
    assert!(!w.publish("q", "m0").rejected);
    assert!(w.publish("q", "m1").rejected);
    assert_eq!(w.ready("q"), 1);
}

#[test]
fn higher_priority_messages_are_delivered_first() {
    let w = world();
    w.declare("q", table(&[("x-max-priority", AMQPValue::LongInt(5))]));
    for (body, p) in [("low", 1u8), ("high", 5), ("mid", 3), ("over", 9)] {
        w.publish_with("q", body, AMQPProperties::default().with_priority(p));
    }
    w.consume("q", "c", true);
    assert_eq!(
        w.out.bodies(),
        ["high", "over", "mid", "low"],
        "priority above max counts as max, FIFO within a level"
    );
}

#[test]
fn delivery_limit_dead_letters_after_too_many_returns() {
    let w = world();
    w.declare("dead", FieldTable::default());
    w.declare(
        "q",
        table(&[
            ("x-delivery-limit", AMQPValue::LongInt(1)),
            ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
            (
                "x-dead-letter-routing-key",
                AMQPValue::LongString("dead".into()),
            ),
        ]),
    );
    w.publish("q", "m0");
    let q = w.vhost.queue(1, "q").unwrap();
    assert!(w.ch.get(&q, false, w.t0));
    w.ch.nack(1, false, true, w.t0).unwrap();
    assert_eq!(w.ready("q"), 1, "first return is within the limit");
    assert!(w.ch.get(&q, false, w.t0));
    w.ch.nack(2, false, true, w.t0).unwrap();
    assert_eq!((w.ready("q"), w.ready("dead")), (0, 1));
}

#[test]
fn exclusive_consumer_locks_out_others_with_403() {
    let w = world();
    w.declare("q", FieldTable::default());
    let q = w.vhost.queue(1, "q").unwrap();
    w.ch.consume(Arc::clone(&q), "a", false, true, w.t0, |_| {})
        .unwrap();
    assert_eq!(
        w.ch.consume(q, "b", false, false, w.t0, |_| {})
            .unwrap_err()
            .reply_code,
        403
    );
}

#[test]
fn duplicate_consumer_tag_is_not_allowed_530() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.consume("q", "a", false);
    let q = w.vhost.queue(1, "q").unwrap();
    assert_eq!(
        w.ch.consume(q, "a", false, false, w.t0, |_| {})
            .unwrap_err()
            .reply_code,
        530
    );
}

#[test]
fn deleting_a_queue_cancels_its_consumers() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.consume("q", "c", false);
    w.vhost.delete_queue(1, "q", false, false).unwrap();
    assert_eq!(*w.out.cancelled.lock(), ["c"]);
    assert_eq!(w.ch.consumer_count(), 0);
}

#[test]
fn tx_rollback_discards_publishes_and_commit_applies_them() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.ch.tx_select();
    let m = msg("", "q", "m0", AMQPProperties::default());
    assert!(w
        .ch
        .publish("", Arc::clone(&m), false, w.t0, &mut no_wait)
        .unwrap()
        .is_none());
    w.ch.tx_rollback().unwrap();
    w.ch.tx_commit(w.t0, &mut no_wait).unwrap();
    assert_eq!(w.ready("q"), 0);
    w.ch.publish("", m, false, w.t0, &mut no_wait).unwrap();
    w.ch.tx_commit(w.t0, &mut no_wait).unwrap();
    assert_eq!(w.ready("q"), 1);
}

#[test]
fn a_transaction_holds_at_most_tx_operations_max_publishes() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.ch.tx_select();
    let m = msg("", "q", "", AMQPProperties::default());
    for _ in 0..berth_broker::limits::TX_OPERATIONS_MAX {
        w.ch.publish("", Arc::clone(&m), false, w.t0, &mut no_wait)
            .unwrap();
    }
    let e =
        w.ch.publish("", m, false, w.t0, &mut no_wait)
            .err()
            .expect("one publish past TX_OPERATIONS_MAX is refused");
    assert_eq!(e.reply_code, 406, "{}", e.reply_text());
    assert!(
        e.reply_text().contains("TX_OPERATIONS_MAX"),
        "{}",
        e.reply_text()
    );
    w.ch.tx_commit(w.t0, &mut no_wait).unwrap();
    assert_eq!(w.ready("q"), berth_broker::limits::TX_OPERATIONS_MAX);
}

#[test]
fn congested_connection_holds_messages_in_the_queue() {
    let w = world();
    w.declare("q", FieldTable::default());
    w.out
        .congested
        .store(true, std::sync::atomic::Ordering::Relaxed);
    w.consume("q", "c", true);
    w.publish("q", "m0");
    assert_eq!(w.ready("q"), 1);
    w.out
        .congested
        .store(false, std::sync::atomic::Ordering::Relaxed);
    w.ch.resume(w.t0);
    assert_eq!((w.ready("q"), w.out.bodies().len()), (0, 1));
}

#[test]
fn topic_and_exchange_to_exchange_bindings_route() {
    let w = world();
    w.vhost
        .declare_exchange(
            "src",
            &ExchangeDeclare {
                kind: "topic".into(),
                ..Default::default()
            },
        )
        .unwrap();
    w.vhost
        .declare_exchange(
            "dst",
            &ExchangeDeclare {
                kind: "fanout".into(),
                ..Default::default()
            },
        )
        .unwrap();
    w.declare("q", FieldTable::default());
    w.vhost
        .bind_exchange("dst", "src", "a.#", &FieldTable::default())
        .unwrap();
    w.vhost
        .bind_queue(1, "q", "dst", "", &FieldTable::default())
        .unwrap();
    let r = w
        .vhost
        .publish(
            "src",
            &msg("src", "a.b.c", "x", AMQPProperties::default()),
            w.t0,
            &mut no_wait,
        )
        .unwrap();
    assert_eq!(r.queues, 1);
    let r = w
        .vhost
        .publish(
            "src",
            &msg("src", "b.c", "x", AMQPProperties::default()),
            w.t0,
            &mut no_wait,
        )
        .unwrap();
    assert!(r.unroutable());
}

#[test]
fn x_expires_deletes_an_unused_queue() {
    let w = world();
    w.declare("q", table(&[("x-expires", AMQPValue::LongInt(100))]));
    w.broker.run_timers(w.t0 + Duration::from_millis(50));
    assert_eq!(w.vhost.queue_count(), 1);
    w.broker.run_timers(w.t0 + Duration::from_millis(150));
    assert_eq!(w.vhost.queue_count(), 0);
}

#[test]
fn publishers_wait_for_busy_consumers_but_not_for_stuck_ones() {
    use berth_broker::limits::FLOW_READY_MAX;
    let w = world();
    w.declare("q", FieldTable::default());
    w.ch.qos(10, false, w.t0);
    w.consume("q", "c1", false);
    let publish = |at: Instant, body: &str| {
        w.vhost
            .publish(
                "",
                &msg("", "q", body, AMQPProperties::default()),
                at,
                &mut no_wait,
            )
            .unwrap()
    };
    // The consumer takes 10; the rest pile up behind it.
    for i in 0..FLOW_READY_MAX + 10 {
        let r = publish(w.t0, &format!("m{i}"));
        assert!(r.backlogged.is_none(), "message {i}: not over the mark yet");
    }
    let r = publish(w.t0, "over");
    let q = r.backlogged.expect("busy consumer, backlog over the mark");
    assert!(!q.caught_up(w.t0));
    // Consuming brings it down to half the mark: publishers go on.
    let later = w.t0 + std::time::Duration::from_millis(10);
    let mut tag = 0;
    while !q.caught_up(later) {
        tag += 10;
        w.ch.ack(tag, true, later).unwrap();
        assert!(tag < 10 * FLOW_READY_MAX as u64, "never caught up");
    }
    assert!(w.ready("q") <= FLOW_READY_MAX / 2);

    // A consumer that stops acking is stuck, not busy: once it has not
    // been delivered to for a while, the queue grows without slowing
    // anyone (as in RabbitMQ).
    for i in 0..FLOW_READY_MAX {
        publish(later, &format!("n{i}"));
    }
    assert!(publish(later, "still busy").backlogged.is_some());
    let idle = later + std::time::Duration::from_secs(1);
    assert!(q.caught_up(idle));
    assert!(publish(idle, "stuck").backlogged.is_none());
}
