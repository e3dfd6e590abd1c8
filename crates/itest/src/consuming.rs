//! Consumers whose deliveries arrive in broker order on a tokio channel.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{bounded, EVENT_TIMEOUT, QUIET_PERIOD};

pub use lapin;
use lapin::message::{Delivery, DeliveryResult};
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use lapin::{Channel, ConsumerDelegate};
use tokio::sync::mpsc as tmpsc;

/// What a consumer observes, in the order the broker sent it.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// A `basic.deliver`.
    Delivery(Box<Delivery>),
    /// The consumer was cancelled (by `basic.cancel` from the broker, or
    /// because the channel closed).
    Cancelled,
    /// An error ended the consumer.
    Error(lapin::Error),
}

/// A consumer whose deliveries arrive, in broker order, on a tokio channel.
///
/// lapin's delegate is called synchronously from its reader for each
/// delivery; forwarding there (rather than in the spawned future) keeps the
/// order the broker sent.
pub struct Deliveries {
    /// The consumer tag (server-generated when none was given).
    pub tag: String,
    events: tmpsc::UnboundedReceiver<ConsumerEvent>,
}

struct Forwarder(tmpsc::UnboundedSender<ConsumerEvent>);

impl ConsumerDelegate for Forwarder {
    fn on_new_delivery(
        &self,
        delivery: DeliveryResult,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let event = match delivery {
            Ok(Some(d)) => ConsumerEvent::Delivery(Box::new(d)),
            Ok(None) => ConsumerEvent::Cancelled,
            Err(e) => ConsumerEvent::Error(e),
        };
        let _ = self.0.send(event);
        Box::pin(std::future::ready(()))
    }
}

/// Starts a consumer; the result is the broker's answer to `basic.consume`.
pub async fn try_consume(
    ch: &Channel,
    queue: &str,
    tag: &str,
    options: BasicConsumeOptions,
    args: FieldTable,
) -> lapin::Result<Deliveries> {
    let consumer = bounded(
        "basic.consume",
        ch.basic_consume(queue.into(), tag.into(), options, args),
    )
    .await?;
    let (tx, rx) = tmpsc::unbounded_channel();
    let tag = consumer.tag().to_string();
    consumer.set_delegate(Forwarder(tx));
    Ok(Deliveries { tag, events: rx })
}

/// Starts a consumer with acks and a server-generated tag.
pub async fn consume(ch: &Channel, queue: &str) -> Deliveries {
    try_consume(
        ch,
        queue,
        "",
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("basic.consume {queue}: {e}"))
}

impl Deliveries {
    /// The next event, or `None` after `wait` with nothing.
    pub async fn next_event(&mut self, wait: Duration) -> Option<ConsumerEvent> {
        tokio::time::timeout(wait, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next delivery; fails the test if none comes within [`EVENT_TIMEOUT`].
    #[track_caller]
    pub fn recv(&mut self) -> impl Future<Output = Delivery> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.next_event(EVENT_TIMEOUT).await {
                Some(ConsumerEvent::Delivery(d)) => *d,
                other => panic!("expected a delivery (at {caller}), got {other:?}"),
            }
        }
    }

    /// `n` deliveries in order.
    pub async fn take(&mut self, n: usize) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.recv().await);
        }
        out
    }

    /// Asserts that nothing arrives for [`QUIET_PERIOD`].
    #[track_caller]
    pub fn expect_quiet(&mut self) -> impl Future<Output = ()> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            if let Some(e) = self.next_event(QUIET_PERIOD).await {
                panic!("expected no consumer event (at {caller}), got {e:?}");
            }
        }
    }

    /// Waits for the consumer to be cancelled (skipping nothing: a delivery
    /// first is a failure).
    #[track_caller]
    pub fn expect_cancelled(&mut self) -> impl Future<Output = ()> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.next_event(EVENT_TIMEOUT).await {
                Some(ConsumerEvent::Cancelled) => {}
                other => panic!("expected a cancel notification (at {caller}), got {other:?}"),
            }
        }
    }
}

/// The body of a delivery as a string.
pub fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

/// The bodies of deliveries as strings.
pub fn bodies(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(body).collect()
}
