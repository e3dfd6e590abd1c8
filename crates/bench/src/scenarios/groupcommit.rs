//! Transactions under adverse conditions (seed 003, BACC group commit):
//! C concurrent clients, each on its own connection and channel in tx mode,
//! each with its own durable queue. A well-behaved client loops: publish k
//! persistent messages + `tx.commit`, then `basic.get` k + ack + `tx.commit`.
//! In the adverse phase a share of the clients publish k and roll back, and
//! another share publish k and stall before committing (a long transaction).
//!
//! Two phases per run: "clean" (only the well-behaved clients) and
//! "adverse" (the same well-behaved clients plus the bad ones). Figures per
//! phase: transactions per second of the well-behaved clients and their
//! response time (one transaction, first publish to commit-ok).
//! Accounting: what was committed was consumed; rolled-back publishes never
//! reach a queue; every queue is empty at the end.

use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions};

use crate::amqp::{self, Ctx as _};
use crate::scenarios::{join_all, latency_metrics, secs};
use crate::{Accounting, BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Concurrent clients in the adverse phase [smoke: 6].
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Messages per transaction.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Share of clients that roll back every transaction.
    #[arg(long, default_value_t = 0.2)]
    pub rollback_share: f64,
    /// Share of clients that stall before each commit.
    #[arg(long, default_value_t = 0.2)]
    pub stall_share: f64,
    /// How long a stalling client waits before its commit [smoke: 200].
    #[arg(long, default_value_t = 1000)]
    pub stall_ms: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub good: usize,
    pub rollback: usize,
    pub stall_clients: usize,
    pub k: usize,
    /// How long a stalling client waits before each commit.
    pub stall_for: Duration,
    pub size: usize,
    /// Length of each phase.
    pub duration: Duration,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let smoke = a.common.scale == Scale::Smoke;
        let clients = if smoke { 6 } else { a.clients.max(1) };
        if !(0.0..=1.0).contains(&(a.rollback_share + a.stall_share))
            || a.rollback_share < 0.0
            || a.stall_share < 0.0
        {
            return Err(BenchError::Usage(
                "--rollback-share and --stall-share must be >= 0 and add up to at most 1".into(),
            ));
        }
        let share = |s: f64| (s * clients as f64).round() as usize;
        let rollback = share(a.rollback_share);
        let stall_clients = share(a.stall_share).min(clients - rollback);
        let good = clients - rollback - stall_clients;
        if good == 0 {
            return Err(BenchError::Usage(
                "no well-behaved client left to measure".into(),
            ));
        }
        Ok(Config {
            good,
            rollback,
            stall_clients,
            k: a.k.max(1),
            stall_for: Duration::from_millis(if smoke { 200 } else { a.stall_ms }),
            size: a.size.max(8),
            duration: secs(
                a.common.duration.unwrap_or(match a.common.scale {
                    Scale::Smoke => 1.0,
                    Scale::Default => 10.0,
                    Scale::Seed => 60.0,
                }),
                "--duration",
            )?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Good,
    Rollback,
    Stall,
}

#[derive(Default)]
struct ClientResult {
    acc: Accounting,
    transactions: u64,
    response_ms: Vec<f64>,
    rolled_back: u64,
    /// When the client's last transaction ended, from the phase start.
    ended: Duration,
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let prefix = amqp::unique_prefix("groupcommit");
    let (admin_conn, admin) =
        amqp::connect_channel(&target.uri, "groupcommit admin", false).await?;
    let mut out = Outcome::default();
    let phases: [(&str, Vec<Kind>); 2] = [
        ("clean", vec![Kind::Good; cfg.good]),
        (
            "adverse",
            std::iter::repeat_n(Kind::Good, cfg.good)
                .chain(std::iter::repeat_n(Kind::Rollback, cfg.rollback))
                .chain(std::iter::repeat_n(Kind::Stall, cfg.stall_clients))
                .collect(),
        ),
    ];
    for (phase, kinds) in phases {
        let queues: Vec<String> = (0..kinds.len())
            .map(|i| format!("{prefix}-{phase}-{i}"))
            .collect();
        for q in &queues {
            amqp::declare_durable(&admin, q).await?;
        }
        let result = one_phase(cfg, target, ui, phase, &kinds, &queues).await;
        let mut depths = Vec::new();
        for q in &queues {
            depths.push(amqp::depth(&admin, q).await?);
            amqp::delete(&admin, q).await?;
        }
        let results = result?;
        // The good clients' rate is over their own span; stalled ones overrun.
        let elapsed = results
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k == Kind::Good)
            .map(|(r, _)| r.ended)
            .max()
            .unwrap_or(cfg.duration);
        let mut good_tx = 0;
        let mut rt = Vec::new();
        for ((r, kind), (q, d)) in results
            .into_iter()
            .zip(&kinds)
            .zip(queues.iter().zip(depths))
        {
            out.accounting.add(&r.acc);
            out.accounting.expect_eq(
                &format!("{phase} {kind:?} client confirmed = committed"),
                r.acc.confirmed,
                r.acc.published - r.rolled_back,
            );
            out.accounting.expect_eq(
                &format!("{phase} {kind:?} client consumed = committed"),
                r.acc.consumed,
                r.acc.confirmed,
            );
            out.accounting
                .expect_eq(&format!("{phase} depth of {q} at end"), d, 0);
            if *kind == Kind::Good {
                good_tx += r.transactions;
                rt.extend(r.response_ms);
            }
            out.messages += r.acc.published;
        }
        out.metrics.push(Metric::new(
            format!("{phase}.good_tx_per_s"),
            "tx/s",
            good_tx as f64 / elapsed.as_secs_f64(),
        ));
        out.metrics
            .extend(latency_metrics(&format!("{phase}.good_response"), rt));
    }
    amqp::close(&admin_conn).await;
    Ok(out)
}

async fn one_phase(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    phase: &str,
    kinds: &[Kind],
    queues: &[String],
) -> Result<Vec<ClientResult>, BenchError> {
    let mut chans = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let (conn, ch) = amqp::connect_channel(
            &target.uri,
            &format!("groupcommit {phase} {kind:?} {i}"),
            false,
        )
        .await?;
        ch.tx_select().await.ctx("tx.select")?;
        chans.push((conn, ch));
    }
    let pb = ui.timed(cfg.duration, format!("groupcommit {phase}"));
    let ticker = crate::tick_seconds(&pb, cfg.duration);
    let started = Instant::now();
    let deadline = started + cfg.duration;
    let mut tasks = Vec::new();
    for ((conn, ch), (kind, q)) in chans
        .into_iter()
        .zip(kinds.iter().copied().zip(queues.iter().cloned()))
    {
        let (k, stall) = (cfg.k, cfg.stall_for);
        let body = amqp::body(cfg.size, 0);
        tasks.push(tokio::spawn(async move {
            let mut r = ClientResult::default();
            while Instant::now() < deadline {
                // Publish k + commit (or roll back, or stall then commit).
                let t0 = Instant::now();
                for _ in 0..k {
                    // In tx mode there are no confirms; publish returns at once.
                    amqp::publish(&ch, &q, &body).await?;
                    r.acc.published += 1;
                }
                match kind {
                    Kind::Rollback => {
                        ch.tx_rollback().await.ctx("tx.rollback")?;
                        r.rolled_back += k as u64;
                        continue;
                    }
                    Kind::Stall => tokio::time::sleep(stall).await,
                    Kind::Good => {}
                }
                ch.tx_commit().await.ctx("tx.commit")?;
                r.acc.confirmed += k as u64;
                r.transactions += 1;
                r.response_ms.push(amqp::ms(t0.elapsed()));
                // Get k + ack + commit.
                let t0 = Instant::now();
                for _ in 0..k {
                    let msg = ch
                        .basic_get(q.as_str().into(), BasicGetOptions::default())
                        .await
                        .ctx(format!("basic.get from {q}"))?
                        .ok_or_else(|| {
                            BenchError::Accounting(format!(
                                "{q}: committed message missing on basic.get"
                            ))
                        })?;
                    ch.basic_ack(msg.delivery.delivery_tag, BasicAckOptions::default())
                        .await
                        .ctx("basic.ack")?;
                    r.acc.consumed += 1;
                }
                ch.tx_commit().await.ctx("tx.commit")?;
                r.transactions += 1;
                r.response_ms.push(amqp::ms(t0.elapsed()));
            }
            r.ended = started.elapsed();
            amqp::close(&conn).await;
            Ok(r)
        }));
    }
    let results = join_all(tasks).await;
    ticker.abort();
    pb.finish_and_clear();
    results
}
