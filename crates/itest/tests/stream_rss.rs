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

use std::time::{Duration, Instant};

use berth_itest::lapin::types::AMQPValue;
use berth_itest::load::{
    declare_stream, read_from_first, rss_mb, spawn_confirmed_publishers, RssSampler,
};
use berth_itest::*;

const PUBLISHERS: usize = 4;
const UNCONFIRMED_MAX: usize = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
    declare_stream(&ch, &q).await;
    // A line of its own: the test harness has written "test ... " before.
    println!("\nRESULT start rss_mb={}", rss_mb(pid));

    // 1. Fill.
    let sampler = RssSampler::start(pid);
    let t0 = Instant::now();
    let body = vec![b'r'; body_bytes];
    let tasks =
        spawn_confirmed_publishers(&broker, &q, PUBLISHERS, per, &body, UNCONFIRMED_MAX).await;
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.expect("publisher"));
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT fill messages={total} body_bytes={body_bytes} stream_mb={} secs={secs:.1} msg_s={:.0} peak_rss_mb={}",
        (total * body_bytes) >> 20,
        total as f64 / secs,
        sampler.peak().await
    );
    drop(conns);

    // 2. Read it all from first.
    let before = rss_mb(pid);
    let sampler = RssSampler::start(pid);
    let t0 = Instant::now();
    let conn = broker.connect().await;
    let rch = conn.create_channel().await.expect("channel");
    read_from_first(&rch, &q, total, Duration::from_secs(60), |i, d| {
        let offset = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-stream-offset").cloned());
        assert_eq!(
            offset,
            Some(AMQPValue::LongLongInt(i64::try_from(i).expect("fits"))),
            "offsets come once each, in order"
        );
        assert_eq!(d.data.len(), body_bytes);
    })
    .await;
    let got = total;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT read messages={got} secs={secs:.1} msg_s={:.0} rss_before_mb={before} peak_rss_mb={}",
        got as f64 / secs,
        sampler.peak().await
    );
    drop(conn);
    ch.queue_delete(
        q.as_str().into(),
        berth_itest::lapin::options::QueueDeleteOptions::default(),
    )
    .await
    .expect("delete");
}
