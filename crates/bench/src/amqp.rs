//! Thin helpers over lapin: connect, declare, depth by passive declare,
//! persistent publishes, and message bodies that carry their send time.
//!
//! Everything here works against any AMQP 0-9-1 broker: depths come from a
//! passive `queue.declare` (its `message-count`), never from a management API.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub use crate::uri::redact;
use crate::BenchError;

/// Attaches what we were doing to a lapin error.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: impl Into<String>) -> Result<T, BenchError>;
}

impl<T> Ctx<T> for Result<T, lapin::Error> {
    fn ctx(self, what: impl Into<String>) -> Result<T, BenchError> {
        self.map_err(|source| BenchError::Amqp {
            context: what.into(),
            source,
        })
    }
}

/// Opens a connection named after the bench role (visible in the broker's
/// connection list).
pub async fn connect(uri: &str, role: &str) -> Result<Connection, BenchError> {
    Connection::connect(
        uri,
        ConnectionProperties::default().with_connection_name(format!("berth-bench {role}").into()),
    )
    .await
    .ctx(format!("connect to {} as {role}", redact(uri)))
}

/// A connection with one channel, optionally in confirm mode.
pub async fn connect_channel(
    uri: &str,
    role: &str,
    confirms: bool,
) -> Result<(Connection, Channel), BenchError> {
    let conn = connect(uri, role).await?;
    let ch = conn.create_channel().await.ctx("open channel")?;
    if confirms {
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .ctx("confirm.select")?;
    }
    Ok((conn, ch))
}

/// Closes a connection, ignoring a peer that is already gone (the bench is
/// finished with it either way; nothing durable depends on the close).
pub async fn close(conn: &Connection) {
    if conn.status().connected() {
        // A failed close of a finished connection has no consequence for
        // the measurement; the broker cleans up on socket close.
        conn.close(200, "bench done".into()).await.ok();
    }
}

pub async fn declare_durable(ch: &Channel, queue: &str) -> Result<(), BenchError> {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .ctx(format!("declare queue {queue}"))?;
    Ok(())
}

/// The queue's ready-message count, by passive declare.
pub async fn depth(ch: &Channel, queue: &str) -> Result<u64, BenchError> {
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
        .ctx(format!("passive declare of {queue}"))?;
    Ok(u64::from(q.message_count()))
}

/// Deletes a queue; returns the messages it still held.
pub async fn delete(ch: &Channel, queue: &str) -> Result<u64, BenchError> {
    let n = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
        .ctx(format!("delete queue {queue}"))?;
    Ok(u64::from(n))
}

/// Persistent (delivery-mode 2) properties.
#[must_use]
pub fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// Publishes `body` persistently to `queue` through the default exchange.
/// The returned confirm resolves when the broker acks it (in confirm mode).
pub async fn publish(
    ch: &Channel,
    queue: &str,
    body: &[u8],
) -> Result<lapin::PublisherConfirm, BenchError> {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body,
        persistent(),
    )
    .await
    .ctx(format!("publish to {queue}"))
}

/// Waits for a publisher confirm; a nack is an error (the broker refused to
/// take responsibility for the message).
pub async fn confirmed(confirm: lapin::PublisherConfirm) -> Result<(), BenchError> {
    match confirm.await.ctx("publisher confirm")? {
        lapin::Confirmation::Ack(_) | lapin::Confirmation::NotRequested => Ok(()),
        lapin::Confirmation::Nack(_) => {
            Err(BenchError::Accounting("broker nacked a publish".into()))
        }
    }
}

/// Connects a [`Publisher`](crate::publisher::Publisher) as `role` and
/// publishes `n` persistent copies of `body` to `queue` with at most
/// `window` confirms outstanding, ticking `pb` per confirm; returns
/// (published, confirmed).
pub async fn publish_windowed(
    uri: &str,
    role: &str,
    queue: &str,
    body: &[u8],
    n: u64,
    window: usize,
    pb: &indicatif::ProgressBar,
) -> Result<(u64, u64), BenchError> {
    let mut p = crate::publisher::Publisher::connect(uri, role).await?;
    let template = crate::publisher::PublishTemplate::new(queue, body, p.frame_max())?;
    let counts = p.publish_windowed(&template, n, window as u64, pb).await?;
    p.close().await?;
    Ok(counts)
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Microseconds since the process's bench epoch (monotonic); 0 is reserved
/// for "no timestamp" (backlog messages).
#[must_use]
pub fn now_us() -> u64 {
    u64::try_from(epoch().elapsed().as_micros()).unwrap_or(u64::MAX) + 1
}

/// A body of `size` bytes (at least 8) whose first 8 bytes are `stamp_us`.
#[must_use]
pub fn body(size: usize, stamp_us: u64) -> Vec<u8> {
    let mut b = vec![b'x'; size.max(8)];
    b[..8].copy_from_slice(&stamp_us.to_le_bytes());
    b
}

/// The stamp written by [`body`], if the body has one.
#[must_use]
pub fn stamp_of(body: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = body.get(..8)?.try_into().ok()?;
    match u64::from_le_bytes(bytes) {
        0 => None,
        s => Some(s),
    }
}

/// Milliseconds as f64 from a duration.
#[must_use]
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A name unique to this process and call, so that runs sharing a broker
/// never touch each other's queues.
#[must_use]
pub fn unique_prefix(scenario: &str) -> String {
    format!(
        "berth-bench-{scenario}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_carries_its_stamp_and_backlog_has_none() {
        let b = body(1024, 12345);
        assert_eq!(b.len(), 1024);
        assert_eq!(stamp_of(&b), Some(12345));
        assert_eq!(stamp_of(&body(16, 0)), None);
        assert_eq!(stamp_of(b"short"), None);
    }

    #[test]
    fn redact_hides_password() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }
}
