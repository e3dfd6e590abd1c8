//! Streams (`x-queue-type: stream`) with lapin, a second client library
//! beside the pika tests (`tests/python/test_streams.py`): confirms,
//! offsets in the `x-stream-offset` header, consumers at their own
//! positions on several channels, and RabbitMQ's refusals.

use berth_itest::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use berth_itest::lapin::types::{AMQPValue, FieldTable};
use berth_itest::lapin::{BasicProperties, Channel};
use berth_itest::*;

const DURABLE: QueueDeclareOptions = QueueDeclareOptions {
    passive: false,
    durable: true,
    exclusive: false,
    auto_delete: false,
    nowait: false,
};

async fn declare_stream(ch: &Channel, prefix: &str) -> String {
    let name = unique(prefix);
    bounded(
        "queue.declare",
        ch.queue_declare(
            name.as_str().into(),
            DURABLE,
            table(&[("x-queue-type", lstr("stream"))]),
        ),
    )
    .await
    .expect("declare a stream");
    name
}

async fn publish_all_confirmed(ch: &Channel, queue: &str, n: usize) {
    bounded(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let c = bounded(
            "basic.publish",
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            ),
        )
        .await
        .expect("basic.publish");
        confirms.push(c);
    }
    for c in confirms {
        let c = bounded("confirm", c).await.expect("confirm");
        assert!(c.is_ack(), "message confirmed");
    }
}

/// A consumer on a channel of its own with `prefetch`, from `offset`.
async fn stream_consumer(
    broker: &Broker,
    queue: &str,
    prefetch: u16,
    offset: AMQPValue,
) -> (lapin::Connection, Channel, Deliveries) {
    let (conn, ch) = broker.channel().await;
    bounded(
        "basic.qos",
        ch.basic_qos(prefetch, BasicQosOptions { global: false }),
    )
    .await
    .expect("basic.qos");
    let d = try_consume(
        &ch,
        queue,
        "",
        BasicConsumeOptions::default(),
        table(&[("x-stream-offset", offset)]),
    )
    .await
    .expect("basic.consume");
    (conn, ch, d)
}

/// Takes `n` deliveries, acking each; returns (offset header, body).
async fn take_acked(d: &mut Deliveries, n: usize) -> Vec<(i64, String)> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let m = d.recv().await;
        let offset = headers_of(&m.properties)
            .get("x-stream-offset")
            .and_then(value_int)
            .expect("every delivery carries x-stream-offset");
        out.push((offset, body(&m)));
        m.acker
            .ack(BasicAckOptions::default())
            .await
            .expect("basic.ack");
    }
    out
}

fn expected(range: std::ops::Range<i64>) -> Vec<(i64, String)> {
    range.map(|i| (i, format!("m{i}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_on_several_channels_read_from_their_own_offsets() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_stream(&ch, "stream").await;
        publish_all_confirmed(&ch, &q, 300).await;
        let (_c1, _ch1, mut first) = stream_consumer(&broker, &q, 10, lstr("first")).await;
        let (_c2, _ch2, mut middle) = stream_consumer(&broker, &q, 7, long(120)).await;
        let (_c3, _ch3, mut last) = stream_consumer(&broker, &q, 1, lstr("last")).await;
        assert_eq!(take_acked(&mut first, 300).await, expected(0..300));
        assert_eq!(take_acked(&mut middle, 180).await, expected(120..300));
        assert_eq!(take_acked(&mut last, 1).await, expected(299..300));
        // Nothing more until something is published; then all three see it.
        last.expect_quiet().await;
        let (_cp, pch) = broker.channel().await;
        bounded(
            "basic.publish",
            pch.basic_publish(
                "".into(),
                q.as_str().into(),
                BasicPublishOptions::default(),
                b"m300",
                BasicProperties::default(),
            ),
        )
        .await
        .expect("publish");
        for d in [&mut first, &mut middle, &mut last] {
            assert_eq!(take_acked(d, 1).await, expected(300..301));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holds_no_more_than_its_prefetch_unacked() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_stream(&ch, "stream").await;
        publish_all_confirmed(&ch, &q, 50).await;
        let (_c, _ch, mut d) = stream_consumer(&broker, &q, 5, lstr("first")).await;
        let held = d.take(5).await;
        d.expect_quiet().await;
        for m in held {
            m.acker.ack(BasicAckOptions::default()).await.expect("ack");
        }
        assert_eq!(take_acked(&mut d, 45).await, expected(5..50));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_refusals_of_streams() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("stream");
        let err = bounded(
            "queue.declare",
            ch.queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                table(&[("x-queue-type", lstr("stream"))]),
            ),
        )
        .await
        .expect_err("a non-durable stream is refused");
        assert_reply(&err, 406, &["invalid property 'non-durable'"]);
        let (_conn, ch) = broker.channel().await;
        let q = declare_stream(&ch, "stream").await;
        let err = try_consume(
            &ch,
            &q,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .err()
        .expect("a consume without prefetch is refused");
        assert_reply(&err, 406, &["consumer prefetch count is not set"]);
    })
    .await;
}
