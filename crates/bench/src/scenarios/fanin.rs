//! Fan-in (seed 001, Sendmail queue directories): C concurrent producers,
//! each on its own connection, publish confirmed persistent messages one at
//! a time (as smtp-source sends one mail per connection at a time), first
//! all into one queue ("shared"), then each into its own ("per-producer").
//!
//! Figures per mode and concurrency C: time to enqueue one message
//! (publish → confirm) median and p99, and confirmed messages per second.
//! Accounting: every publish is confirmed, and the queues then hold exactly
//! the confirmed count (passive declare, then the count `queue.delete`
//! reports).

use std::time::{Duration, Instant};

use crate::amqp;
use crate::publisher::{PublishTemplate, Publisher};
use crate::scenarios::{join_all, latency_metrics, parse_list, secs};
use crate::{Accounting, BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Concurrency levels (producers), comma-separated [default: 1,5,10,20;
    /// smoke: 1,3].
    #[arg(long, value_name = "LIST")]
    pub concurrency: Option<String>,
    /// Message body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Stop each producer after this many messages instead of after
    /// --duration [smoke: 20].
    #[arg(long, value_name = "N")]
    pub messages: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// All producers into one queue.
    Shared,
    /// One queue per producer.
    PerProducer,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Shared => "shared",
            Mode::PerProducer => "perq",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub levels: Vec<usize>,
    pub modes: Vec<Mode>,
    pub size: usize,
    /// Length of each (mode, level) phase, unless `messages` is set.
    pub duration: Duration,
    /// Messages per producer per phase (count mode).
    pub messages: Option<u64>,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let scale = a.common.scale;
        let levels = match &a.concurrency {
            Some(s) => parse_list(s, "--concurrency")?,
            None if scale == Scale::Smoke => vec![1, 3],
            None => vec![1, 5, 10, 20],
        };
        let duration = secs(
            a.common.duration.unwrap_or(match scale {
                Scale::Smoke => 1.0,
                Scale::Default => 5.0,
                Scale::Seed => 60.0,
            }),
            "--duration",
        )?;
        let messages = a
            .messages
            .or((scale == Scale::Smoke && a.common.duration.is_none()).then_some(20));
        Ok(Config {
            levels,
            modes: vec![Mode::Shared, Mode::PerProducer],
            size: a.size.max(8),
            duration,
            messages,
        })
    }
}

struct ProducerResult {
    published: u64,
    confirmed: u64,
    enqueue_ms: Vec<f64>,
    /// When its last confirm came: the connection's close is not timed.
    finished: Instant,
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let prefix = amqp::unique_prefix("fanin");
    let (admin_conn, admin) = amqp::connect_channel(&target.uri, "fanin admin", false).await?;
    let mut out = Outcome::default();
    for &mode in &cfg.modes {
        for &c in &cfg.levels {
            let queues: Vec<String> = match mode {
                Mode::Shared => vec![format!("{prefix}-{}-c{c}", mode.name())],
                Mode::PerProducer => (0..c)
                    .map(|i| format!("{prefix}-{}-c{c}-{i}", mode.name()))
                    .collect(),
            };
            for q in &queues {
                amqp::declare_durable(&admin, q).await?;
            }
            let phase = format!("{}.c{c}", mode.name());
            let result = level(cfg, target, ui, &phase, &queues, c).await;
            // Always clean up, even when the level failed.
            let mut held = 0;
            let mut depth_sum = 0;
            for q in &queues {
                depth_sum += amqp::depth(&admin, q).await?;
                held += amqp::delete(&admin, q).await?;
            }
            let (acc, metrics, msgs) = result?;
            out.accounting.add(&acc);
            out.accounting.expect_eq(
                &format!("{phase} depth after publish"),
                depth_sum,
                acc.confirmed,
            );
            out.accounting
                .expect_eq(&format!("{phase} messages deleted"), held, acc.confirmed);
            out.messages += msgs;
            out.metrics.extend(metrics);
        }
    }
    amqp::close(&admin_conn).await;
    Ok(out)
}

async fn level(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    phase: &str,
    queues: &[String],
    producers: usize,
) -> Result<(Accounting, Vec<Metric>, u64), BenchError> {
    // Connect everyone before the clock starts.
    let mut publishers = Vec::with_capacity(producers);
    for i in 0..producers {
        publishers.push(Publisher::connect(&target.uri, &format!("fanin producer {i}")).await?);
    }
    let pb = match cfg.messages {
        Some(n) => ui.bar(n * producers as u64, format!("fanin {phase}")),
        None => ui.timed(cfg.duration, format!("fanin {phase}")),
    };
    let ticker = cfg
        .messages
        .is_none()
        .then(|| crate::tick_seconds(&pb, cfg.duration));
    let started = Instant::now();
    let deadline = started + cfg.duration;
    let mut tasks = Vec::with_capacity(producers);
    for (i, mut p) in publishers.into_iter().enumerate() {
        let template = PublishTemplate::new(
            &queues[i % queues.len()],
            &amqp::body(cfg.size, 0),
            p.frame_max(),
        )?;
        let limit = cfg.messages;
        let pb = pb.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = ProducerResult {
                published: 0,
                confirmed: 0,
                enqueue_ms: Vec::new(),
                finished: started,
            };
            loop {
                let done = match limit {
                    Some(n) => r.published >= n,
                    None => Instant::now() >= deadline,
                };
                if done {
                    break;
                }
                let t0 = Instant::now();
                p.publish(&template, 1).await?;
                r.published += 1;
                p.wait_confirms(0).await?;
                if p.nacked() > 0 {
                    return Err(BenchError::Accounting("broker nacked a publish".into()));
                }
                r.confirmed += 1;
                r.enqueue_ms.push(amqp::ms(t0.elapsed()));
                if limit.is_some() {
                    pb.inc(1);
                }
            }
            r.finished = Instant::now();
            p.close().await?;
            Ok(r)
        }));
    }
    let results = join_all(tasks).await;
    if let Some(t) = ticker {
        t.abort();
    }
    pb.finish_and_clear();
    let results = results?;
    let elapsed = results
        .iter()
        .map(|r| r.finished)
        .max()
        .unwrap_or(started)
        .saturating_duration_since(started);
    let mut acc = Accounting::default();
    let mut lat = Vec::new();
    for r in results {
        acc.published += r.published;
        acc.confirmed += r.confirmed;
        lat.extend(r.enqueue_ms);
    }
    acc.expect_eq(&format!("{phase} confirmed"), acc.confirmed, acc.published);
    let mut metrics: Vec<Metric> = latency_metrics(&format!("{phase}.enqueue"), lat)
        .into_iter()
        .filter(|m| m.name.ends_with("median") || m.name.ends_with("p99"))
        .collect();
    metrics.push(Metric::new(
        format!("{phase}.msgs_per_s"),
        "msg/s",
        acc.confirmed as f64 / elapsed.as_secs_f64().max(1e-6),
    ));
    let msgs = acc.confirmed;
    Ok((acc, metrics, msgs))
}
