//! Driver of `scripts/stream-rss.sh` (issue 18: "a stream of 10× RAM can
//! be read from `first` with bounded RSS"); not a timed test (`#[ignore]`).
//! The script starts berth in a memory-limited cgroup and runs this
//! against it:
//!
//!     BERTH_TEST_URI=amqp://... BERTH_RSS_PID=PID STREAM_RSS_BYTES=... \
//!     STREAM_RSS_BODY_BYTES=... cargo test --release -p berth-itest \
//!         --test stream_rss -- --ignored --nocapture
//!
//! 1. Fills one stream with `STREAM_RSS_BYTES` of bodies of
//!    `STREAM_RSS_BODY_BYTES` (4 confirmed publishers, 100 unconfirmed
//!    each).
//! 2. One consumer reads all of it from `first` (prefetch 500, an ack
//!    with `multiple` every 100), checking that every offset comes once and
//!    in order.
//!
//! Samples the broker's VmRSS every 100 ms in each phase and prints one
//! `RESULT` line per phase.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_itest::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use berth_itest::lapin::types::AMQPValue;
use berth_itest::lapin::BasicProperties;
use berth_itest::*;

const PUBLISHERS: usize = 4;
const UNCONFIRMED_MAX: usize = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_mb(pid: u32) -> u64 {
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

/// Samples RSS until stopped; the peak.
struct Sampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
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
        Sampler { peak, stop, task }
    }

    async fn peak(self, pid: u32) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler");
        self.peak.load(Ordering::Relaxed).max(rss_mb(pid))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "run by scripts/stream-rss.sh"]
async fn a_large_stream_is_read_from_first_with_bounded_rss() {
    let bytes = env_u64("STREAM_RSS_BYTES", 256 << 20);
    let body_bytes = env_u64("STREAM_RSS_BODY_BYTES", 1000) as usize;
    let pid = u32::try_from(env_u64("BERTH_RSS_PID", 0)).expect("pid");
    assert!(pid > 0, "BERTH_RSS_PID names the broker");
    let n = usize::try_from(bytes).expect("fits") / body_bytes;
    let per = n / PUBLISHERS;
    let total = per * PUBLISHERS;
    let broker = Broker::start();
    let (_c, ch) = broker.channel().await;
    let q = unique("rss-stream");
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        table(&[("x-queue-type", lstr("stream"))]),
    )
    .await
    .expect("declare");
    // A line of its own: the test harness has written "test ... " before.
    println!("\nRESULT start rss_mb={}", rss_mb(pid));

    // 1. Fill.
    let sampler = Sampler::start(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PUBLISHERS {
        let conn = broker.connect().await;
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let ch = conn.create_channel().await.expect("channel");
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm.select");
            let body = vec![b'r'; body_bytes];
            let mut window = std::collections::VecDeque::new();
            for _ in 0..per {
                let c = ch
                    .basic_publish(
                        "".into(),
                        q.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .expect("publish");
                window.push_back(c);
                if window.len() >= UNCONFIRMED_MAX {
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
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.expect("publisher"));
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT fill messages={total} body_bytes={body_bytes} stream_mb={} secs={secs:.1} msg_s={:.0} peak_rss_mb={}",
        (total * body_bytes) >> 20,
        total as f64 / secs,
        sampler.peak(pid).await
    );
    drop(conns);

    // 2. Read it all from first.
    let before = rss_mb(pid);
    let sampler = Sampler::start(pid);
    let t0 = Instant::now();
    let conn = broker.connect().await;
    let rch = conn.create_channel().await.expect("channel");
    rch.basic_qos(500, BasicQosOptions { global: false })
        .await
        .expect("qos");
    let mut consumer = try_consume(
        &rch,
        &q,
        "",
        BasicConsumeOptions::default(),
        table(&[("x-stream-offset", lstr("first"))]),
    )
    .await
    .expect("consume");
    let mut got = 0usize;
    while got < total {
        let d = match consumer.next_event(Duration::from_secs(60)).await {
            Some(ConsumerEvent::Delivery(d)) => d,
            other => panic!("expected a delivery after {got}, got {other:?}"),
        };
        let offset = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-stream-offset").cloned());
        assert_eq!(
            offset,
            Some(AMQPValue::LongLongInt(i64::try_from(got).expect("fits"))),
            "offsets come once each, in order"
        );
        assert_eq!(d.data.len(), body_bytes);
        got += 1;
        if got.is_multiple_of(100) || got == total {
            d.acker
                .ack(BasicAckOptions { multiple: true })
                .await
                .expect("ack");
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT read messages={got} secs={secs:.1} msg_s={:.0} rss_before_mb={before} peak_rss_mb={}",
        got as f64 / secs,
        sampler.peak(pid).await
    );
    drop(conn);
    ch.queue_delete(
        q.as_str().into(),
        berth_itest::lapin::options::QueueDeleteOptions::default(),
    )
    .await
    .expect("delete");
}
