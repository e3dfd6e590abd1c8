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

use berth_itest::load::{
    declare_stream, read_from_first, rss_mb, spawn_confirmed_publishers, RssSampler,
};
use berth_itest::*;

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
    declare_stream(&ch, &q).await;

    // 1. Publish with confirms.
    let (cpu0, t0) = (cpu_s(pid), Instant::now());
    let per = n / PUBLISHERS;
    let body = vec![b'x'; BODY_BYTES];
    let tasks =
        spawn_confirmed_publishers(&broker, &q, PUBLISHERS, per, &body, UNCONFIRMED_MAX).await;
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
            read_from_first(&ch, &q, total, Duration::from_secs(30), |_, _| {}).await;
            conn
        }));
    }
    let sampler = RssSampler::start(pid);
    for t in tasks {
        conns.push(t.await.expect("consumer"));
    }
    let peak = sampler.peak().await;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_s(pid) - cpu0);
    let delivered = total * CONSUMERS;
    println!(
        "fan-out: {CONSUMERS} consumers x {total} from first in {secs:.2} s = {:.0} msg/s aggregate; broker CPU {:.2} us/msg; RSS {} MB",
        delivered as f64 / secs,
        cpu * 1e6 / delivered as f64,
        peak
    );
}
