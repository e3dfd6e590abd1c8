//! Delayed exchanges (`x-delayed-message`, docs/DELAYED.md) against the
//! broker's injected clock and an in-memory journal that stands for a
//! perfect store: messages are held until due and never before, in due
//! order whatever the publish order, routed as their `x-delayed-type`
//! routes, stored durably (the confirm waits for it) and routed once after
//! a restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{Done, Durability, Journal, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::{Broker, Recovered, StoredBody};
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

/// A message to `exchange` with `x-delay = delay_ms` (none if `None`).
fn delayed(
    exchange: &str,
    key: &str,
    body: &str,
    delay_ms: Option<i64>,
    persistent: bool,
) -> Arc<Message> {
    let mut p = AMQPProperties::default();
    if let Some(ms) = delay_ms {
        p = p.with_headers(table(&[("x-delay", AMQPValue::LongLongInt(ms))]));
    }
    if persistent {
        p = p.with_delivery_mode(2);
    }
    Message::new(
        exchange.into(),
        key.into(),
        encode_properties(&p),
        Bytes::from(body.to_owned()),
    )
    .unwrap()
}

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
    /// goes on.
    fn restart(&self) -> Self {
        let r = Recovered {
            streams: self.journal.stored_streams(),
            meta: (self.journal.meta.lock().iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            messages: (self.journal.messages.lock().iter())
                .map(|(q, m)| {
                    let list = (m.keys()).map(|id| (*id, StoredBody::OnDisk { len: 0 }));
                    (*q, list.collect())
                })
                .collect(),
            paged: Default::default(),
        };
        let (msg, queue) = r.next_ids();
        let w = Self::over(self.journal.clone(), self.clock.clone(), msg, queue);
        let report = w.broker.restore(r, w.clock.now());
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        assert!(report.orphaned_queues.is_empty(), "{report:?}");
        w
    }

    fn declare_delayed(&self, name: &str, routes_as: &str, durable: bool) {
        self.v
            .declare_exchange(
                name,
                &ExchangeDeclare {
                    kind: "x-delayed-message".into(),
                    durable,
                    arguments: table(&[("x-delayed-type", text(routes_as))]),
                    ..Default::default()
                },
            )
            .unwrap();
    }

    fn queue(&self, name: &str, exchange: &str, key: &str, args: &FieldTable) {
        let d = QueueDeclare {
            durable: true,
            ..Default::default()
        };
        self.v.declare_queue(1, name, &d, self.clock.now()).unwrap();
        self.v.bind_queue(1, name, exchange, key, args).unwrap();
    }

    /// Publishes; returns whether the publish's completion ran with Ok
    /// (the confirm) and whether it is unroutable (for `mandatory`).
    fn publish(&self, exchange: &str, m: &Arc<Message>) -> (bool, bool) {
        let confirmed = Arc::new(Mutex::new(false));
        let c = Arc::clone(&confirmed);
        let mut done = move || -> Done {
            let c = Arc::clone(&c);
            Box::new(move |r| *c.lock() = r.is_ok())
        };
        let r = self
            .v
            .publish(exchange, m, self.clock.now(), &mut done)
            .unwrap();
        let confirmed = *confirmed.lock();
        (confirmed, r.unroutable())
    }

    fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.broker.run_timers(self.clock.now());
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

    /// Records the journal holds under the delayed exchange's store id
    /// (every id that is not a queue's).
    fn stored_delayed(&self, queue_ids: &[u64]) -> usize {
        (self.journal.messages.lock().iter())
            .filter(|(q, _)| !queue_ids.contains(q))
            .map(|(_, m)| m.len())
            .sum()
    }
}

#[test]
fn a_message_is_held_until_due_and_a_long_delay_never_holds_back_a_short_one() {
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    w.publish("d", &delayed("d", "k", "2s", Some(2_000), true));
    w.publish("d", &delayed("d", "k", "100ms", Some(100), true));
    w.publish("d", &delayed("d", "k", "now", None, true));
    w.publish("d", &delayed("d", "k", "zero", Some(0), true));
    w.publish("d", &delayed("d", "k", "negative", Some(-5), true));
    assert_eq!(
        w.take("q"),
        ["now", "zero", "negative"],
        "no delay: at once"
    );

    w.advance_ms(99);
    assert!(w.take("q").is_empty(), "never early");
    w.advance_ms(1);
    assert_eq!(w.take("q"), ["100ms"], "the short delay is not held back");
    w.advance_ms(1_899);
    assert!(w.take("q").is_empty());
    w.advance_ms(1);
    assert_eq!(w.take("q"), ["2s"]);
    let e = w.v.exchange("d").unwrap();
    let s = e.delayed.as_ref().unwrap().stats();
    assert_eq!((s.messages, s.routed, s.lateness_ms_max), (0, 2, 0));
}

#[test]
fn a_due_message_routes_as_its_delayed_type_routes() {
    let w = World::new();
    let none = FieldTable::default();
    for t in ["direct", "fanout", "topic", "headers"] {
        w.declare_delayed(t, t, false);
    }
    w.queue("direct-q", "direct", "k", &none);
    w.queue("fanout-q", "fanout", "ignored", &none);
    w.queue("topic-q", "topic", "a.*", &none);
    let match_pdf = table(&[("x-match", text("all")), ("format", text("pdf"))]);
    w.queue("headers-q", "headers", "", &match_pdf);
    for t in ["direct", "fanout", "topic", "headers"] {
        for (key, body) in [("k", "k"), ("a.b", "a.b"), ("zz", "zz")] {
            let mut p = AMQPProperties::default().with_headers(table(&[
                ("x-delay", AMQPValue::LongInt(50)),
                ("format", text(if body == "zz" { "pdf" } else { "txt" })),
            ]));
            p = p.with_delivery_mode(1);
            let m = Message::new(t.into(), key.into(), encode_properties(&p), body.into());
            w.publish(t, &m.unwrap());
        }
    }
    for q in ["direct-q", "fanout-q", "topic-q", "headers-q"] {
        assert!(w.take(q).is_empty(), "{q}: held");
    }
    w.advance_ms(50);
    assert_eq!(w.take("direct-q"), ["k"]);
    assert_eq!(w.take("fanout-q"), ["k", "a.b", "zz"]);
    assert_eq!(w.take("topic-q"), ["a.b"]);
    assert_eq!(w.take("headers-q"), ["zz"]);
}

#[test]
fn a_delayed_persistent_message_is_confirmed_once_stored_and_routed_once_after_a_restart() {
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    let qid = w.v.queue(1, "q").unwrap().store_id.unwrap();
    let (confirmed, unroutable) = w.publish("d", &delayed("d", "k", "late", Some(1_000), true));
    assert!(confirmed, "the confirm means stored");
    assert!(!unroutable, "a held message is never returned");
    w.publish("d", &delayed("d", "k", "early", Some(300), true));
    assert_eq!(
        w.stored_delayed(&[qid]),
        2,
        "both stored, under the exchange"
    );
    w.advance_ms(200);

    let w2 = w.restart();
    let e = w2.v.exchange("d").unwrap();
    assert_eq!(e.delayed.as_ref().unwrap().stats().messages, 2);
    w2.advance_ms(99);
    assert!(
        w2.take("q").is_empty(),
        "never early after a restart either"
    );
    w2.advance_ms(1);
    assert_eq!(w2.take("q"), ["early"]);
    w2.broker.flush_removals();
    assert_eq!(w2.stored_delayed(&[qid]), 1, "routed: its record is gone");
    w2.advance_ms(700);
    assert_eq!(w2.take("q"), ["late"]);
    w2.broker.flush_removals();
    assert_eq!(w2.stored_delayed(&[qid]), 0);

    // Once routed it is the queue's: another restart routes nothing again.
    let w3 = w2.restart();
    w3.advance_ms(10_000);
    assert!(w3.take("q").is_empty());
}

#[test]
fn a_restart_reads_each_pending_messages_due_time_not_its_body() {
    use std::sync::atomic::Ordering;
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    let big = "b".repeat(64 * 1024);
    for i in 0..50u64 {
        w.publish("d", &delayed("d", "k", &big, Some(1_000 + i as i64), true));
    }
    w.journal.bytes_read.store(0, Ordering::Relaxed);
    let w2 = w.restart();
    let read = w2.journal.bytes_read.load(Ordering::Relaxed);
    assert!(
        read <= 50 * 8,
        "a restart read {read} bytes to learn 50 due times of 8 bytes each"
    );
    let e = w2.v.exchange("d").unwrap();
    assert_eq!(e.delayed.as_ref().unwrap().stats().messages, 50);
    w2.advance_ms(1_000);
    assert_eq!(w2.take("q").len(), 1, "due times as stored");
    w2.advance_ms(49);
    assert_eq!(w2.take("q").len(), 49);
}

#[test]
fn a_routed_message_whose_queue_copy_is_not_yet_durable_stays_stored() {
    // The removal waits for the routed copy (defer_removal): until the
    // next flush the record stays, so a crash in between routes it again
    // (at least once).
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    let qid = w.v.queue(1, "q").unwrap().store_id.unwrap();
    w.publish("d", &delayed("d", "k", "m", Some(10), true));
    // The removal is flushed at the start of the next timer run.
    w.advance_ms(10);
    assert_eq!(
        w.stored_delayed(&[qid]),
        1,
        "not removed before its copy is durable"
    );
    let w2 = w.restart();
    w2.advance_ms(0);
    assert_eq!(
        w2.take("q"),
        ["m", "m"],
        "routed again after the crash: at least once"
    );
}

#[test]
fn a_transient_or_non_durable_delayed_message_is_held_in_memory_only() {
    let w = World::new();
    w.declare_delayed("d", "fanout", true);
    w.declare_delayed("nd", "fanout", false);
    w.queue("q", "d", "", &FieldTable::default());
    w.v.bind_queue(1, "q", "nd", "", &FieldTable::default())
        .unwrap();
    let qid = w.v.queue(1, "q").unwrap().store_id.unwrap();
    w.publish("d", &delayed("d", "", "transient", Some(10), false));
    w.publish("nd", &delayed("nd", "", "persistent", Some(10), true));
    assert_eq!(w.stored_delayed(&[qid]), 0);
    w.advance_ms(10);
    assert_eq!(w.take("q").len(), 2);
}

#[test]
fn deleting_a_delayed_exchange_discards_its_pending_messages() {
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    let qid = w.v.queue(1, "q").unwrap().store_id.unwrap();
    w.publish("d", &delayed("d", "k", "m", Some(10), true));
    w.v.delete_exchange("d", false).unwrap();
    assert_eq!(w.stored_delayed(&[qid]), 0, "purged from the store");
    w.advance_ms(10);
    assert!(w.take("q").is_empty());
    let w2 = w.restart();
    assert!(w2.v.exchange("d").is_err());
}

#[test]
fn delayed_exchange_arguments_are_checked_as_the_plugin_checks_them() {
    let w = World::new();
    let declare = |kind: &str, args: FieldTable| {
        w.v.declare_exchange(
            "d",
            &ExchangeDeclare {
                kind: kind.into(),
                arguments: args,
                ..Default::default()
            },
        )
    };
    let e = declare("x-delayed-message", FieldTable::default()).unwrap_err();
    assert_eq!(e.reply_code, 406, "{}", e.text);
    assert!(e.text.contains("x-delayed-type"), "{}", e.text);
    let e = declare(
        "x-delayed-message",
        table(&[("x-delayed-type", text("x-consistent-hash"))]),
    )
    .unwrap_err();
    assert_eq!(e.reply_code, 406, "{}", e.text);
    declare(
        "x-delayed-message",
        table(&[("x-delayed-type", text("topic"))]),
    )
    .unwrap();
    let e = declare(
        "x-delayed-message",
        table(&[("x-delayed-type", text("direct"))]),
    )
    .unwrap_err();
    assert_eq!(e.reply_code, 406, "{}", e.text);
    assert!(e.text.contains("x-delayed-type"), "{}", e.text);
    let e = declare("topic", FieldTable::default()).unwrap_err();
    assert_eq!(e.reply_code, 406, "{}", e.text);
    assert_eq!(w.v.exchange("d").unwrap().type_name(), "x-delayed-message");
}

/// Issue 19: "exchange-to-exchange bindings work as for other exchanges".
/// A delayed message that reaches a delayed exchange through a binding
/// from another exchange, or as the alternate exchange, is held there too;
/// it was routed at once before.
#[test]
fn a_delayed_exchange_reached_through_a_binding_or_as_alternate_holds_the_message() {
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    let plain = |name: &str, args: FieldTable| {
        let d = ExchangeDeclare {
            kind: "fanout".into(),
            durable: true,
            arguments: args,
            ..Default::default()
        };
        w.v.declare_exchange(name, &d).unwrap();
    };
    plain("front", FieldTable::default());
    w.v.bind_exchange("d", "front", "", &FieldTable::default())
        .unwrap();
    let ae = table(&[("alternate-exchange", text("d"))]);
    w.v.declare_exchange(
        "with-ae",
        &ExchangeDeclare {
            kind: "direct".into(),
            durable: true,
            arguments: ae,
            ..Default::default()
        },
    )
    .unwrap();
    w.publish(
        "front",
        &delayed("front", "k", "via binding", Some(100), true),
    );
    w.publish(
        "with-ae",
        &delayed("with-ae", "k", "via ae", Some(100), true),
    );
    assert!(w.take("q").is_empty(), "held by the delayed exchange");
    let s = w.v.exchange("d").unwrap().delayed.as_ref().unwrap().stats();
    assert_eq!(s.messages, 2);
    w.advance_ms(100);
    assert_eq!(w.take("q"), ["via binding", "via ae"]);
}

/// A message dead-lettered to a delayed exchange with its `x-delay` is
/// held there (a retry loop through a delayed dead-letter exchange).
#[test]
fn a_dead_letter_to_a_delayed_exchange_is_held_until_due() {
    let w = World::new();
    w.declare_delayed("retry", "direct", true);
    w.queue("work", "retry", "work", &FieldTable::default());
    let d = QueueDeclare {
        durable: true,
        arguments: table(&[
            ("x-dead-letter-exchange", text("retry")),
            ("x-dead-letter-routing-key", text("work")),
        ]),
        ..Default::default()
    };
    w.v.declare_queue(1, "in", &d, w.clock.now()).unwrap();
    let m = delayed("", "in", "m", Some(500), true);
    w.v.publish("", &m, w.clock.now(), &mut || Box::new(|_| {}))
        .unwrap();
    let q = w.v.queue(1, "in").unwrap();
    let got = q.get(false, w.clock.now()).unwrap().0;
    q.reject(vec![got], w.clock.now(), None);
    w.advance_ms(499);
    assert!(
        w.take("work").is_empty(),
        "held by the delayed dead-letter exchange"
    );
    w.advance_ms(1);
    assert_eq!(w.take("work"), ["m"]);
}

/// One publish stored both in a durable queue and in a delayed exchange
/// is confirmed once, after both writes.
#[test]
fn a_publish_stored_in_a_queue_and_held_by_a_delayed_exchange_is_confirmed_once() {
    let w = World::new();
    w.declare_delayed("d", "fanout", true);
    w.queue("later", "d", "", &FieldTable::default());
    let f = ExchangeDeclare {
        kind: "fanout".into(),
        durable: true,
        ..Default::default()
    };
    w.v.declare_exchange("f", &f).unwrap();
    w.queue("now", "f", "", &FieldTable::default());
    w.v.bind_exchange("d", "f", "", &FieldTable::default())
        .unwrap();
    let calls = Arc::new(Mutex::new(0));
    let c = Arc::clone(&calls);
    let mut made = 0;
    let mut done = || -> Done {
        made += 1;
        let c = Arc::clone(&c);
        Box::new(move |r| {
            r.unwrap();
            *c.lock() += 1;
        })
    };
    let m = delayed("f", "", "m", Some(10), true);
    let r = w.v.publish("f", &m, w.clock.now(), &mut done).unwrap();
    assert!(r.durable && !r.unroutable());
    assert_eq!((made, *calls.lock()), (1, 1), "one completion, run once");
    assert_eq!(w.take("now"), ["m"]);
    w.advance_ms(10);
    assert_eq!(w.take("later"), ["m"]);
}

/// Issue 48: each message published with a shorter delay than all before
/// it used to push a timer entry, and every firing cleared the exchange's
/// armed time and pushed another, so stale entries piled up and kept
/// firing: timer work grew with the square of the messages. One live
/// entry per delayed exchange keeps it linear.
#[test]
fn decreasing_delays_keep_one_timer_entry_and_fire_once_per_due_time() {
    const N: u64 = 1_000;
    let w = World::new();
    w.declare_delayed("d", "fanout", false);
    w.queue("q", "d", "", &FieldTable::default());
    let base = w.broker.timer_counts();
    for ms in (1..=N).rev() {
        let delay = i64::try_from(ms).unwrap();
        w.publish("d", &delayed("d", "", "m", Some(delay), false));
    }
    let mut peak = w.broker.timer_counts().entries;
    let mut routed = 0;
    for _ in 0..N {
        w.advance_ms(1);
        routed += w.take("q").len();
        peak = peak.max(w.broker.timer_counts().entries);
    }
    let fired = w.broker.timer_counts().fired - base.fired;
    assert_eq!(routed, usize::try_from(N).unwrap());
    assert!(
        peak <= base.entries + 1 && fired <= N,
        "{N} messages due 1 ms apart: at most {} timer entries and {N} firings wanted, got {peak} entries and {fired} firings",
        base.entries + 1
    );
}

/// Issue 48: a delayed publish whose write failed was nacked, yet still
/// routed when due; a nack means "not taken", so it must never arrive.
#[test]
fn a_delayed_publish_that_was_nacked_is_never_routed() {
    let w = World::new();
    w.declare_delayed("d", "direct", true);
    w.queue("q", "d", "k", &FieldTable::default());
    w.journal.fail_message_writes(true);
    let (confirmed, _) = w.publish("d", &delayed("d", "k", "nacked", Some(100), true));
    assert!(!confirmed, "the store write failed: nacked");
    w.journal.fail_message_writes(false);
    w.publish("d", &delayed("d", "k", "stored", Some(100), true));
    w.advance_ms(100);
    assert_eq!(w.take("q"), ["stored"], "a nacked publish is never routed");
    let s = w.v.exchange("d").unwrap().delayed.as_ref().unwrap().stats();
    assert_eq!(s.messages, 0, "nothing is left pending");
}

/// The `x-delay` header of a routed message, as its consumer sees it.
fn delay_header(w: &World, queue: &str) -> Option<AMQPValue> {
    let q = w.v.queue(1, queue).unwrap();
    let (m, _) = q.get(true, w.clock.now())?;
    m.msg.headers()?.inner().get("x-delay").cloned()
}

/// Issue 48 (the plugin's issue #52): once routed, a message's `x-delay`
/// is negated, so a further delayed exchange on its way (or a delayed
/// dead-letter exchange later) routes it at once instead of delaying it
/// again; the consumer still sees that it was delayed, and by how much.
#[test]
fn a_routed_message_has_its_delay_negated_and_is_not_delayed_again() {
    let w = World::new();
    w.declare_delayed("first", "fanout", true);
    w.declare_delayed("second", "fanout", true);
    w.v.bind_exchange("second", "first", "", &FieldTable::default())
        .unwrap();
    w.queue("q", "second", "", &FieldTable::default());
    w.publish("first", &delayed("first", "", "m", Some(100), true));
    w.advance_ms(100);
    let stats = |e: &str| w.v.exchange(e).unwrap().delayed.as_ref().unwrap().stats();
    assert_eq!(
        (stats("first").routed, stats("second").messages),
        (1, 0),
        "routed by the first delayed exchange, not held by the second"
    );
    assert_eq!(delay_header(&w, "q"), Some(AMQPValue::LongInt(-100)));
}

/// Issue 48: the plugin reads a string `x-delay` as an integer and a float
/// one truncated; berth routed them at once.
#[test]
fn string_and_float_delays_delay_as_the_plugin_reads_them() {
    let w = World::new();
    w.declare_delayed("d", "fanout", false);
    w.queue("q", "d", "", &FieldTable::default());
    for (v, body) in [
        (AMQPValue::LongString("100".into()), "string"),
        (AMQPValue::Double(100.9), "double"),
        (AMQPValue::Float(100.5), "float"),
    ] {
        let p = AMQPProperties::default().with_headers(table(&[("x-delay", v)]));
        let m = Message::new(
            "d".into(),
            String::new(),
            encode_properties(&p),
            body.into(),
        );
        w.publish("d", &m.unwrap());
    }
    assert!(w.take("q").is_empty(), "all three held");
    w.advance_ms(100);
    assert_eq!(w.take("q"), ["string", "double", "float"]);
}

/// Issue 48: the plugin routes a delay above 2^32 − 1 ms (its timer's
/// limit, ~49.7 days) at once; berth held it.
#[test]
fn a_delay_above_2_pow_32_minus_1_ms_is_routed_at_once() {
    let w = World::new();
    w.declare_delayed("d", "fanout", false);
    w.queue("q", "d", "", &FieldTable::default());
    let max = i64::from(u32::MAX);
    w.publish("d", &delayed("d", "", "too long", Some(max + 1), false));
    w.publish("d", &delayed("d", "", "longest", Some(max), false));
    assert_eq!(w.take("q"), ["too long"]);
    let s = w.v.exchange("d").unwrap().delayed.as_ref().unwrap().stats();
    assert_eq!(s.messages, 1, "2^32 − 1 ms is still held");
}

/// Issue 48: messages a delayed exchange holds in memory only (transient,
/// or of a non-durable exchange) had no bound; past
/// `limits.delayed_in_memory_per_exchange_max` a publish is refused with
/// an error that says what to do, and stored ones are not counted.
#[test]
fn messages_held_in_memory_only_are_bounded_with_a_clear_error() {
    let w = World::new();
    w.v.set_count_limits(berth_broker::limits::CountLimits {
        delayed_in_memory_per_exchange_max: 2,
        ..Default::default()
    });
    w.declare_delayed("d", "fanout", true);
    w.queue("q", "d", "", &FieldTable::default());
    let publish = |body: &str, persistent: bool| {
        let m = delayed("d", "", body, Some(100), persistent);
        w.v.publish("d", &m, w.clock.now(), &mut || Box::new(|_| {}))
    };
    publish("1", false).unwrap();
    publish("2", false).unwrap();
    let e = publish("3", false).err().expect("the third is refused");
    assert_eq!(e.reply_code, 406, "{}", e.text);
    for part in [
        "delayed exchange 'd'",
        "limits.delayed_in_memory_per_exchange_max",
        "delivery_mode 2",
    ] {
        assert!(e.text.contains(part), "{part:?} not in {:?}", e.text);
    }
    publish("stored", true).expect("a stored one does not count");
    w.advance_ms(100);
    assert_eq!(w.take("q"), ["1", "2", "stored"]);
    publish("room again", false).expect("routed ones leave room");
}

/// A journal whose writes complete at once (a cluster's commit) but reach
/// its store only when the test applies them (the member's store writing
/// what it applies).
#[derive(Default)]
struct CommitsFirst {
    inner: MemoryJournal,
    unapplied: Mutex<Vec<(u64, Vec<u64>, Bytes)>>,
}

impl Journal for CommitsFirst {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.unapplied.lock().push((msg, queues.to_vec(), payload));
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.inner.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.inner.purge(queue, done);
    }
    fn put_meta(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), berth_broker::durable::JournalError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), berth_broker::durable::JournalError> {
        self.inner.delete_meta(key)
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, berth_broker::durable::JournalError> {
        self.inner.read(queue, msg)
    }
    fn pages(&self) -> bool {
        true
    }
    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        self.inner.written(queue, msgs)
    }
}

impl CommitsFirst {
    fn apply(&self) {
        for (msg, queues, payload) in self.unapplied.lock().drain(..) {
            self.inner.publish(msg, &queues, payload, None);
        }
    }
}

/// A cluster's leader confirms a delayed message at its commit and lets
/// its body go; its store writes the record a moment later. A message
/// due in that moment could not be read back, was logged as unreadable
/// and left for a restart to route (issue 45's finding for delayed
/// bodies). It is now read again shortly after.
#[test]
fn a_due_message_not_yet_written_by_the_store_is_routed_once_it_is() {
    let journal = Arc::new(CommitsFirst::default());
    let clock = Arc::new(ManualClock::new(Instant::now(), 1_700_000_000));
    let dur = Durability::new(journal.clone(), 1, 1);
    let broker = Broker::with_parts(["/"], dur, clock.clone() as Arc<dyn Clock>);
    let v = broker.vhost("/").unwrap();
    v.declare_exchange(
        "d",
        &ExchangeDeclare {
            kind: "x-delayed-message".into(),
            durable: true,
            arguments: table(&[("x-delayed-type", text("direct"))]),
            ..Default::default()
        },
    )
    .unwrap();
    let q = QueueDeclare {
        durable: true,
        ..Default::default()
    };
    v.declare_queue(1, "q", &q, clock.now()).unwrap();
    v.bind_queue(1, "q", "d", "k", &FieldTable::default())
        .unwrap();
    journal.apply(); // the definitions' writes, if any
    let m = delayed("d", "k", "soon", Some(100), true);
    v.publish("d", &m, clock.now(), &mut || Box::new(|r| r.unwrap()))
        .unwrap();
    let take = || {
        let q = v.queue(1, "q").unwrap();
        let mut out = Vec::new();
        while let Some((m, _)) = q.get(true, clock.now()) {
            out.push(String::from_utf8(m.msg.body.to_vec()).unwrap());
        }
        out
    };
    // Due while its record is not in the store yet.
    clock.advance(Duration::from_millis(100));
    broker.run_timers(clock.now());
    assert!(take().is_empty(), "not routed before it can be read");
    journal.apply();
    clock.advance(Duration::from_millis(50));
    broker.run_timers(clock.now());
    assert_eq!(take(), ["soon"], "routed once its record is written");
}
