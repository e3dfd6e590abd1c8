//! Queue arguments: TTLs, expiry, length limits and overflow, dead-lettering
//! with x-death, delivery limit, consumer timeout, priorities, queue types,
//! and the 406 for a recognised argument with an invalid value.

use std::time::Duration;

use berth_itest::lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicRejectOptions, QueueDeclareOptions,
};
use berth_itest::lapin::types::{AMQPValue, FieldTable};
use berth_itest::lapin::{BasicProperties, Channel};
use berth_itest::*;

async fn try_declare(
    ch: &Channel,
    name: &str,
    durable: bool,
    args: FieldTable,
) -> lapin::Result<lapin::Queue> {
    bounded(
        "queue.declare",
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable,
                ..QueueDeclareOptions::default()
            },
            args,
        ),
    )
    .await
}

async fn exists(ch: &Channel, name: &str) -> lapin::Result<lapin::Queue> {
    bounded(
        "queue.declare passive",
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
}

async fn delete(ch: &Channel, name: &str) {
    bounded(
        "queue.delete",
        ch.queue_delete(name.into(), Default::default()),
    )
    .await
    .expect("queue.delete");
}

fn entry_str(entry: &std::collections::BTreeMap<String, AMQPValue>, key: &str) -> Option<String> {
    entry.get(key).and_then(value_str)
}

fn entry_int(entry: &std::collections::BTreeMap<String, AMQPValue>, key: &str) -> Option<i64> {
    entry.get(key).and_then(value_int)
}

fn routing_keys(entry: &std::collections::BTreeMap<String, AMQPValue>) -> Vec<String> {
    match entry.get("routing-keys") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().iter().filter_map(value_str).collect(),
        other => panic!("routing-keys should be an array, is {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// TTL and expiry

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_message_ttl_expires_messages_left_in_the_queue() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-ttl", table(&[("x-message-ttl", int(600))])).await;
        publish(&ch, "", &q, b"fresh").await;
        assert_eq!(drain_strings(&ch, &q).await, ["fresh"], "not expired yet");
        publish(&ch, "", &q, b"stale").await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            get(&ch, &q).await.is_none(),
            "message outlived x-message-ttl"
        );
        assert_eq!(wait_for_message_count(&ch, &q, 0).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_message_ttl_zero_expires_unless_a_consumer_takes_it_at_once() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-ttl0", table(&[("x-message-ttl", int(0))])).await;
        publish(&ch, "", &q, b"nobody there").await;
        assert!(get(&ch, &q).await.is_none());
        let mut c = consume(&ch, &q).await;
        publish(&ch, "", &q, b"delivered").await;
        assert_eq!(body(&c.recv().await), "delivered");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_message_expiration_expires_the_message() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-expiration", FieldTable::default()).await;
        publish_with(
            &ch,
            "",
            &q,
            b"short",
            BasicProperties::default().with_expiration("100".into()),
        )
        .await;
        publish_with(
            &ch,
            "",
            &q,
            b"long",
            BasicProperties::default().with_expiration("60000".into()),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let bodies = drain_strings(&ch, &q).await;
        assert_eq!(bodies, ["long"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shorter_of_queue_ttl_and_message_expiration_wins() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-ttl-min", table(&[("x-message-ttl", int(100))])).await;
        publish_with(
            &ch,
            "",
            &q,
            b"x",
            BasicProperties::default().with_expiration("60000".into()),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            get(&ch, &q).await.is_none(),
            "queue TTL should cap the message's expiration"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_expiration_property_is_refused_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        for bad in ["abc", "-1"] {
            let ch = open_channel(&conn).await;
            let q = declare_queue(&ch, "q-bad-expiration", FieldTable::default()).await;
            let err = publish_fails(
                &ch,
                "",
                &q,
                b"x",
                BasicProperties::default().with_expiration(bad.into()),
            )
            .await;
            assert_reply(&err, 406, &["expiration", bad]);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_expires_deletes_a_queue_once_unused() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-expires", table(&[("x-expires", int(300))])).await;
        // In use by a consumer for longer than x-expires: it stays.
        let c = consume(&ch, &q).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        exists(&ch, &q)
            .await
            .expect("a queue with a consumer does not expire");
        bounded(
            "basic.cancel",
            ch.basic_cancel(c.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("cancel");
        // Any declare, even passive, counts as use and restarts the clock,
        // so look only once, well after the deadline.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let ch = open_channel(&conn).await;
        expect_reply(exists(&ch, &q).await, 404, &[&q]);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Length limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_max_length_drops_from_the_head_by_default() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-maxlen", table(&[("x-max-length", int(2))])).await;
        for i in 0..4 {
            publish(&ch, "", &q, format!("m{i}").as_bytes()).await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["m2", "m3"]);
        let q = declare_queue(
            &ch,
            "q-maxlen-explicit",
            table(&[("x-max-length", int(1)), ("x-overflow", lstr("drop-head"))]),
        )
        .await;
        for i in 0..3 {
            publish(&ch, "", &q, format!("m{i}").as_bytes()).await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["m2"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_max_length_counts_ready_messages_only() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-maxlen-unacked", table(&[("x-max-length", int(1))])).await;
        publish(&ch, "", &q, b"m0").await;
        let held = get(&ch, &q).await.expect("m0");
        publish(&ch, "", &q, b"m1").await;
        publish(&ch, "", &q, b"m2").await;
        assert_eq!(wait_for_message_count(&ch, &q, 1).await, 1);
        held.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        assert_eq!(drain_strings(&ch, &q).await, ["m2"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_max_length_bytes_drops_from_the_head_by_body_size() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-maxbytes", table(&[("x-max-length-bytes", int(10))])).await;
        for b in ["aaaa", "bbbb", "cccc", "dddd"] {
            publish(&ch, "", &q, b.as_bytes()).await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["cccc", "dddd"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_overflow_reject_publish_keeps_the_oldest() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(
            &ch,
            "q-reject-publish",
            table(&[
                ("x-max-length", int(2)),
                ("x-overflow", lstr("reject-publish")),
            ]),
        )
        .await;
        for i in 0..4 {
            publish(&ch, "", &q, format!("m{i}").as_bytes()).await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["m0", "m1"]);
        let q = declare_queue(
            &ch,
            "q-reject-publish-bytes",
            table(&[
                ("x-max-length-bytes", int(8)),
                ("x-overflow", lstr("reject-publish")),
            ]),
        )
        .await;
        for b in ["aaaa", "bbbb", "cccc"] {
            publish(&ch, "", &q, b.as_bytes()).await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["aaaa", "bbbb"]);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Dead-lettering

/// A queue dead-lettering through the default exchange to a fresh queue;
/// returns (source, dead-letter queue).
async fn dead_letter_pair(ch: &Channel, extra: &[(&str, AMQPValue)]) -> (String, String) {
    let dlq = declare_queue(ch, "q-dlq", FieldTable::default()).await;
    let mut args = vec![
        ("x-dead-letter-exchange", lstr("")),
        ("x-dead-letter-routing-key", lstr(&dlq)),
    ];
    args.extend(extra.iter().cloned());
    let src = declare_queue(ch, "q-dl-src", table(&args)).await;
    (src, dlq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_message_is_dead_lettered_with_x_death() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let dlq = declare_queue(&ch, "q-dlq", FieldTable::default()).await;
        let src = declare_queue(
            &ch,
            "q-dl-src",
            table(&[("x-dead-letter-exchange", lstr("amq.direct"))]),
        )
        .await;
        // No routing-key override: the message keeps its own routing key.
        bounded(
            "queue.bind",
            ch.queue_bind(
                dlq.as_str().into(),
                "amq.direct".into(),
                src.as_str().into(),
                Default::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("bind");
        publish_with(
            &ch,
            "",
            &src,
            b"bad",
            BasicProperties::default()
                .with_message_id("id-1".into())
                .with_headers(table(&[("mine", lstr("kept"))])),
        )
        .await;
        let m = get(&ch, &src).await.expect("message");
        m.delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .expect("reject");
        // Dead-lettering is asynchronous to the reject.
        assert_eq!(wait_for_message_count(&ch, &dlq, 1).await, 1);
        let dead = get_no_ack(&ch, &dlq).await.expect("dead-lettered message");
        let d = &dead.delivery;
        assert_eq!(d.data, b"bad");
        assert_eq!(d.exchange.as_str(), "amq.direct");
        assert_eq!(d.routing_key.as_str(), src);
        assert!(!d.redelivered);
        assert_eq!(
            d.properties.message_id().as_ref().map(|s| s.as_str()),
            Some("id-1")
        );
        let headers = headers_of(&d.properties);
        assert_eq!(
            headers.get("mine").and_then(value_str).as_deref(),
            Some("kept")
        );
        assert_eq!(
            headers
                .get("x-first-death-reason")
                .and_then(value_str)
                .as_deref(),
            Some("rejected")
        );
        assert_eq!(
            headers
                .get("x-first-death-queue")
                .and_then(value_str)
                .as_deref(),
            Some(src.as_str())
        );
        assert_eq!(
            headers
                .get("x-first-death-exchange")
                .and_then(value_str)
                .as_deref(),
            Some("")
        );
        let deaths = x_death(&d.properties);
        assert_eq!(deaths.len(), 1, "{deaths:?}");
        let e = &deaths[0];
        assert_eq!(entry_int(e, "count"), Some(1));
        assert_eq!(entry_str(e, "reason").as_deref(), Some("rejected"));
        assert_eq!(entry_str(e, "queue").as_deref(), Some(src.as_str()));
        assert_eq!(entry_str(e, "exchange").as_deref(), Some(""));
        assert_eq!(routing_keys(e), [src.as_str()]);
        assert!(
            matches!(e.get("time"), Some(AMQPValue::Timestamp(_))),
            "time: {:?}",
            e.get("time")
        );
        assert!(get(&ch, &src).await.is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_message_is_dead_lettered_to_the_override_routing_key() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let (src, dlq) = dead_letter_pair(&ch, &[]).await;
        publish(&ch, "", &src, b"m0").await;
        publish(&ch, "", &src, b"m1").await;
        let mut c = consume(&ch, &src).await;
        let ds = c.take(2).await;
        bounded(
            "basic.nack",
            ch.basic_nack(
                ds[1].delivery_tag,
                BasicNackOptions {
                    multiple: true,
                    requeue: false,
                },
            ),
        )
        .await
        .expect("nack");
        assert_eq!(wait_for_message_count(&ch, &dlq, 2).await, 2);
        let first = get_no_ack(&ch, &dlq).await.expect("dead m0");
        assert_eq!(body(&first.delivery), "m0");
        assert_eq!(first.delivery.routing_key.as_str(), dlq);
        let e = &x_death(&first.delivery.properties)[0];
        assert_eq!(entry_str(e, "reason").as_deref(), Some("rejected"));
        // The original routing key is recorded, not the override.
        assert_eq!(routing_keys(e), [src.as_str()]);
        assert_eq!(
            body(&get_no_ack(&ch, &dlq).await.expect("dead m1").delivery),
            "m1"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_message_is_dead_lettered_with_reason_expired() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let (src, dlq) = dead_letter_pair(&ch, &[("x-message-ttl", int(50))]).await;
        publish(&ch, "", &src, b"queue ttl").await;
        let mut c = consume(&ch, &dlq).await;
        let d = c.recv().await;
        assert_eq!(body(&d), "queue ttl");
        let e = &x_death(&d.properties)[0];
        assert_eq!(entry_str(e, "reason").as_deref(), Some("expired"));
        assert_eq!(entry_str(e, "queue").as_deref(), Some(src.as_str()));
        assert_eq!(entry_int(e, "count"), Some(1));

        // A per-message expiration is moved into x-death as original-expiration.
        let (src, dlq) = dead_letter_pair(&ch, &[]).await;
        publish_with(
            &ch,
            "",
            &src,
            b"own ttl",
            BasicProperties::default().with_expiration("50".into()),
        )
        .await;
        let mut c = consume(&ch, &dlq).await;
        let d = c.recv().await;
        assert_eq!(body(&d), "own ttl");
        assert_eq!(
            *d.properties.expiration(),
            None,
            "expiration is removed when dead-lettered"
        );
        let e = &x_death(&d.properties)[0];
        assert_eq!(entry_str(e, "reason").as_deref(), Some("expired"));
        assert_eq!(entry_str(e, "original-expiration").as_deref(), Some("50"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_dropped_by_max_length_is_dead_lettered_with_reason_maxlen() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let (src, dlq) = dead_letter_pair(&ch, &[("x-max-length", int(1))]).await;
        publish(&ch, "", &src, b"m0").await;
        publish(&ch, "", &src, b"m1").await;
        let mut c = consume(&ch, &dlq).await;
        let d = c.recv().await;
        assert_eq!(body(&d), "m0");
        let e = &x_death(&d.properties)[0];
        assert_eq!(entry_str(e, "reason").as_deref(), Some("maxlen"));
        assert_eq!(drain_strings(&ch, &src).await, ["m1"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_dead_lettering_counts_per_queue_and_reason() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let a = unique("q-ping");
        let b = unique("q-pong");
        for (name, other) in [(&a, &b), (&b, &a)] {
            try_declare(
                &ch,
                name,
                false,
                table(&[
                    ("x-dead-letter-exchange", lstr("")),
                    ("x-dead-letter-routing-key", lstr(other)),
                ]),
            )
            .await
            .expect("declare");
        }
        publish(&ch, "", &a, b"ball").await;
        // a -> b -> a -> b, rejecting each time.
        for from in [&a, &b, &a] {
            assert_eq!(
                wait_for_message_count(&ch, from, 1).await,
                1,
                "message should be in {from}"
            );
            let m = get(&ch, from).await.expect("message");
            m.delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .expect("reject");
        }
        assert_eq!(wait_for_message_count(&ch, &b, 1).await, 1);
        let m = get_no_ack(&ch, &b).await.expect("message in b");
        let deaths = x_death(&m.delivery.properties);
        assert_eq!(deaths.len(), 2, "one entry per (queue, reason): {deaths:?}");
        // Most recent first.
        assert_eq!(entry_str(&deaths[0], "queue").as_deref(), Some(a.as_str()));
        assert_eq!(entry_int(&deaths[0], "count"), Some(2));
        assert_eq!(entry_str(&deaths[1], "queue").as_deref(), Some(b.as_str()));
        assert_eq!(entry_int(&deaths[1], "count"), Some(1));
        let headers = headers_of(&m.delivery.properties);
        assert_eq!(
            headers
                .get("x-first-death-queue")
                .and_then(value_str)
                .as_deref(),
            Some(a.as_str())
        );
        delete(&ch, &a).await;
        delete(&ch, &b).await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// Delivery limit and consumer timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_delivery_limit_dead_letters_after_too_many_returns() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let dlq = declare_queue(&ch, "q-dl-limit-dlq", FieldTable::default()).await;
        // RabbitMQ 3.10 honours x-delivery-limit on quorum queues.
        let q = unique("q-delivery-limit");
        try_declare(
            &ch,
            &q,
            true,
            table(&[
                ("x-queue-type", lstr("quorum")),
                ("x-delivery-limit", int(1)),
                ("x-dead-letter-exchange", lstr("")),
                ("x-dead-letter-routing-key", lstr(&dlq)),
            ]),
        )
        .await
        .expect("declare");
        publish(&ch, "", &q, b"poison").await;
        let mut c = consume(&ch, &q).await;
        let first = c.recv().await;
        assert!(!first.redelivered);
        bounded(
            "basic.nack",
            ch.basic_nack(
                first.delivery_tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            ),
        )
        .await
        .expect("nack");
        let second = c.recv().await;
        assert!(second.redelivered);
        assert_eq!(body(&second), "poison");
        bounded(
            "basic.nack",
            ch.basic_nack(
                second.delivery_tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            ),
        )
        .await
        .expect("nack");
        c.expect_quiet().await;
        assert_eq!(
            wait_for_message_count(&ch, &dlq, 1).await,
            1,
            "over the limit: dead-lettered"
        );
        let dead = get_no_ack(&ch, &dlq).await.expect("dead-lettered");
        let e = &x_death(&dead.delivery.properties)[0];
        assert_eq!(entry_str(e, "reason").as_deref(), Some("delivery_limit"));
        delete(&ch, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_consumer_timeout_closes_the_channel_406_and_requeues() {
    within(async {
        let Some(broker) =
            Broker::start_berth_only("RabbitMQ 3.10 has no x-consumer-timeout queue argument")
        else {
            return;
        };
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(
            &ch,
            "q-consumer-timeout",
            table(&[("x-consumer-timeout", int(300))]),
        )
        .await;
        publish(&ch, "", &q, b"slow").await;
        let consumer_ch = open_channel(&conn).await;
        let mut c = consume(&consumer_ch, &q).await;
        let d = c.recv().await;
        assert!(!d.redelivered);
        // Never acked: the broker closes the consumer's channel.
        match c.next_event(Duration::from_secs(10)).await {
            Some(ConsumerEvent::Error(e)) => {
                assert_reply(&e, 406, &["timed out"]);
            }
            other => panic!("expected the channel to be closed with 406, got {other:?}"),
        }
        let m = get_no_ack(&ch, &q)
            .await
            .expect("the message is back in the queue");
        assert!(m.delivery.redelivered);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_wide_consumer_timeout_closes_the_channel_406() {
    within(async {
        let Some(broker) = Broker::start_with_flags(&["--consumer-timeout-ms", "300"]) else {
            return;
        };
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-server-timeout", FieldTable::default()).await;
        publish(&ch, "", &q, b"slow").await;
        publish(&ch, "", &q, b"quick").await;
        // A consumer that acks in time is left alone.
        let quick_ch = open_channel(&conn).await;
        bounded("basic.qos", quick_ch.basic_qos(1, Default::default()))
            .await
            .expect("qos");
        let slow_ch = open_channel(&conn).await;
        bounded("basic.qos", slow_ch.basic_qos(1, Default::default()))
            .await
            .expect("qos");
        let mut slow = consume(&slow_ch, &q).await;
        let _held = slow.recv().await;
        let mut quick = consume(&quick_ch, &q).await;
        let d = quick.recv().await;
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
        match slow.next_event(Duration::from_secs(10)).await {
            Some(ConsumerEvent::Error(e)) => {
                assert_reply(&e, 406, &["timed out"]);
            }
            other => panic!("expected the slow channel to be closed with 406, got {other:?}"),
        }
        // The slow consumer's message goes to the quick one, redelivered.
        let again = quick.recv().await;
        assert_eq!(body(&again), "slow");
        assert!(again.redelivered);
        again
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        assert!(
            quick_ch.status().connected(),
            "the acking consumer's channel stays open"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// Priorities and queue types

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_max_priority_delivers_higher_priorities_first() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-priority", table(&[("x-max-priority", int(10))])).await;
        let published: [(&str, Option<u8>); 7] = [
            ("none", None),
            ("p1", Some(1)),
            ("p5a", Some(5)),
            ("p3", Some(3)),
            ("p9", Some(9)),
            ("p5b", Some(5)),
            ("p200", Some(200)), // above the maximum: treated as the maximum
        ];
        for (name, priority) in published {
            let mut props = BasicProperties::default();
            if let Some(p) = priority {
                props = props.with_priority(p);
            }
            publish_with(&ch, "", &q, name.as_bytes(), props).await;
        }
        assert_eq!(wait_for_message_count(&ch, &q, 7).await, 7);
        assert_eq!(
            drain_strings(&ch, &q).await,
            ["p200", "p9", "p5a", "p5b", "p3", "p1", "none"]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_without_x_max_priority_ignores_priorities() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-no-priority", FieldTable::default()).await;
        for (name, p) in [("low", 1), ("high", 9)] {
            publish_with(
                &ch,
                "",
                &q,
                name.as_bytes(),
                BasicProperties::default().with_priority(p),
            )
            .await;
        }
        assert_eq!(drain_strings(&ch, &q).await, ["low", "high"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_queue_type_classic_and_quorum_are_accepted() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        for (kind, durable) in [("classic", false), ("classic", true), ("quorum", true)] {
            let q = unique("q-type");
            try_declare(&ch, &q, durable, table(&[("x-queue-type", lstr(kind))]))
                .await
                .unwrap_or_else(|e| panic!("x-queue-type {kind} durable={durable}: {e}"));
            publish(&ch, "", &q, kind.as_bytes()).await;
            assert_eq!(wait_for_message_count(&ch, &q, 1).await, 1);
            // A quorum queue hands a message out once its write is
            // durable (fdatasynced): a get at once may find nothing yet.
            let mut got = drain_strings(&ch, &q).await;
            for _ in 0..100 {
                if !got.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                got = drain_strings(&ch, &q).await;
            }
            assert_eq!(got, [kind]);
            delete(&ch, &q).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_durable_quorum_queue_is_refused_406() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = unique("q-quorum-transient");
        let result = try_declare(&ch, &q, false, table(&[("x-queue-type", lstr("quorum"))])).await;
        expect_reply(result, 406, &[&q, "non-durable"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_x_arguments_are_ignored_even_on_redeclare() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = unique("q-unknown-arg");
        try_declare(
            &ch,
            &q,
            false,
            table(&[("x-no-such-argument", lstr("whatever")), ("plain", int(1))]),
        )
        .await
        .expect("unknown arguments are accepted");
        try_declare(&ch, &q, false, table(&[("x-no-such-argument", int(2))]))
            .await
            .expect("and do not make a redeclaration inequivalent");
        delete(&ch, &q).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_queue_argument_values_are_refused_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let cases: Vec<(&str, AMQPValue)> = vec![
            ("x-message-ttl", int(-1)),
            ("x-message-ttl", lstr("soon")),
            ("x-expires", int(0)),
            ("x-expires", int(-5)),
            ("x-expires", lstr("later")),
            ("x-max-length", int(-1)),
            ("x-max-length", lstr("ten")),
            ("x-max-length-bytes", int(-1)),
            ("x-max-length-bytes", AMQPValue::Boolean(true)),
            ("x-overflow", lstr("drop-everything")),
            ("x-overflow", int(1)),
            ("x-dead-letter-exchange", int(1)),
            ("x-max-priority", int(-1)),
            ("x-max-priority", int(256)),
            ("x-max-priority", lstr("high")),
            ("x-queue-type", lstr("no-such-type")),
        ];
        for (arg, value) in cases {
            let ch = open_channel(&conn).await;
            let q = unique("q-bad-arg");
            let result = try_declare(&ch, &q, false, table(&[(arg, value.clone())])).await;
            let err = match result {
                Ok(_) => panic!("{arg} = {value:?} should be refused with 406"),
                Err(e) => e,
            };
            assert_reply(&err, 406, &[arg]);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_routing_key_without_exchange_is_refused_406() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = unique("q-dlrk-alone");
        let result = try_declare(
            &ch,
            &q,
            false,
            table(&[("x-dead-letter-routing-key", lstr("somewhere"))]),
        )
        .await;
        expect_reply(result, 406, &["x-dead-letter-routing-key"]);
    })
    .await;
}
