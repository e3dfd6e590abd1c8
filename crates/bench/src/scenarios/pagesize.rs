//! Backlog produce/drain (seed 002, SwiftMQ page size): 5 producers, one per
//! durable queue, each publish N persistent messages (confirms pipelined,
//! a burst as fast as the broker takes them) with no consumer; then, with
//! the page cache dropped where the OS allows, 5 consumers drain the 5
//! queues. Run for each body size (2 KB and 16 KB by default).
//!
//! Figures per size: produce and drain rate in msg/s and MB/s, and with
//! `--pid` the broker's CPU per message in each phase.
//! Accounting: published = confirmed = N per queue, depth = N after the
//! produce phase, consumed = N per queue, depth 0 after the drain.

use std::time::{Duration, Instant};

use futures_lite::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;

use crate::amqp::{self, Ctx as _};
use crate::publisher::{PublishTemplate, Publisher};
use crate::scenarios::{join_all, parse_list};
use crate::{procstat, Accounting, BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

/// A consumer that receives nothing for this long has stalled.
pub const DRAIN_IDLE_TIMEOUT_S: u64 = 60;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Body sizes in bytes, comma-separated.
    #[arg(long, default_value = "2048,16384")]
    pub sizes: String,
    /// Queues, producers and consumers (one each per queue).
    #[arg(long, default_value_t = 5)]
    pub queues: usize,
    /// Messages per queue [smoke: 50; default: 10,000; seed: 400,000].
    #[arg(long, value_name = "N")]
    pub messages: Option<u64>,
    /// Unconfirmed publishes each producer keeps in flight.
    #[arg(long, default_value_t = 256)]
    pub confirm_window: usize,
    /// Consumer prefetch (basic.qos).
    #[arg(long, default_value_t = 200)]
    pub prefetch: u16,
    /// Keep the page cache warm before draining (by default it is dropped
    /// when /proc/sys/vm/drop_caches is writable).
    #[arg(long)]
    pub warm: bool,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub sizes: Vec<usize>,
    pub queues: usize,
    pub messages: u64,
    pub confirm_window: usize,
    pub prefetch: u16,
    pub drop_caches: bool,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let scale = a.common.scale;
        Ok(Config {
            sizes: parse_list(&a.sizes, "--sizes")?,
            queues: a.queues.max(1),
            messages: a.messages.unwrap_or(match scale {
                Scale::Smoke => 50,
                Scale::Default => 10_000,
                Scale::Seed => 400_000,
            }),
            confirm_window: a.confirm_window.max(1),
            prefetch: a.prefetch.max(1),
            drop_caches: !a.warm && scale != Scale::Smoke,
        })
    }
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let prefix = amqp::unique_prefix("pagesize");
    let (admin_conn, admin) = amqp::connect_channel(&target.uri, "pagesize admin", false).await?;
    let mut out = Outcome::default();
    for &size in &cfg.sizes {
        let queues: Vec<String> = (0..cfg.queues)
            .map(|i| format!("{prefix}-s{size}-{i}"))
            .collect();
        for q in &queues {
            amqp::declare_durable(&admin, q).await?;
        }
        let result = one_size(cfg, target, ui, size, &queues, &admin, &mut out).await;
        for q in &queues {
            amqp::delete(&admin, q).await?;
        }
        result?;
    }
    amqp::close(&admin_conn).await;
    Ok(out)
}

async fn one_size(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    size: usize,
    queues: &[String],
    admin: &lapin::Channel,
    out: &mut Outcome,
) -> Result<(), BenchError> {
    let total = cfg.messages * queues.len() as u64;
    let tag = format!("s{size}");
    let broker = || target.pid.and_then(procstat::usage_tree);
    let produce0 = broker();
    let produce_s = produce(cfg, target, ui, size, queues, &tag, out).await?;
    let produced = broker();
    for q in queues {
        let d = amqp::depth(admin, q).await?;
        out.accounting.expect_eq(
            &format!("{tag} depth of {q} after produce"),
            d,
            cfg.messages,
        );
    }
    if cfg.drop_caches {
        if let Err(why) = drop_page_cache() {
            let note =
                format!("page cache not dropped before drain ({why}): drain rates are warm-cache");
            if !out.notes.contains(&note) {
                out.notes.push(note);
            }
        }
    }
    let drain0 = broker();
    let drain_s = drain_all(cfg, target, ui, queues, &tag, out).await?;
    let drained = broker();
    for q in queues {
        let d = amqp::depth(admin, q).await?;
        out.accounting
            .expect_eq(&format!("{tag} depth of {q} after drain"), d, 0);
    }
    push_rates(out, &tag, total, size, "produce", produce_s);
    push_rates(out, &tag, total, size, "drain", drain_s);
    push_broker_cpu(out, &tag, "produce", total, produce0, produced);
    push_broker_cpu(out, &tag, "drain", total, drain0, drained);
    out.messages += total;
    Ok(())
}

fn push_rates(out: &mut Outcome, tag: &str, total: u64, size: usize, phase: &str, secs: f64) {
    let mb = (total as f64) * (size as f64) / 1e6;
    out.metrics.push(Metric::new(
        format!("{tag}.{phase}_msgs_per_s"),
        "msg/s",
        total as f64 / secs,
    ));
    out.metrics.push(Metric::new(
        format!("{tag}.{phase}_mb_per_s"),
        "MB/s",
        mb / secs,
    ));
}

/// The broker's CPU per message in one phase (issue 20 goal 2 names
/// pagesize's produce on its own), when its pid was given.
fn push_broker_cpu(
    out: &mut Outcome,
    tag: &str,
    phase: &str,
    total: u64,
    before: Option<procstat::Usage>,
    after: Option<procstat::Usage>,
) {
    if let Some(us) = before
        .zip(after)
        .and_then(|(b, a)| a.cpu_us_per_msg_since(&b, total))
    {
        out.metrics.push(Metric::new(
            format!("{tag}.{phase}_broker_cpu_us_per_msg"),
            "us/msg",
            us,
        ));
    }
}

/// One producer connection per queue publishes `cfg.messages` of `size`
/// bytes with `confirm_window` confirms outstanding; returns the seconds
/// it took.
async fn produce(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    size: usize,
    queues: &[String],
    tag: &str,
    out: &mut Outcome,
) -> Result<f64, BenchError> {
    // Connect everyone before the clock starts.
    let mut producers = Vec::new();
    for i in 0..queues.len() {
        producers.push(Publisher::connect(&target.uri, &format!("pagesize producer {i}")).await?);
    }
    let pb = ui.bar(
        cfg.messages * queues.len() as u64,
        format!("pagesize {tag} produce"),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (mut p, q) in producers.into_iter().zip(queues.iter()) {
        let (n, window, pb) = (cfg.messages, cfg.confirm_window as u64, pb.clone());
        let template = PublishTemplate::new(q, &amqp::body(size, 0), p.frame_max())?;
        tasks.push(tokio::spawn(async move {
            let (published, confirmed) = p.publish_windowed(&template, n, window, &pb).await?;
            let acc = Accounting {
                published,
                confirmed,
                ..Accounting::default()
            };
            Ok((acc, p))
        }));
    }
    let produced = join_all(tasks).await;
    let produce_s = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    // Closed after the clock stopped, as the consumers are (`drain_all`).
    let mut accounts = Vec::new();
    for (acc, p) in produced? {
        p.close().await?;
        accounts.push(acc);
    }
    for acc in accounts {
        out.accounting.add(&acc);
        out.accounting.expect_eq(
            &format!("{tag} confirmed per producer"),
            acc.confirmed,
            cfg.messages,
        );
    }
    Ok(produce_s)
}

/// One consumer connection per queue drains it; returns the seconds it
/// took.
async fn drain_all(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    queues: &[String],
    tag: &str,
    out: &mut Outcome,
) -> Result<f64, BenchError> {
    let mut chans = Vec::new();
    for i in 0..queues.len() {
        let (conn, ch) =
            amqp::connect_channel(&target.uri, &format!("pagesize consumer {i}"), false).await?;
        ch.basic_qos(cfg.prefetch, BasicQosOptions::default())
            .await
            .ctx("basic.qos")?;
        chans.push((conn, ch));
    }
    let pb = ui.bar(
        cfg.messages * queues.len() as u64,
        format!("pagesize {tag} drain"),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();
    for ((conn, ch), q) in chans.into_iter().zip(queues.iter().cloned()) {
        let (n, pb) = (cfg.messages, pb.clone());
        // Ack before the prefetch window fills, or the broker stops sending.
        let ack_every = u64::from(cfg.prefetch / 2).max(1);
        tasks.push(tokio::spawn(async move {
            let consumed = drain(&ch, &q, n, ack_every, &pb).await?;
            Ok((consumed, conn))
        }));
    }
    let drained = join_all(tasks).await;
    let drain_s = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    // Closed after the clock stopped: a client that keeps its socket open
    // after close-ok waits for the broker's close (RabbitMQ and berth wait
    // 30 s for the peer), which once made a 1 s drain read as 31 s.
    let mut counts = Vec::new();
    for (consumed, conn) in drained? {
        amqp::close(&conn).await;
        counts.push(consumed);
    }
    for consumed in counts {
        out.accounting.consumed += consumed;
        out.accounting.expect_eq(
            &format!("{tag} consumed per consumer"),
            consumed,
            cfg.messages,
        );
    }
    Ok(drain_s)
}

/// Consumes `n` messages from `queue`, acking `multiple` every `ack_every`
/// deliveries (must be below the prefetch); returns how many arrived.
pub(crate) async fn drain(
    ch: &lapin::Channel,
    queue: &str,
    n: u64,
    ack_every: u64,
    pb: &indicatif::ProgressBar,
) -> Result<u64, BenchError> {
    let tag = format!("drain-{queue}");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .ctx(format!("consume {queue}"))?;
    let mut consumed = 0;
    while consumed < n {
        let next = tokio::time::timeout(Duration::from_secs(DRAIN_IDLE_TIMEOUT_S), consumer.next())
            .await
            .map_err(|_| {
                BenchError::Timeout(format!(
                    "{queue}: no delivery for {DRAIN_IDLE_TIMEOUT_S} s after {consumed} of {n}"
                ))
            })?;
        let Some(delivery) = next else {
            return Err(BenchError::Accounting(format!(
                "{queue}: consumer cancelled after {consumed} of {n}"
            )));
        };
        let delivery = delivery.ctx(format!("delivery from {queue}"))?;
        consumed += 1;
        pb.inc(1);
        if consumed % ack_every == 0 || consumed == n {
            ch.basic_ack(delivery.delivery_tag, BasicAckOptions { multiple: true })
                .await
                .ctx("basic.ack")?;
        }
    }
    ch.basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await
        .ctx("basic.cancel")?;
    Ok(consumed)
}

/// `sync`, then drop clean page-cache pages (Linux, root only).
pub(crate) fn drop_page_cache() -> Result<(), String> {
    let status = std::process::Command::new("sync")
        .status()
        .map_err(|e| format!("sync: {e}"))?;
    if !status.success() {
        return Err(format!("sync exited with {status}"));
    }
    std::fs::write("/proc/sys/vm/drop_caches", b"1\n")
        .map_err(|e| format!("/proc/sys/vm/drop_caches: {e}"))
}
