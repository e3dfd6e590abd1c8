//! Many queues, many producers (seed 000, UniVerse spooler): Q durable
//! queues with a backlog of R persistent messages pre-loaded (spread round
//! robin), then P producer connections each publish persistent, confirmed
//! messages to random queues at a fixed rate while consumers on every queue
//! drain backlog and new work. While under load the status query is timed:
//! the management API's queue listing (`GET /api/queues`) when the target
//! has one (`--mgmt-url`), and always the AMQP equivalent (a passive
//! declare of every queue, which is how the bench reads depths anywhere).
//! With a management URL, a second sampler times, every 250 ms, the page an
//! operator looks at (`GET /api/queues?page=1&page_size=100`) and the
//! requests `berth status` makes (overview, the first 20 queues by name,
//! the alarms health check and `/metrics`; any answer to `/metrics`
//! counts, as `berth status` shows the rest without it: RabbitMQ's
//! management port answers it 406).
//!
//! Figures: end-to-end latency of the load messages (publish → delivery),
//! the achieved publish rate, and status-query latencies.
//! Accounting: published = confirmed; consumed = backlog + confirmed once
//! the load stops; every queue empty at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use rand::{Rng as _, SeedableRng as _};

use crate::amqp::{self, Ctx as _};
use crate::scenarios::{join_all, latency_metrics, secs};
use crate::{BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

/// Time allowed, after the load stops, for consumers to make progress
/// before the run is declared stalled.
pub const SETTLE_IDLE_TIMEOUT_S: u64 = 60;
/// Connections opened at once while setting up (keeps the broker's
/// handshake queue and the client's thread spawn rate bounded).
const CONNECT_PARALLELISM: usize = 32;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Queues [smoke: 20].
    #[arg(long, default_value_t = 5000)]
    pub queues: usize,
    /// Producer connections [smoke: 8].
    #[arg(long, default_value_t = 2048)]
    pub producers: usize,
    /// Messages pre-loaded before the load starts [smoke: 200].
    #[arg(long, default_value_t = 80_000)]
    pub backlog: u64,
    /// Messages per second per producer [default: 1; seed: 102.4, i.e.
    /// 6,144 per minute].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Consumer connections; the queues are split among them [smoke: 2].
    #[arg(long, default_value_t = 16)]
    pub consumer_connections: usize,
    /// Prefetch per consumer.
    #[arg(long, default_value_t = 50)]
    pub prefetch: u16,
    /// Seconds between status queries under load.
    #[arg(long, default_value_t = 2.0)]
    pub status_interval: f64,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub queues: usize,
    pub producers: usize,
    pub backlog: u64,
    pub rate_per_producer: f64,
    pub size: usize,
    pub consumer_connections: usize,
    pub prefetch: u16,
    pub status_interval: Duration,
    pub duration: Duration,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let scale = a.common.scale;
        let smoke = scale == Scale::Smoke;
        let rate = a.rate.unwrap_or(match scale {
            Scale::Smoke => 20.0,
            Scale::Default => 1.0,
            Scale::Seed => 6144.0 / 60.0,
        });
        if !(rate.is_finite() && rate > 0.0) {
            return Err(BenchError::Usage("--rate must be positive".into()));
        }
        Ok(Config {
            queues: if smoke { 20 } else { a.queues.max(1) },
            producers: if smoke { 8 } else { a.producers.max(1) },
            backlog: if smoke { 200 } else { a.backlog },
            rate_per_producer: rate,
            size: a.size.max(8),
            consumer_connections: if smoke {
                2
            } else {
                a.consumer_connections.max(1)
            },
            prefetch: a.prefetch.max(1),
            status_interval: secs(
                if smoke { 0.5 } else { a.status_interval },
                "--status-interval",
            )?,
            duration: secs(
                a.common.duration.unwrap_or(match scale {
                    Scale::Smoke => 2.0,
                    Scale::Default => 30.0,
                    Scale::Seed => 60.0,
                }),
                "--duration",
            )?,
        })
    }
}

/// Opens `n` connections (with one channel each), CONNECT_PARALLELISM at a time.
async fn connect_many(
    uri: &str,
    role: &str,
    n: usize,
    confirms: bool,
    pb: &indicatif::ProgressBar,
) -> Result<Vec<(lapin::Connection, lapin::Channel)>, BenchError> {
    let mut out = Vec::with_capacity(n);
    let mut next = 0;
    while next < n {
        let batch = (next..n.min(next + CONNECT_PARALLELISM))
            .map(|i| {
                let (uri, role) = (uri.to_string(), format!("{role} {i}"));
                tokio::spawn(async move { amqp::connect_channel(&uri, &role, confirms).await })
            })
            .collect();
        let got = join_all(batch).await?;
        next += got.len();
        pb.inc(got.len() as u64);
        out.extend(got);
    }
    Ok(out)
}

/// Runs `f` over the queues split across `channels`, concurrently.
async fn per_queue<F, Fut>(
    channels: &[lapin::Channel],
    queues: &Arc<Vec<String>>,
    pb: &indicatif::ProgressBar,
    f: F,
) -> Result<Vec<u64>, BenchError>
where
    F: Fn(lapin::Channel, String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, BenchError>> + Send,
{
    let mut tasks = Vec::new();
    for (c, ch) in channels.iter().enumerate() {
        let (ch, queues, f, pb) = (ch.clone(), queues.clone(), f.clone(), pb.clone());
        let stride = channels.len();
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::new();
            for q in queues.iter().skip(c).step_by(stride) {
                v.push(f(ch.clone(), q.clone()).await?);
                pb.inc(1);
            }
            Ok(v)
        }));
    }
    Ok(join_all(tasks).await?.into_iter().flatten().collect())
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let prefix = amqp::unique_prefix("spooler");
    let queues: Arc<Vec<String>> =
        Arc::new((0..cfg.queues).map(|i| format!("{prefix}-{i}")).collect());
    let admin_conn = amqp::connect(&target.uri, "spooler admin").await?;
    let mut admin = Vec::new();
    for _ in 0..8 {
        admin.push(admin_conn.create_channel().await.ctx("open channel")?);
    }
    let pb = ui.bar(cfg.queues as u64, "spooler declare");
    per_queue(&admin, &queues, &pb, |ch, q| async move {
        amqp::declare_durable(&ch, &q).await?;
        Ok(0)
    })
    .await?;
    pb.finish_and_clear();

    let result = load(cfg, target, ui, &queues, &admin).await;

    let pb = ui.bar(cfg.queues as u64, "spooler delete");
    let deleted = per_queue(&admin, &queues, &pb, |ch, q| async move {
        amqp::delete(&ch, &q).await
    })
    .await;
    pb.finish_and_clear();
    amqp::close(&admin_conn).await;
    let mut out = result?;
    out.accounting.expect_eq(
        "messages left in queues at delete",
        deleted?.iter().sum(),
        0,
    );
    Ok(out)
}

/// Consumers on every queue: what they consumed, and each timed delivery's
/// end-to-end latency in ms.
struct Consumers {
    conns: Vec<(lapin::Connection, lapin::Channel)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    consumed: Arc<AtomicU64>,
    latencies_ms: Arc<Mutex<Vec<f64>>>,
}

/// What the timed load measured while it ran.
struct LoadRun {
    published: u64,
    confirmed: u64,
    load_s: f64,
    status_api_ms: Vec<f64>,
    status_amqp_ms: Vec<f64>,
    page_ms: Vec<f64>,
    status_cmd_ms: Vec<f64>,
}

async fn load(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    queues: &Arc<Vec<String>>,
    admin: &[lapin::Channel],
) -> Result<Outcome, BenchError> {
    let mut out = Outcome::default();
    let loaded = fill_backlog(cfg, target, ui, queues).await?;
    out.accounting
        .expect_eq("backlog confirmed", loaded, cfg.backlog);
    let pb = ui.bar(
        (cfg.consumer_connections + cfg.producers) as u64,
        "spooler connect",
    );
    let consumers = start_consumers(cfg, target, queues, &pb).await?;
    let run = run_load(cfg, target, ui, queues, admin, &pb).await?;
    out.accounting.published = cfg.backlog + run.published;
    out.accounting.confirmed = loaded + run.confirmed;

    let want = loaded + run.confirmed;
    let (consumed, settle_s) = settle(ui, &consumers.consumed, want, run.load_s).await;
    for (conn, _) in &consumers.conns {
        amqp::close(conn).await;
    }
    for t in consumers.tasks {
        t.abort();
    }
    out.accounting.consumed = consumed;
    out.accounting
        .expect_eq("load confirmed", run.confirmed, run.published);
    out.accounting
        .expect_eq("consumed = backlog + confirmed", consumed, want);
    let noop = ui.bar(0, "");
    let depth: u64 = per_queue(admin, queues, &noop, |ch, q| async move {
        amqp::depth(&ch, &q).await
    })
    .await?
    .iter()
    .sum();
    out.accounting
        .expect_eq("total depth after settle", depth, 0);
    let lat = std::mem::take(&mut *consumers.latencies_ms.lock().expect("latency lock"));
    out.accounting.expect_eq(
        "timed deliveries = confirmed load",
        lat.len() as u64,
        run.confirmed,
    );
    push_metrics(&mut out, run, lat, settle_s);
    if target.mgmt_url.is_none() {
        out.notes
            .push("no --mgmt-url: management API status latency not measured".into());
    }
    out.messages = want;
    Ok(out)
}

/// The backlog, round robin over the queues, confirms pipelined per
/// channel; returns how many were confirmed.
async fn fill_backlog(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    queues: &Arc<Vec<String>>,
) -> Result<u64, BenchError> {
    let pb = ui.bar(cfg.backlog, "spooler backlog");
    let loaders = connect_many(&target.uri, "spooler loader", 4, true, &ui.bar(0, "")).await?;
    let mut tasks = Vec::new();
    for (l, (conn, ch)) in loaders.into_iter().enumerate() {
        let (queues, pb, size, backlog) = (queues.clone(), pb.clone(), cfg.size, cfg.backlog);
        tasks.push(tokio::spawn(async move {
            let body = amqp::body(size, 0);
            let mut pending = std::collections::VecDeque::new();
            let mut n = 0u64;
            let mut i = l as u64;
            while i < backlog {
                let q = &queues[usize::try_from(i).expect("fits") % queues.len()];
                pending.push_back(amqp::publish(&ch, q, &body).await?);
                n += 1;
                if pending.len() >= 256 {
                    amqp::confirmed(pending.pop_front().expect("non-empty")).await?;
                    pb.inc(1);
                }
                i += 4;
            }
            while let Some(c) = pending.pop_front() {
                amqp::confirmed(c).await?;
                pb.inc(1);
            }
            amqp::close(&conn).await;
            Ok(n)
        }));
    }
    let loaded: u64 = join_all(tasks).await?.iter().sum();
    pb.finish_and_clear();
    Ok(loaded)
}

/// Consumers on every queue, spread over `consumer_connections`, acking
/// each delivery and timing the stamped ones.
async fn start_consumers(
    cfg: &Config,
    target: &Target,
    queues: &Arc<Vec<String>>,
    pb: &indicatif::ProgressBar,
) -> Result<Consumers, BenchError> {
    let consumed = Arc::new(AtomicU64::new(0));
    let latencies_ms: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let conns = connect_many(
        &target.uri,
        "spooler consumer",
        cfg.consumer_connections,
        false,
        pb,
    )
    .await?;
    let mut tasks = Vec::new();
    for (c, (_, ch)) in conns.iter().enumerate() {
        ch.basic_qos(cfg.prefetch, BasicQosOptions::default())
            .await
            .ctx("basic.qos")?;
        for q in queues.iter().skip(c).step_by(cfg.consumer_connections) {
            let mut consumer = ch
                .basic_consume(
                    q.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .ctx(format!("consume {q}"))?;
            let (ch, consumed, latencies) = (ch.clone(), consumed.clone(), latencies_ms.clone());
            tasks.push(tokio::spawn(async move {
                while let Some(d) = consumer.next().await {
                    let Ok(d) = d else { break };
                    if let Some(stamp) = amqp::stamp_of(&d.data) {
                        let lat_ms = amqp::now_us().saturating_sub(stamp) as f64 / 1e3;
                        latencies.lock().expect("latency lock").push(lat_ms);
                    }
                    if ch
                        .basic_ack(d.delivery_tag, BasicAckOptions::default())
                        .await
                        .is_err()
                    {
                        break;
                    }
                    consumed.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    Ok(Consumers {
        conns,
        tasks,
        consumed,
        latencies_ms,
    })
}

/// Producers at a fixed rate to random queues for `cfg.duration`, with the
/// status queries timed meanwhile.
async fn run_load(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    queues: &Arc<Vec<String>>,
    admin: &[lapin::Channel],
    connect_pb: &indicatif::ProgressBar,
) -> Result<LoadRun, BenchError> {
    let producers = connect_many(
        &target.uri,
        "spooler producer",
        cfg.producers,
        true,
        connect_pb,
    )
    .await?;
    connect_pb.finish_and_clear();
    let pb = ui.timed(cfg.duration, "spooler load");
    let ticker = crate::tick_seconds(&pb, cfg.duration);
    let started = Instant::now();
    let deadline = started + cfg.duration;
    let period = Duration::from_secs_f64(1.0 / cfg.rate_per_producer);
    let mut tasks = Vec::new();
    for (conn, ch) in producers {
        let (queues, size) = (queues.clone(), cfg.size);
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::SmallRng::from_rng(&mut rand::rng());
            let phase = period.mul_f64(rng.random::<f64>());
            let mut next = tokio::time::Instant::from_std(started) + phase;
            let (mut published, mut confirmed) = (0u64, 0u64);
            loop {
                tokio::time::sleep_until(next).await;
                if Instant::now() >= deadline {
                    break;
                }
                next += period;
                let q = &queues[rng.random_range(0..queues.len())];
                let c = amqp::publish(&ch, q, &amqp::body(size, amqp::now_us())).await?;
                published += 1;
                amqp::confirmed(c).await?;
                confirmed += 1;
            }
            amqp::close(&conn).await;
            Ok((published, confirmed))
        }));
    }
    let fast = mgmt_url_sampler(target.mgmt_url.as_deref(), deadline)?;
    let (status_api_ms, status_amqp_ms) =
        sample_status(cfg, target, ui, queues, admin, deadline).await?;
    let sent = join_all(tasks).await;
    let (page_ms, status_cmd_ms) = match fast {
        Some(h) => h.await.map_err(|e| BenchError::Task(e.to_string()))??,
        None => (Vec::new(), Vec::new()),
    };
    let load_s = started.elapsed().as_secs_f64();
    ticker.abort();
    pb.finish_and_clear();
    let (mut published, mut confirmed) = (0, 0);
    for (p, c) in sent? {
        published += p;
        confirmed += c;
    }
    Ok(LoadRun {
        published,
        confirmed,
        load_s,
        status_api_ms,
        status_amqp_ms,
        page_ms,
        status_cmd_ms,
    })
}

/// The status queries while under load, every `status_interval` until
/// `deadline`: `GET /api/queues` (with a management URL) and the AMQP
/// equivalent (a passive declare of every queue).
async fn sample_status(
    cfg: &Config,
    target: &Target,
    ui: &Ui,
    queues: &Arc<Vec<String>>,
    admin: &[lapin::Channel],
    deadline: Instant,
) -> Result<Samples, BenchError> {
    let mut status_api_ms = Vec::new();
    let mut status_amqp_ms = Vec::new();
    let mgmt = target
        .mgmt_url
        .as_deref()
        .map(crate::http::BaseUrl::parse)
        .transpose()?;
    while Instant::now() + cfg.status_interval < deadline {
        tokio::time::sleep(cfg.status_interval).await;
        if let Some(base) = &mgmt {
            let (code, _, took) =
                crate::http::get(base, "/api/queues", Duration::from_secs(60)).await?;
            if code != 200 {
                return Err(BenchError::Http(format!("GET /api/queues answered {code}")));
            }
            status_api_ms.push(amqp::ms(took));
        }
        let t0 = Instant::now();
        let noop = ui.bar(0, "");
        per_queue(&admin[..1], queues, &noop, |ch, q| async move {
            amqp::depth(&ch, &q).await
        })
        .await?;
        status_amqp_ms.push(amqp::ms(t0.elapsed()));
    }
    Ok((status_api_ms, status_amqp_ms))
}

/// Lets the consumers finish what is queued: waits until `want` were
/// consumed, or until they made no progress for
/// [`SETTLE_IDLE_TIMEOUT_S`]. Returns what was consumed and the seconds
/// since the load started (`load_s` ago at the call).
async fn settle(ui: &Ui, consumed: &AtomicU64, want: u64, load_s: f64) -> (u64, f64) {
    let started = Instant::now();
    let pb = ui.bar(want, "spooler settle");
    let mut last = (consumed.load(Ordering::Relaxed), Instant::now());
    loop {
        let now = consumed.load(Ordering::Relaxed);
        pb.set_position(now);
        if now >= want {
            break;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(SETTLE_IDLE_TIMEOUT_S) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pb.finish_and_clear();
    (
        consumed.load(Ordering::Relaxed),
        load_s + started.elapsed().as_secs_f64(),
    )
}

fn push_metrics(out: &mut Outcome, run: LoadRun, e2e_ms: Vec<f64>, settle_s: f64) {
    out.metrics.push(Metric::new(
        "publish_msgs_per_s",
        "msg/s",
        run.confirmed as f64 / run.load_s,
    ));
    out.metrics.push(Metric::new("settle_s", "s", settle_s));
    out.metrics.extend(latency_metrics("e2e", e2e_ms));
    for (name, ms) in [
        ("status_api", run.status_api_ms),
        ("status_amqp", run.status_amqp_ms),
    ] {
        out.metrics.extend(
            latency_metrics(name, ms)
                .into_iter()
                .filter(|m| m.name.ends_with("median") || m.name.ends_with("max")),
        );
    }
    out.metrics
        .extend(latency_metrics("status_page100", run.page_ms));
    out.metrics
        .extend(latency_metrics("status_cmd", run.status_cmd_ms));
}

/// Interval of the operator-facing status sampler.
const STATUS_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// Requests `berth status` makes, in order; the first 20 queues by name is
/// its default table.
const STATUS_CMD_PATHS: [&str; 4] = [
    "/api/overview",
    "/api/queues?page=1&page_size=20&sort=name",
    "/api/health/checks/alarms",
    "/metrics",
];

type Samples = (Vec<f64>, Vec<f64>);

/// Starts the 250 ms sampler of the queue page and of `berth status`'s
/// requests until `deadline`, when a management URL is given.
fn mgmt_url_sampler(
    url: Option<&str>,
    deadline: Instant,
) -> Result<Option<tokio::task::JoinHandle<Result<Samples, BenchError>>>, BenchError> {
    let Some(url) = url else { return Ok(None) };
    let base = crate::http::BaseUrl::parse(url)?;
    let timeout = Duration::from_secs(60);
    Ok(Some(tokio::spawn(async move {
        let (mut page, mut cmd) = (Vec::new(), Vec::new());
        while Instant::now() + STATUS_SAMPLE_INTERVAL < deadline {
            tokio::time::sleep(STATUS_SAMPLE_INTERVAL).await;
            let (code, _, took) =
                crate::http::get(&base, "/api/queues?page=1&page_size=100", timeout).await?;
            if code != 200 {
                return Err(BenchError::Http(format!(
                    "GET /api/queues?page=1&page_size=100 answered {code}"
                )));
            }
            page.push(amqp::ms(took));
            let t0 = Instant::now();
            for path in STATUS_CMD_PATHS {
                let (code, _, _) = crate::http::get(&base, path, timeout).await?;
                if code != 200 && path != "/metrics" {
                    return Err(BenchError::Http(format!("GET {path} answered {code}")));
                }
            }
            cmd.push(amqp::ms(t0.elapsed()));
        }
        Ok((page, cmd))
    })))
}
