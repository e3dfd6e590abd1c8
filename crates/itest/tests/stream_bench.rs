//! Stream benchmark (not a timed test; `#[ignore]`, run by hand):
//!
//!     STREAM_BENCH_MESSAGES=200000 cargo test --release -p berth-itest \
//!         --test stream_bench -- --ignored --nocapture
//!
//! 1. Publish rate with confirms: 4 publishers on their own connections,
//!    1 KB bodies, at most 100 unconfirmed each, into one stream.
//! 2. Fan-out: 10 consumers on their own connections each read the whole
//!    stream from `first` (prefetch 500, an ack with `multiple` every 100):
//!    aggregate deliveries per second.
//!
//! For each phase: the broker's CPU time per message (user + system from
//! /proc/PID/stat over the phase) and its peak RSS. Results go to stdout
//! (docs/BENCHMARKS.md, "Streams").

use std::time::{Duration, Instant};

use berth_itest::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use berth_itest::lapin::BasicProperties;
use berth_itest::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PUBLISHERS: usize = 4;
const CONSUMERS: usize = 10;
const BODY_BYTES: usize = 1024;
const UNCONFIRMED_MAX: usize = 100;

fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn rss_mb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: run by hand with --ignored --nocapture"]
async fn stream_publish_and_fan_out() {
    let n: usize = std::env::var("STREAM_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let broker = Broker::start();
    let pid = broker.pid().expect("a berth of our own");
    let (_c, ch) = broker.channel().await;
    let q = unique("bench-stream");
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

    // 1. Publish with confirms.
    let (cpu0, t0) = (cpu_s(pid), Instant::now());
    let per = n / PUBLISHERS;
    let mut tasks = Vec::new();
    for _ in 0..PUBLISHERS {
        let conn = broker.connect().await;
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let ch = conn.create_channel().await.expect("channel");
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm.select");
            let body = vec![b'x'; BODY_BYTES];
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
                    let c = window
                        .pop_front()
                        .expect("non-empty")
                        .await
                        .expect("confirm");
                    assert!(c.is_ack());
                }
            }
            for c in window {
                assert!(c.await.expect("confirm").is_ack());
            }
            conn
        }));
    }
    let mut peak = 0;
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.expect("publisher"));
        peak = peak.max(rss_mb(pid));
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_s(pid) - cpu0);
    let total = per * PUBLISHERS;
    println!(
        "publish: {total} x {BODY_BYTES} B confirmed in {secs:.2} s = {:.0} msg/s; broker CPU {:.1} us/msg; RSS {} MB",
        total as f64 / secs,
        cpu * 1e6 / total as f64,
        peak.max(rss_mb(pid))
    );

    // 2. Fan-out from first.
    let (cpu0, t0) = (cpu_s(pid), Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..CONSUMERS {
        let conn = broker.connect().await;
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let ch = conn.create_channel().await.expect("channel");
            ch.basic_qos(500, BasicQosOptions { global: false })
                .await
                .expect("qos");
            let mut consumer = try_consume(
                &ch,
                &q,
                "",
                BasicConsumeOptions::default(),
                table(&[("x-stream-offset", lstr("first"))]),
            )
            .await
            .expect("consume");
            let mut got = 0usize;
            while got < total {
                let d = match consumer.next_event(Duration::from_secs(30)).await {
                    Some(ConsumerEvent::Delivery(d)) => d,
                    other => panic!("expected a delivery, got {other:?}"),
                };
                got += 1;
                if got.is_multiple_of(100) || got == total {
                    d.acker
                        .ack(BasicAckOptions { multiple: true })
                        .await
                        .expect("ack");
                }
            }
            conn
        }));
    }
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_mb(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    for t in tasks {
        conns.push(t.await.expect("consumer"));
    }
    stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let peak = peak.load(Ordering::Relaxed).max(rss_mb(pid));
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_s(pid) - cpu0);
    let delivered = total * CONSUMERS;
    println!(
        "fan-out: {CONSUMERS} consumers x {total} from first in {secs:.2} s = {:.0} msg/s aggregate; broker CPU {:.2} us/msg; RSS {} MB",
        delivered as f64 / secs,
        cpu * 1e6 / delivered as f64,
        peak
    );
}
