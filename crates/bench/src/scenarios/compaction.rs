//! Confirm latency of a steady publisher while the store compacts (issue 16
//! item 8): one connection publishes a persistent message every
//! `--interval-ms` and waits for its confirm, first on a quiet broker, then
//! while a large online compaction runs, triggered through the management
//! API (`POST /api/berth/store/compact`, the trigger operators use).
//!
//! The compaction is made large on purpose: a backlog of `--backlog`
//! messages is published round-robin to three durable queues, two of which
//! are then purged, leaving every segment a third live; the compaction is
//! asked for right after the purges.
//!
//! Figures: `quiet.confirm_ms_*` (the publisher alone) and
//! `compacting.confirm_ms_*` (publishes sent while the compaction request
//! was outstanding, so a publish held up by it counts), and `compaction_s`
//! (how long the request took). Accounting: every steady publish was
//! confirmed, the kept queue holds its third of the backlog.

use std::time::{Duration, Instant};

use lapin::options::QueuePurgeOptions;
use lapin::Channel;

use crate::amqp::{self, Ctx as _};
use crate::scenarios::{latency_metrics, secs};
use crate::{Accounting, BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Backlog messages that make the store fragmented [smoke: 3000].
    #[arg(long, default_value_t = 60_000)]
    pub backlog: u64,
    /// Body size of the backlog, bytes.
    #[arg(long, default_value_t = 4096)]
    pub backlog_size: usize,
    /// Body size of the steady publisher, bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// The steady publisher sends one message per interval (and waits for
    /// its confirm before the next).
    #[arg(long, default_value_t = 5)]
    pub interval_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub backlog: u64,
    pub backlog_size: usize,
    pub size: usize,
    pub interval: Duration,
    /// Length of the quiet phase.
    pub duration: Duration,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let smoke = a.common.scale == Scale::Smoke;
        if a.common.mgmt_url.is_none() {
            return Err(BenchError::Usage(
                "compaction needs --mgmt-url http://ADMIN:PASS@HOST:PORT to trigger the compaction"
                    .into(),
            ));
        }
        Ok(Config {
            backlog: if smoke { 3000 } else { a.backlog.max(3) },
            backlog_size: a.backlog_size.max(8),
            size: a.size.max(8),
            interval: Duration::from_millis(a.interval_ms.max(1)),
            duration: secs(
                a.common.duration.unwrap_or(match a.common.scale {
                    Scale::Smoke => 1.0,
                    Scale::Default | Scale::Seed => 10.0,
                }),
                "--duration",
            )?,
        })
    }
}

/// One steady publish: when it was sent and how long its confirm took.
struct Sample {
    sent: Instant,
    confirm_ms: f64,
}

/// Publishes to `queue` once per `interval` until `stop` says so, each
/// publish waiting for its confirm.
async fn steady(
    ch: Channel,
    queue: String,
    body: Vec<u8>,
    interval: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Vec<Sample>, Accounting), BenchError> {
    let mut samples = Vec::new();
    let mut acc = Accounting::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stop.borrow() {
        tick.tick().await;
        let sent = Instant::now();
        let confirm = amqp::publish(&ch, &queue, &body).await?;
        acc.published += 1;
        amqp::confirmed(confirm).await?;
        acc.confirmed += 1;
        samples.push(Sample {
            sent,
            confirm_ms: amqp::ms(sent.elapsed()),
        });
    }
    Ok((samples, acc))
}

/// Fills `queues` round-robin with `n` messages, at most `window` confirms
/// outstanding.
async fn fill(
    ch: &Channel,
    queues: &[String],
    n: u64,
    body: &[u8],
    pb: &indicatif::ProgressBar,
) -> Result<Accounting, BenchError> {
    const WINDOW: usize = 256;
    let mut acc = Accounting::default();
    let mut pending = std::collections::VecDeque::with_capacity(WINDOW);
    for (i, q) in (0..n).zip(queues.iter().cycle()) {
        pending.push_back(amqp::publish(ch, q, body).await?);
        acc.published += 1;
        if pending.len() >= WINDOW || i + 1 == n {
            while let Some(c) = pending.pop_front() {
                amqp::confirmed(c).await?;
                acc.confirmed += 1;
                pb.inc(1);
            }
        }
    }
    Ok(acc)
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let base = crate::http::BaseUrl::parse(target.mgmt_url.as_deref().ok_or_else(|| {
        BenchError::Usage("compaction needs --mgmt-url (and --vs-mgmt-url with --vs)".into())
    })?)?;
    let prefix = amqp::unique_prefix("compaction");
    let steady_q = format!("{prefix}-steady");
    let backlog_qs: Vec<String> = (0..3).map(|i| format!("{prefix}-backlog-{i}")).collect();
    let (admin_conn, admin) = amqp::connect_channel(&target.uri, "compaction admin", true).await?;
    for q in std::iter::once(&steady_q).chain(&backlog_qs) {
        amqp::declare_durable(&admin, q).await?;
    }
    let (pub_conn, pub_ch) =
        amqp::connect_channel(&target.uri, "compaction steady publisher", true).await?;
    let mut out = Outcome::default();
    let body = amqp::body(cfg.size, 0);

    // Quiet: the steady publisher alone.
    let pb = ui.timed(cfg.duration, "compaction: quiet");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(steady(
        pub_ch.clone(),
        steady_q.clone(),
        body.clone(),
        cfg.interval,
        stop,
    ));
    tokio::time::sleep(cfg.duration).await;
    stop_tx.send_replace(true);
    let (quiet, acc) = task.await.map_err(|e| BenchError::Task(e.to_string()))??;
    pb.finish_and_clear();
    out.accounting.add(&acc);

    // A fragmented store: a third of the backlog stays live.
    let pb = ui.bar(cfg.backlog, "compaction: backlog");
    let acc = fill(
        &admin,
        &backlog_qs,
        cfg.backlog,
        &amqp::body(cfg.backlog_size, 0),
        &pb,
    )
    .await?;
    pb.finish_and_clear();
    out.accounting.add(&acc);

    // Compacting: the same publisher while the compaction request runs.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(steady(
        pub_ch.clone(),
        steady_q.clone(),
        body.clone(),
        cfg.interval,
        stop,
    ));
    for q in &backlog_qs[1..] {
        admin
            .queue_purge(q.as_str().into(), QueuePurgeOptions::default())
            .await
            .ctx(format!("queue.purge {q}"))?;
    }
    let started = Instant::now();
    let (status, took) =
        crate::http::post(&base, "/api/berth/store/compact", Duration::from_secs(600)).await?;
    let ended = Instant::now();
    if status != 200 {
        return Err(BenchError::Http(format!(
            "POST /api/berth/store/compact answered {status}"
        )));
    }
    // Let a publish held up by the compaction finish and be counted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_tx.send_replace(true);
    let (during, acc) = task.await.map_err(|e| BenchError::Task(e.to_string()))??;
    out.accounting.add(&acc);
    let during: Vec<f64> = during
        .into_iter()
        .filter(|s| s.sent >= started && s.sent <= ended)
        .map(|s| s.confirm_ms)
        .collect();
    out.notes.push(format!(
        "{} steady publishes sent while the compaction ran",
        during.len()
    ));

    let steady_total = out.accounting.published - cfg.backlog;
    out.accounting.expect_eq(
        "steady publishes confirmed",
        out.accounting.confirmed - cfg.backlog,
        steady_total,
    );
    let kept = amqp::depth(&admin, &backlog_qs[0]).await?;
    out.accounting
        .expect_eq("kept backlog queue depth", kept, cfg.backlog.div_ceil(3));
    for q in std::iter::once(&steady_q).chain(&backlog_qs) {
        amqp::delete(&admin, q).await?;
    }
    out.messages = out.accounting.published;
    out.metrics.extend(latency_metrics(
        "quiet.confirm",
        quiet.into_iter().map(|s| s.confirm_ms).collect(),
    ));
    out.metrics
        .extend(latency_metrics("compacting.confirm", during));
    out.metrics
        .push(Metric::new("compaction_s", "s", took.as_secs_f64()));
    amqp::close(&pub_conn).await;
    amqp::close(&admin_conn).await;
    Ok(out)
}
