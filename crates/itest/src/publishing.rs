//! Publishing, getting and counting messages.

use std::time::{Duration, Instant};

use crate::{bounded, unique, EVENT_TIMEOUT};

pub use lapin;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel};

/// Publishes `body` with default properties, without mandatory.
pub async fn publish(ch: &Channel, exchange: &str, routing_key: &str, body: &[u8]) {
    publish_with(ch, exchange, routing_key, body, BasicProperties::default()).await;
}

/// Publishes `body` with `props`, without mandatory.
pub async fn publish_with(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) {
    bounded(
        "basic.publish",
        ch.basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key),
            BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
}

/// Declares a fresh, unique, non-durable queue with `args`; returns its name.
pub async fn declare_queue(ch: &Channel, prefix: &str, args: FieldTable) -> String {
    let name = unique(prefix);
    bounded(
        "queue.declare",
        ch.queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                auto_delete: false,
                ..QueueDeclareOptions::default()
            },
            args,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("queue.declare {name}: {e}"));
    name
}

/// `basic.get` with acks; `None` means get-empty.
pub async fn get(ch: &Channel, queue: &str) -> Option<BasicGetMessage> {
    bounded(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .expect("basic.get")
}

/// `basic.get` with no-ack; `None` means get-empty.
pub async fn get_no_ack(ch: &Channel, queue: &str) -> Option<BasicGetMessage> {
    bounded(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
}

/// Drains `queue` with no-ack gets and returns the bodies in order.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    while let Some(m) = get_no_ack(ch, queue).await {
        bodies.push(m.delivery.data);
    }
    bodies
}

/// Drains `queue` and returns the bodies as strings.
pub async fn drain_strings(ch: &Channel, queue: &str) -> Vec<String> {
    drain(ch, queue)
        .await
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// Polls `queue` with `queue.declare passive` until it holds `count`
/// messages or [`EVENT_TIMEOUT`] passes; returns the last count seen.
pub async fn wait_for_message_count(ch: &Channel, queue: &str, count: u32) -> u32 {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue.declare passive");
        if q.message_count() == count || Instant::now() >= deadline {
            return q.message_count();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
