//! What the stream load drivers (`tests/stream_bench.rs`,
//! `tests/stream_rss.rs`) share: a durable stream, confirmed publishers on
//! connections of their own, and the broker's resident memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::{BasicProperties, Channel, Connection};

use crate::{lstr, table, try_consume, Broker, ConsumerEvent};

/// Declares the durable stream `name`.
pub async fn declare_stream(ch: &Channel, name: &str) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        table(&[("x-queue-type", lstr("stream"))]),
    )
    .await
    .expect("declare");
}

/// Starts `publishers` tasks, each on a connection of its own, each
/// publishing `per` persistent copies of `body` to `queue` with confirms,
/// at most `unconfirmed_max` unconfirmed; each task checks every confirm
/// is an ack and ends with its connection.
pub async fn spawn_confirmed_publishers(
    broker: &Broker,
    queue: &str,
    publishers: usize,
    per: usize,
    body: &[u8],
    unconfirmed_max: usize,
) -> Vec<tokio::task::JoinHandle<Connection>> {
    let mut tasks = Vec::new();
    for _ in 0..publishers {
        let conn = broker.connect().await;
        let (queue, body) = (queue.to_owned(), body.to_vec());
        tasks.push(tokio::spawn(async move {
            let ch = conn.create_channel().await.expect("channel");
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm.select");
            let mut window = VecDeque::new();
            for _ in 0..per {
                let c = ch
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .expect("publish");
                window.push_back(c);
                if window.len() >= unconfirmed_max {
                    let c = window.pop_front().expect("non-empty").await;
                    assert!(c.expect("confirm").is_ack());
                }
            }
            for c in window {
                assert!(c.await.expect("confirm").is_ack());
            }
            conn
        }));
    }
    tasks
}

/// Reads `total` messages of stream `queue` from `first` on `ch` with
/// prefetch 500, acking with `multiple` every 100 and at the last;
/// `check(i, delivery)` sees the `i`-th delivery before it is acked. A
/// delivery that does not come within `wait` fails the test.
pub async fn read_from_first(
    ch: &Channel,
    queue: &str,
    total: usize,
    wait: Duration,
    mut check: impl FnMut(usize, &Delivery),
) {
    ch.basic_qos(500, BasicQosOptions { global: false })
        .await
        .expect("qos");
    let mut consumer = try_consume(
        ch,
        queue,
        "",
        BasicConsumeOptions::default(),
        table(&[("x-stream-offset", lstr("first"))]),
    )
    .await
    .expect("consume");
    let mut got = 0usize;
    while got < total {
        let d = match consumer.next_event(wait).await {
            Some(ConsumerEvent::Delivery(d)) => d,
            other => panic!("expected a delivery after {got}, got {other:?}"),
        };
        check(got, &d);
        got += 1;
        if got.is_multiple_of(100) || got == total {
            d.acker
                .ack(BasicAckOptions { multiple: true })
                .await
                .expect("ack");
        }
    }
}

/// Resident memory of process `pid` in MiB (`VmRSS`); 0 once it is gone.
pub fn rss_mb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Samples a process's RSS every 100 ms until [`RssSampler::peak`].
pub struct RssSampler {
    pid: u32,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(rss_mb(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_mb(pid), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        RssSampler {
            pid,
            peak,
            stop,
            task,
        }
    }

    /// Stops sampling; the peak seen, now included.
    pub async fn peak(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler");
        self.peak.load(Ordering::Relaxed).max(rss_mb(self.pid))
    }
}
