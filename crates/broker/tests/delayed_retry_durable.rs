//! Delayed retry across a restart (docs/DELAYED.md "Delayed retry"): a
//! stored message that waits for its retry is never lost, keeps its count
//! of returns and waits the rest of its wait after a restart; while it
//! waits, its body is on disk, not in memory. Against the broker's
//! injected clock and an in-memory journal that stands for a perfect
//! store.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{Durability, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::queue::Queue;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use common::{recovered, Bodies};

struct World {
    journal: Arc<MemoryJournal>,
    clock: Arc<ManualClock>,
    broker: Arc<Broker>,
    v: Arc<VHost>,
}

impl World {
    fn new() -> Self {
        let journal = Arc::new(MemoryJournal::default());
        let clock = Arc::new(ManualClock::new(Instant::now(), 1_700_000_000));
        Self::over(journal, clock, 1, 1)
    }

    fn over(journal: Arc<MemoryJournal>, clock: Arc<ManualClock>, msg: u64, queue: u64) -> Self {
        let dur = Durability::new(journal.clone(), msg, queue);
        let broker = Broker::with_parts(["/"], dur, clock.clone() as Arc<dyn Clock>);
        let v = broker.vhost("/").unwrap();
        Self {
            journal,
            clock,
            broker,
            v,
        }
    }

    /// "Crash" and start again from what the journal holds, bodies on
    /// disk as a store gives them back; the clock goes on.
    fn restart(&self) -> Self {
        let r = recovered(&self.journal, Bodies::OnDisk);
        let (msg, queue) = r.next_ids();
        let w = Self::over(self.journal.clone(), self.clock.clone(), msg, queue);
        let report = w.broker.restore(r, w.clock.now());
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        assert!(report.orphaned_queues.is_empty(), "{report:?}");
        w
    }

    fn queue(&self, name: &str) -> Arc<Queue> {
        let mut args = FieldTable::default();
        args.insert("x-delayed-retry-min".into(), AMQPValue::LongLongInt(1_000));
        let d = QueueDeclare {
            durable: true,
            arguments: args,
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

    /// Takes the next message, unacked, and returns it (a nack with
    /// requeue).
    fn nack_next(&self, q: &Arc<Queue>) {
        let m = q.get(false, self.clock.now()).expect("a message").0;
        q.requeue(vec![m], self.clock.now(), None);
    }
}

fn count(m: &Message) -> Option<AMQPValue> {
    m.headers()
        .and_then(|h| h.inner().get("x-delivery-count").cloned())
}

#[test]
fn a_waiting_retry_survives_a_restart_with_its_count_and_the_rest_of_its_wait() {
    let w = World::new();
    let q = w.queue("q");
    w.publish("q", "m");
    w.nack_next(&q);
    w.advance_ms(1_000);
    w.nack_next(&q); // the second return: waits 2,000 ms
    w.advance_ms(500);

    let w2 = w.restart();
    let q2 = w2.v.queue(1, "q").unwrap();
    let s = q2.stats();
    assert_eq!(
        (s.ready, s.retrying),
        (0, 1),
        "still waiting after the restart"
    );
    w2.advance_ms(1_499);
    assert!(q2.get(false, w2.clock.now()).is_none(), "never early");
    w2.advance_ms(1);
    let m = q2.get(false, w2.clock.now()).expect("due").0;
    assert_eq!(count(&m.msg), Some(AMQPValue::LongLongInt(2)), "count kept");
    // Its third return waits the third backoff, 3,000 ms, and a restart
    // while it is ready again keeps its count too.
    q2.requeue(vec![m], w2.clock.now(), None);
    w2.advance_ms(3_000);
    let w3 = w2.restart();
    let q3 = w3.v.queue(1, "q").unwrap();
    let m = q3.get(true, w3.clock.now()).expect("ready").0;
    assert_eq!(count(&m.msg), Some(AMQPValue::LongLongInt(3)));
    // Acked: its mark goes with it, and nothing is left to restore.
    w3.broker.flush_removals();
    let w4 = w3.restart();
    let q4 = w4.v.queue(1, "q").unwrap();
    assert_eq!(q4.stats().ready + q4.stats().retrying, 0);
    let left: usize = (w4.journal.messages.lock().values()).map(|m| m.len()).sum();
    assert_eq!(left, 0, "no mark left behind");
}

#[test]
fn waiting_messages_keep_their_bodies_on_disk() {
    let w = World::new();
    let q = w.queue("q");
    let body = "b".repeat(10_000);
    for _ in 0..20 {
        w.publish("q", &body);
    }
    let taken: Vec<_> = (0..20)
        .map(|_| q.get(false, w.clock.now()).unwrap().0)
        .collect();
    q.requeue(taken, w.clock.now(), None);
    assert_eq!(q.stats().retrying, 20);
    w.journal.bytes_read.store(0, Ordering::Relaxed);
    w.advance_ms(1_000);
    for _ in 0..20 {
        let m = q.get(true, w.clock.now()).expect("due").0;
        assert_eq!(m.msg.body.len(), 10_000);
        assert_eq!(count(&m.msg), Some(AMQPValue::LongLongInt(1)));
    }
    let read = w.journal.bytes_read.load(Ordering::Relaxed);
    assert!(
        read >= 20 * 10_000,
        "their bodies were read back from the journal ({read} bytes): they waited on disk"
    );
}
