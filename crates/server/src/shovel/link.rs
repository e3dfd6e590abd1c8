//! One run of a shovel: connect to a source and a destination URI (the
//! first of each list that answers), declare what RabbitMQ's shovel
//! declares, then move messages until a connection fails, the shovel is
//! stopped, or `src-delete-after` is reached. Both ends are ordinary AMQP
//! 0-9-1 clients (lapin), even when an end is this berth.
//!
//! Invariants:
//! - `on-confirm`: a source message is acknowledged only after the
//!   destination confirmed it, in delivery order; anything not yet
//!   acknowledged goes back to the source queue when the source connection
//!   ends, so a failure of either end loses nothing and may duplicate what
//!   was confirmed but not yet acknowledged.
//! - At most `src-prefetch-count` messages are in flight (the source's
//!   prefetch bounds what this task holds; `no-ack` consumes with the same
//!   prefetch and is unbounded only by the source's own flow control).
//! - Every connect and declare is bounded by `SHOVEL_CONNECT_TIMEOUT_MS`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::definition::{redact, AckMode, Definition, Destination, Kind, Source};
use super::status::{State, Status};
use crate::limits::{SHOVEL_CLOSE_TIMEOUT_MS, SHOVEL_CONNECT_TIMEOUT_MS};

/// How a run ended.
#[derive(Debug)]
pub enum Ended {
    /// A connection, a declaration or a publish failed: retried after the
    /// reconnect delay.
    Failed(String),
    /// The shovel was deleted or changed, or the broker stops.
    Stopped,
    /// `src-delete-after` reached: the shovel deletes itself.
    Done,
}

/// What a run needs besides the definition.
pub struct Run<'a> {
    pub def: &'a Definition,
    pub status: &'a Mutex<Status>,
    pub stop: &'a mut watch::Receiver<bool>,
    /// `shovelled-by` of the forward headers.
    pub node: &'a str,
    /// Which URI of each list to try first (moved on after a failure).
    pub first_uri: usize,
    /// Messages left to move under `src-delete-after` (none: unlimited);
    /// fixed at the first start for `queue-length`.
    pub remaining: &'a mut Option<u64>,
}

fn timeout() -> Duration {
    Duration::from_millis(SHOVEL_CONNECT_TIMEOUT_MS)
}

/// Connects to the first of `uris` (from `first`) that answers.
async fn connect(
    uris: &[String],
    first: usize,
    end: &str,
    name: &str,
) -> Result<(Connection, String), String> {
    let mut errors = Vec::new();
    for i in 0..uris.len() {
        let uri = &uris[(first + i) % uris.len()];
        let props = ConnectionProperties::default()
            .with_connection_name(format!("Shovel {name} ({end})").into());
        let key = if end == "source" {
            "src-uri"
        } else {
            "dest-uri"
        };
        let connecting = async {
            match super::tls::Params::of(key, uri)? {
                Some(tls) => super::tls::connect(key, uri, &tls, props).await,
                None => Connection::connect(uri, props)
                    .await
                    .map_err(|e| e.to_string()),
            }
        };
        match tokio::time::timeout(timeout(), connecting).await {
            Ok(Ok(c)) => return Ok((c, uri.clone())),
            Ok(Err(e)) => errors.push(format!("{}: {e}", redact(uri))),
            Err(_) => errors.push(format!(
                "{}: no answer within {SHOVEL_CONNECT_TIMEOUT_MS} ms",
                redact(uri)
            )),
        }
    }
    Err(format!("{end}: cannot connect: {}", errors.join("; ")))
}

/// `what` within the connect timeout, its error text prefixed by `end`.
async fn bounded<T>(
    end: &str,
    what: &str,
    f: impl std::future::Future<Output = lapin::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout(), f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("{end}: {what}: {e}")),
        Err(_) => Err(format!(
            "{end}: {what}: no answer within {SHOVEL_CONNECT_TIMEOUT_MS} ms"
        )),
    }
}

/// RabbitMQ's shovel declares a missing queue durable and uses an existing
/// one as it is (a passive declare first, on a channel of its own since a
/// missing queue closes it). Returns the queue's message count.
async fn ensure_queue(conn: &Connection, end: &str, queue: &str) -> Result<u32, String> {
    let probe = bounded(end, "channel.open", conn.create_channel()).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let found = tokio::time::timeout(
        timeout(),
        probe.queue_declare(queue.into(), passive, FieldTable::default()),
    )
    .await;
    if let Ok(Ok(q)) = found {
        let _closed_or_not_it_is_dropped = probe.close(200, "OK".into()).await;
        return Ok(q.message_count());
    }
    let ch = bounded(end, "channel.open", conn.create_channel()).await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let q = bounded(
        end,
        &format!("queue.declare '{queue}'"),
        ch.queue_declare(queue.into(), durable, FieldTable::default()),
    )
    .await?;
    let _closed_or_not_it_is_dropped = ch.close(200, "OK".into()).await;
    Ok(q.message_count())
}

/// The source side, ready to consume: its channel, the queue and its
/// message count at the start.
async fn open_source(
    def: &Definition,
    conn: &Connection,
) -> Result<(Channel, String, u32), String> {
    let end = "source";
    let (queue, count) = match &def.source {
        Source::Queue(q) => (q.clone(), ensure_queue(conn, end, q).await?),
        Source::Exchange { .. } => (String::new(), 0),
    };
    let ch = bounded(end, "channel.open", conn.create_channel()).await?;
    let queue = match &def.source {
        Source::Queue(_) => queue,
        Source::Exchange { exchange, key } => {
            let exclusive = QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            };
            let q = bounded(
                end,
                "queue.declare",
                ch.queue_declare("".into(), exclusive, FieldTable::default()),
            )
            .await?;
            let name = q.name().to_string();
            bounded(
                end,
                &format!("queue.bind to exchange '{exchange}'"),
                ch.queue_bind(
                    name.as_str().into(),
                    exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await?;
            name
        }
    };
    bounded(
        end,
        "basic.qos",
        ch.basic_qos(def.prefetch_count, BasicQosOptions::default()),
    )
    .await?;
    Ok((ch, queue, count))
}

async fn open_destination(def: &Definition, conn: &Connection) -> Result<Channel, String> {
    let end = "destination";
    if let Destination::Queue(q) = &def.destination {
        ensure_queue(conn, end, q).await?;
    }
    let ch = bounded(end, "channel.open", conn.create_channel()).await?;
    if def.ack_mode == AckMode::OnConfirm {
        bounded(
            end,
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
    }
    Ok(ch)
}

/// Closes `conn`, bounded (what it had not acknowledged is requeued by
/// its broker).
async fn close(conn: &Connection) {
    let closing = conn.close(200, "shovel stopped".into());
    let _late_or_failed_close_is_dropped =
        tokio::time::timeout(Duration::from_millis(SHOVEL_CLOSE_TIMEOUT_MS), closing).await;
}

impl Run<'_> {
    /// Connects, declares and moves messages until the run ends.
    pub async fn run(&mut self) -> Ended {
        let def = self.def;
        let connected = tokio::select! {
            r = connect_both(def, self.first_uri) => r,
            _ = self.stop.changed() => return Ended::Stopped,
        };
        let (src, dest, src_uri, dest_uri, (src_ch, queue, count), dest_ch) = match connected {
            Ok(c) => c,
            Err(why) => return Ended::Failed(why),
        };
        if self.remaining.is_none() {
            *self.remaining = match def.delete_after {
                super::definition::DeleteAfter::Never => None,
                super::definition::DeleteAfter::QueueLength => Some(u64::from(count)),
                super::definition::DeleteAfter::Count(n) => Some(n),
            };
        }
        let ended = if *self.remaining == Some(0) {
            Ended::Done
        } else {
            let headers = Forwarding::new(def, self.node, &src_uri, &dest_uri);
            self.status.lock().set(State::Running {
                src_uri: src_uri.clone(),
                dest_uri: dest_uri.clone(),
            });
            tracing::info!(vhost = %def.vhost, shovel = %def.name,
                src = %redact(&src_uri), dest = %redact(&dest_uri), "shovel running");
            self.pump(&src_ch, &queue, &dest_ch, &headers).await
        };
        close(&src).await;
        close(&dest).await;
        ended
    }
}

/// Both ends connected and declared: the connections, the URIs used, the
/// source channel with its queue and message count, the destination
/// channel.
#[allow(clippy::type_complexity)]
async fn connect_both(
    def: &Definition,
    first_uri: usize,
) -> Result<
    (
        Connection,
        Connection,
        String,
        String,
        (Channel, String, u32),
        Channel,
    ),
    String,
> {
    let (src, src_uri) = connect(&def.src_uris, first_uri, "source", &def.name).await?;
    let (dest, dest_uri) = match connect(&def.dest_uris, first_uri, "destination", &def.name).await
    {
        Ok(d) => d,
        Err(e) => {
            close(&src).await;
            return Err(e);
        }
    };
    let opened = async {
        let d = open_destination(def, &dest).await?;
        let s = open_source(def, &src).await?;
        Ok::<_, String>((s, d))
    }
    .await;
    match opened {
        Ok((s, d)) => Ok((src, dest, src_uri, dest_uri, s, d)),
        Err(e) => {
            close(&src).await;
            close(&dest).await;
            Err(e)
        }
    }
}

impl Run<'_> {
    /// Moves messages from `queue` on `src` to `dest` until something
    /// ends the run.
    async fn pump(
        &mut self,
        src: &Channel,
        queue: &str,
        dest: &Channel,
        fwd: &Forwarding,
    ) -> Ended {
        let def = self.def;
        let no_ack = def.ack_mode == AckMode::NoAck;
        let consume = BasicConsumeOptions {
            no_ack,
            ..BasicConsumeOptions::default()
        };
        let tag = format!("berth-shovel-{}", def.name);
        let tag = ShortString::try_new(tag).unwrap_or_else(|_| "berth-shovel".into());
        let mut consumer = match bounded(
            "source",
            &format!("basic.consume from '{queue}'"),
            src.basic_consume(queue.into(), tag, consume, FieldTable::default()),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => return Ended::Failed(e),
        };
        // Confirms owed by the destination, in publish order, with the
        // source delivery tag each one acknowledges.
        let mut owed: FuturesOrdered<_> = FuturesOrdered::new();
        loop {
            if *self.remaining == Some(0) && owed.is_empty() {
                return Ended::Done;
            }
            // Under `src-delete-after`, no more in flight than is left.
            let room = self
                .remaining
                .is_none_or(|left| left > u64::try_from(owed.len()).unwrap_or(u64::MAX));
            let event = tokio::select! {
                _ = self.stop.changed() => Event::Stop,
                d = consumer.next(), if room => Event::Delivery(d),
                c = owed.next(), if !owed.is_empty() => Event::Settled(c),
            };
            let delivery = match event {
                Event::Stop => return Ended::Stopped,
                Event::Delivery(Some(Ok(d))) => d,
                Event::Delivery(Some(Err(e))) => return Ended::Failed(format!("source: {e}")),
                Event::Delivery(None) => {
                    return Ended::Failed("source: the consumer was cancelled".into())
                }
                Event::Settled(None) => continue,
                Event::Settled(Some(first)) => {
                    // Settle every confirm already in, with one ack.
                    let mut settled = vec![first];
                    while let Some(Some(more)) = owed.next().now_or_never() {
                        settled.push(more);
                    }
                    if let Err(e) = self.acknowledge(src, settled).await {
                        return Ended::Failed(e);
                    }
                    continue;
                }
            };
            let (exchange, key) = fwd.target(&delivery.exchange, &delivery.routing_key);
            let props = fwd.properties(delivery.properties.clone());
            let published = dest
                .basic_publish(
                    exchange,
                    key,
                    BasicPublishOptions::default(),
                    &delivery.data,
                    props,
                )
                .await;
            let confirm = match published {
                Ok(c) => c,
                Err(e) => return Ended::Failed(format!("destination: basic.publish: {e}")),
            };
            match def.ack_mode {
                AckMode::OnConfirm => owed.push_back(settle(delivery.delivery_tag, confirm)),
                AckMode::OnPublish => {
                    let acked = src
                        .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                        .await;
                    if let Err(e) = acked {
                        return Ended::Failed(format!("source: basic.ack: {e}"));
                    }
                    self.moved(1);
                }
                AckMode::NoAck => self.moved(1),
            }
        }
    }

    /// Acknowledges (or, for a destination nack, rejects back to the
    /// queue) settled publishes at the source, in order.
    async fn acknowledge(
        &mut self,
        src: &Channel,
        settled: Vec<(u64, Result<bool, String>)>,
    ) -> Result<(), String> {
        let mut ack_upto = None;
        let mut acked = 0;
        for (tag, result) in settled {
            match result {
                Ok(true) => {
                    ack_upto = Some(tag);
                    acked += 1;
                }
                Ok(false) => {
                    self.flush_acks(src, &mut ack_upto, &mut acked).await?;
                    let requeue = BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    };
                    src.basic_nack(tag, requeue)
                        .await
                        .map_err(|e| format!("source: basic.nack: {e}"))?;
                }
                Err(e) => return Err(format!("destination: {e}")),
            }
        }
        self.flush_acks(src, &mut ack_upto, &mut acked).await
    }

    async fn flush_acks(
        &mut self,
        src: &Channel,
        upto: &mut Option<u64>,
        count: &mut u64,
    ) -> Result<(), String> {
        if let Some(tag) = upto.take() {
            src.basic_ack(tag, BasicAckOptions { multiple: true })
                .await
                .map_err(|e| format!("source: basic.ack: {e}"))?;
            self.moved(*count);
            *count = 0;
        }
        Ok(())
    }

    fn moved(&mut self, n: u64) {
        self.status.lock().moved += n;
        if let Some(left) = self.remaining.as_mut() {
            *left = left.saturating_sub(n);
        }
    }
}

/// What woke the pump.
enum Event<D, S> {
    Stop,
    Delivery(Option<lapin::Result<D>>),
    Settled(Option<S>),
}

/// A publish's outcome with the source delivery tag it settles: `true`
/// confirmed, `false` nacked by the destination.
async fn settle(tag: u64, confirm: PublisherConfirm) -> (u64, Result<bool, String>) {
    let r = confirm.await.map(|c| c.is_ack()).map_err(|e| e.to_string());
    (tag, r)
}

/// Where and how a delivery is published: the destination's exchange and
/// key, and the headers RabbitMQ's shovel adds.
struct Forwarding {
    destination: Destination,
    /// `x-shovelled` entry, when `add-forward-headers`.
    shovelled: Option<FieldTable>,
    timestamp: bool,
}

impl Forwarding {
    fn new(def: &Definition, node: &str, src_uri: &str, dest_uri: &str) -> Self {
        let shovelled = def.add_forward_headers.then(|| {
            let mut t = FieldTable::default();
            let mut put = |k: &str, v: &str| {
                t.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
            };
            put("shovelled-by", node);
            put("shovel-type", def.kind.as_str());
            put("shovel-name", &def.name);
            if def.kind == Kind::Dynamic {
                put("shovel-vhost", &def.vhost);
            }
            put("src-uri", &redact(src_uri));
            put("dest-uri", &redact(dest_uri));
            match &def.source {
                Source::Queue(q) => put("src-queue", q),
                Source::Exchange { exchange, key } => {
                    put("src-exchange", exchange);
                    put("src-exchange-key", key);
                }
            }
            match &def.destination {
                Destination::Queue(q) => put("dest-queue", q),
                Destination::Exchange { exchange, key } => {
                    put("dest-exchange", exchange);
                    if let Some(k) = key {
                        put("dest-exchange-key", k);
                    }
                }
                Destination::AsReceived => {}
            }
            t
        });
        Self {
            destination: def.destination.clone(),
            shovelled,
            timestamp: def.add_timestamp_header,
        }
    }

    fn target(&self, exchange: &ShortString, key: &ShortString) -> (ShortString, ShortString) {
        match &self.destination {
            Destination::Queue(q) => ("".into(), q.as_str().into()),
            Destination::Exchange {
                exchange: x,
                key: k,
            } => (
                x.as_str().into(),
                k.as_ref()
                    .map_or_else(|| key.clone(), |k| k.as_str().into()),
            ),
            Destination::AsReceived => (exchange.clone(), key.clone()),
        }
    }

    fn properties(&self, props: BasicProperties) -> BasicProperties {
        if self.shovelled.is_none() && !self.timestamp {
            return props;
        }
        let mut headers = props.headers().clone().unwrap_or_default();
        if let Some(entry) = &self.shovelled {
            // Prepended: the newest hop first, as RabbitMQ does.
            let mut hops = vec![AMQPValue::FieldTable(entry.clone())];
            if let Some(AMQPValue::FieldArray(old)) = headers.inner().get("x-shovelled") {
                hops.extend(old.as_slice().iter().cloned());
            }
            headers.insert(
                "x-shovelled".into(),
                AMQPValue::FieldArray(FieldArray::from(hops)),
            );
        }
        if self.timestamp {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            headers.insert(
                "x-shovelled-timestamp".into(),
                AMQPValue::LongLongInt(i64::try_from(now).unwrap_or(i64::MAX)),
            );
        }
        props.with_headers(headers)
    }
}

/// Shared so the registry can read it while the run writes it.
pub type SharedStatus = Arc<Mutex<Status>>;
