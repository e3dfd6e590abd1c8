//! TTLs keep their original expiry across a kill -9 and restart of the
//! real binary over its real store (issue 42): a message of a queue with
//! `x-message-ttl` 3 s, and one with `expiration` 3 s, published 2 s
//! before the kill, expire about 1 s after the restart, not 3 s; one whose
//! 1 s TTL passed while berth was down is dead-lettered (reason
//! `expired`) at start. The message times ride at the head of each stored
//! payload, read with `Store::read_heads` (docs/FORMAT.md, "Message
//! payload"). ~5 s.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

mod common;
use common::{connect, Broker};

const TTL_MS: u64 = 3_000;
const DOWN_AFTER_MS: u64 = 2_000;
/// How late past its TTL the expiry may be seen (timer tick, polling,
/// a loaded machine); a TTL restarted at the restart is 2 s late.
const SLACK_MS: u64 = 1_000;

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        durable: true,
        ..Default::default()
    }
}

fn args(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_keep_their_original_expiry_across_a_kill_and_restart() {
    let dir = common::temp_dir("ttl-restart", 0);
    let mut broker = Broker::start(&[&dir], &[]);
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let ms = |v: u64| AMQPValue::LongLongInt(i64::try_from(v).unwrap());
    let to_dead = |q: &str| {
        [
            ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
            ("x-dead-letter-routing-key", AMQPValue::LongString(q.into())),
        ]
    };
    for q in ["dead", "gone-dead"] {
        ch.queue_declare(q.into(), durable(), FieldTable::default())
            .await
            .unwrap();
    }
    let [a, b] = to_dead("dead");
    ch.queue_declare(
        "ttl".into(),
        durable(),
        args(&[("x-message-ttl", ms(TTL_MS)), a, b]),
    )
    .await
    .unwrap();
    ch.queue_declare("own".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    let [a, b] = to_dead("gone-dead");
    ch.queue_declare(
        "gone".into(),
        durable(),
        args(&[("x-message-ttl", ms(1_000)), a, b]),
    )
    .await
    .unwrap();
    let persistent = BasicProperties::default().with_delivery_mode(2);
    for (q, props) in [
        ("ttl", persistent.clone()),
        (
            "own",
            persistent
                .clone()
                .with_expiration(TTL_MS.to_string().into()),
        ),
        ("gone", persistent),
    ] {
        let c = ch
            .basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                b"m",
                props,
            )
            .await
            .unwrap();
        assert!(c.await.unwrap().is_ack(), "{q}: nacked");
    }
    let published = Instant::now();
    // Down before "gone" expires: it expires while berth is down.
    tokio::time::sleep(Duration::from_millis(800)).await;
    broker.kill9();
    tokio::time::sleep(Duration::from_millis(DOWN_AFTER_MS - 800)).await;

    let broker = Broker::start(&[&dir], &[]);
    let restarted = published.elapsed();
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.unwrap();
    let count = |q: &'static str| {
        let ch = ch.clone();
        async move {
            (ch.queue_declare(q.into(), passive(), FieldTable::default())
                .await)
                .unwrap()
                .message_count()
        }
    };
    assert_eq!(count("gone").await, 0, "expired while down");
    let dead = ch
        .basic_get("gone-dead".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("dead-lettered at start");
    let headers = dead.delivery.properties.headers().clone().unwrap();
    assert_eq!(
        headers.inner().get("x-first-death-reason"),
        Some(&AMQPValue::LongString("expired".into())),
        "{headers:?}"
    );
    assert!(
        restarted < Duration::from_millis(TTL_MS - 200),
        "restarted {restarted:?} after the publish, too close to the TTL to tell"
    );
    assert_eq!(
        (count("ttl").await, count("own").await),
        (1, 1),
        "not before their TTL"
    );
    let deadline = published + Duration::from_millis(TTL_MS + SLACK_MS);
    let mut left = (1, 1);
    while Instant::now() < deadline && left != (0, 0) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = (count("ttl").await, count("own").await);
    }
    let at = published.elapsed();
    assert_eq!(
        left,
        (0, 0),
        "(ttl, own) still held {at:?} after the publish, restarted after {restarted:?}: \
         TTLs restarted at the restart?\n{}",
        broker.log_tail()
    );
    assert!(
        at >= Duration::from_millis(TTL_MS - 100),
        "expired at {at:?}, before the TTL"
    );
    assert_eq!(
        count("dead").await,
        1,
        "the ttl queue's message dead-lettered"
    );
    eprintln!("restarted after {restarted:?}; expired by {at:?} (TTL {TTL_MS} ms)");
}
