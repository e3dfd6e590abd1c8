//! Message TTLs across a restart (issue 42), against the broker's injected
//! clock and an in-memory journal that stands for a perfect store: the
//! queue's `x-message-ttl` and a message's own `expiration` keep their
//! original expiry (they count from when the message was enqueued, the
//! time stored with it), whether the restart hands bodies back or leaves
//! them on disk; a message whose TTL passed while the broker was down is
//! dead-lettered at start; a wall clock set back across the restart keeps
//! a message at most a TTL from the restart; a message stored without
//! times (by a berth before them) restarts its TTL, as it always did. A
//! cluster's new leader opens its copy of the store as a restart does, so
//! this is also what a failover does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{encode_message, Durability, Journal, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::{Broker, Recovered, StoredBody};
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;

/// How a restart hands back each stored message.
#[derive(Clone, Copy, Debug)]
enum Bodies {
    /// Read (a store that replayed the record).
    Read,
    /// Left on disk, only its id and size (a store's checkpoint).
    OnDisk,
}

const BOTH: [Bodies; 2] = [Bodies::Read, Bodies::OnDisk];

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

    /// "Crash" and start again from what the journal holds; the clock
    /// goes on (its wall clock `step_s` seconds off: negative, set back).
    fn restart_stepped(&self, bodies: Bodies, step_s: i64) -> Self {
        let r = Recovered {
            streams: self.journal.stored_streams(),
            meta: (self.journal.meta.lock().iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            messages: (self.journal.messages.lock().iter())
                .map(|(q, m)| {
                    let list = m.iter().map(|(id, p)| {
                        let body = match bodies {
                            Bodies::Read => StoredBody::Payload(p.clone()),
                            Bodies::OnDisk => StoredBody::OnDisk {
                                len: u32::try_from(p.len()).unwrap(),
                            },
                        };
                        (*id, body)
                    });
                    (*q, list.collect())
                })
                .collect(),
            paged: Default::default(),
        };
        let (msg, queue) = r.next_ids();
        let clock = if step_s == 0 {
            self.clock.clone()
        } else {
            let wall = self.clock.unix_time_us() / 1_000_000;
            let wall = wall.checked_add_signed(step_s).unwrap();
            Arc::new(ManualClock::new(self.clock.now(), wall))
        };
        let w = Self::over(self.journal.clone(), clock, msg, queue);
        let report = w.broker.restore(r, w.clock.now());
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        w
    }

    fn restart(&self, bodies: Bodies) -> Self {
        self.restart_stepped(bodies, 0)
    }

    fn queue(&self, name: &str, args: &[(&str, AMQPValue)]) {
        let mut arguments = FieldTable::default();
        for (k, v) in args {
            arguments.insert((*k).into(), v.clone());
        }
        let d = QueueDeclare {
            durable: true,
            arguments,
            ..Default::default()
        };
        self.v.declare_queue(1, name, &d, self.clock.now()).unwrap();
    }

    /// Publishes a persistent message to `queue` through the default
    /// exchange.
    fn publish(&self, queue: &str, body: &str, expiration: Option<&str>) {
        let mut p = AMQPProperties::default().with_delivery_mode(2);
        if let Some(e) = expiration {
            p = p.with_expiration(e.into());
        }
        let m = Message::new(
            String::new(),
            queue.into(),
            encode_properties(&p),
            Bytes::from(body.to_owned()),
        )
        .unwrap();
        self.v
            .publish("", &m, self.clock.now(), &mut || Box::new(|r| r.unwrap()))
            .unwrap();
    }

    /// Time passes with the broker running (its timers run).
    fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.broker.run_timers(self.clock.now());
    }

    /// Time passes with the broker down.
    fn down_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    fn ready(&self, queue: &str) -> usize {
        self.v.queue(1, queue).unwrap().stats().ready
    }

    /// Bodies ready in `queue`, taken.
    fn take(&self, queue: &str) -> Vec<String> {
        let q = self.v.queue(1, queue).unwrap();
        let mut out = Vec::new();
        while let Some((m, _)) = q.get(true, self.clock.now()) {
            out.push(String::from_utf8(m.msg.body.to_vec()).unwrap());
        }
        out
    }
}

fn ttl(ms: i32) -> (&'static str, AMQPValue) {
    ("x-message-ttl", AMQPValue::LongInt(ms))
}

#[test]
fn queue_ttl_keeps_its_original_expiry_across_a_restart() {
    for bodies in BOTH {
        let w = World::new();
        w.queue("q", &[ttl(3_000)]);
        w.publish("q", "m", None);
        w.advance_ms(1_000);
        w.down_ms(1_000);
        let w2 = w.restart(bodies);
        w2.advance_ms(900);
        assert_eq!(w2.ready("q"), 1, "{bodies:?}: not before its 3 s");
        w2.advance_ms(200);
        assert_eq!(
            w2.ready("q"),
            0,
            "{bodies:?}: expired 3 s after it was enqueued, 1 s after the restart, not 3 s"
        );
    }
}

#[test]
fn own_expiration_keeps_its_original_expiry_across_a_restart() {
    for bodies in BOTH {
        let w = World::new();
        w.queue("q", &[]);
        w.publish("q", "m", Some("3000"));
        w.publish("q", "forever", None);
        w.down_ms(2_000);
        let w2 = w.restart(bodies);
        w2.advance_ms(900);
        assert_eq!(w2.ready("q"), 2, "{bodies:?}: not before its 3 s");
        w2.advance_ms(200);
        assert_eq!(w2.take("q"), ["forever"], "{bodies:?}");
    }
}

#[test]
fn a_message_whose_ttl_passed_while_down_is_dead_lettered_at_start() {
    for bodies in BOTH {
        let w = World::new();
        w.queue("dead", &[]);
        w.queue(
            "q",
            &[
                ttl(1_000),
                ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
                (
                    "x-dead-letter-routing-key",
                    AMQPValue::LongString("dead".into()),
                ),
            ],
        );
        w.publish("q", "late", None);
        w.down_ms(5_000);
        let w2 = w.restart(bodies);
        w2.advance_ms(0);
        assert_eq!(w2.ready("q"), 0, "{bodies:?}");
        let dead = w2.v.queue(1, "dead").unwrap();
        let (m, _) = dead.get(true, w2.clock.now()).expect("dead-lettered");
        assert_eq!(&m.msg.body[..], b"late");
        let headers = berth_protocol::codec::decode_properties(&m.msg.properties)
            .unwrap()
            .headers()
            .clone()
            .unwrap();
        assert_eq!(
            headers.inner().get("x-first-death-reason"),
            Some(&AMQPValue::LongString("expired".into())),
            "{headers:?}"
        );
        assert!(w2.take("dead").is_empty(), "{bodies:?}");
    }
}

/// The wall clock went back an hour between the write and the restart:
/// the message lives at most its TTL from the restart (not an hour more).
#[test]
fn a_wall_clock_set_back_keeps_a_message_at_most_its_ttl_from_the_restart() {
    for bodies in BOTH {
        let w = World::new();
        w.queue("q", &[ttl(3_000)]);
        w.publish("q", "m", None);
        w.down_ms(2_000);
        let w2 = w.restart_stepped(bodies, -3_600);
        w2.advance_ms(2_900);
        assert_eq!(w2.ready("q"), 1, "{bodies:?}");
        w2.advance_ms(200);
        assert_eq!(w2.ready("q"), 0, "{bodies:?}: gone a TTL after the restart");
    }
}

/// A store written by a berth before times: its payloads carry none, and
/// still read; their TTL counts from the restart, as it did.
#[test]
fn a_message_stored_without_times_still_reads_and_its_ttl_restarts() {
    for bodies in BOTH {
        let w = World::new();
        w.queue("q", &[ttl(3_000)]);
        let qid = w.v.queue(1, "q").unwrap().store_id.unwrap();
        let props = encode_properties(&AMQPProperties::default().with_delivery_mode(2));
        let old = encode_message("", "q", &props, b"old").unwrap();
        w.journal.publish(1_000, &[qid], old, None);
        w.down_ms(2_000);
        let w2 = w.restart(bodies);
        w2.advance_ms(2_900);
        assert_eq!(w2.ready("q"), 1, "{bodies:?}: 3 s from the restart");
        w2.advance_ms(200);
        assert_eq!(w2.ready("q"), 0, "{bodies:?}");
    }
}

/// A restart reads each message's times (18 bytes), not its body, and
/// only at the queue's head.
#[test]
fn a_restart_reads_times_at_the_head_not_bodies() {
    use std::sync::atomic::Ordering;
    let w = World::new();
    w.queue("q", &[ttl(60_000)]);
    let big = "b".repeat(64 * 1024);
    for _ in 0..200 {
        w.publish("q", &big, None);
    }
    w.journal.bytes_read.store(0, Ordering::Relaxed);
    let w2 = w.restart(Bodies::OnDisk);
    let read = w2.journal.bytes_read.load(Ordering::Relaxed);
    assert!(read <= 64 * 18, "a restart read {read} bytes");
    assert!(read > 0, "the head's times were read");
    assert_eq!(w2.ready("q"), 200);
}
