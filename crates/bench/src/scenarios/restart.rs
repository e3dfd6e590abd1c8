//! Restart after `kill -9` with deep queues (seed 004, IBM MQ queue manager
//! restart): fill 10 durable queues with M persistent 2 KB messages each
//! while a request/reply load runs at a fixed rate, leave one uncommitted
//! transactional message on every queue, SIGKILL the broker, start it again,
//! and time until (1) it accepts an AMQP connection, (2) every queue reports
//! its full depth by passive declare, and (3) a consumer gets a message.
//! Done with a warm page cache and, where the OS allows dropping it, cold.
//!
//! The broker is killed by: the process group the bench started it in (from
//! the second restart on), else the pid in `--pid-file`, else `--kill-pid`
//! (or `--pid`), else `--kill-cmd`. It is started with `--start-cmd` (run by
//! `sh -c` in its own process group, output to `--broker-log`); a start
//! command may daemonize (e.g. `scripts/rabbitmq.sh start …`) or stay in the
//! foreground (`berth serve …`). A broker the bench started is left running
//! when the bench ends, ready for the next scenario.
//!
//! Accounting: published = confirmed = 10 × M; after every restart each
//! queue holds exactly M (confirmed messages survive, the uncommitted one
//! does not).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions};
use lapin::types::FieldTable;

use crate::amqp::{self, Ctx as _};
use crate::scenarios::{join_all, pagesize::drop_page_cache};
use crate::{BenchError, CommonArgs, Metric, Outcome, Scale, Target, Ui};

/// Longest wait for a broker to go down after the kill, or to come back.
pub const DOWN_TIMEOUT_S: u64 = 30;
/// Default for `--recovery-timeout` (smoke: 20 s).
pub const RECOVERY_TIMEOUT_S: u64 = 900;
/// Poll interval while waiting for recovery: the resolution of the figures.
const POLL_MS: u64 = 20;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Durable queues to fill.
    #[arg(long, default_value_t = 10)]
    pub queues: usize,
    /// Messages per queue [smoke: 50; default: 20,000; seed: 1,000,000].
    #[arg(long, value_name = "M")]
    pub messages: Option<u64>,
    /// Body size in bytes.
    #[arg(long, default_value_t = 2048)]
    pub size: usize,
    /// Request/reply round trips per second while filling.
    #[arg(long, default_value_t = 100.0)]
    pub rr_rate: f64,
    /// Page cache state at restart: warm, cold or both.
    #[arg(long, default_value = "both")]
    pub cache: String,
    /// Leave the filled queues on the restarted broker (to inspect its
    /// memory or restart it again) instead of deleting them at the end.
    #[arg(long)]
    pub keep_queues: bool,
    /// Command that starts the broker of --uri (run with sh -c).
    #[arg(long, value_name = "CMD")]
    pub start_cmd: Option<String>,
    /// Pid to SIGKILL for the first restart (default: --pid).
    #[arg(long, value_name = "PID")]
    pub kill_pid: Option<u32>,
    /// File holding the broker's pid, read before every kill.
    #[arg(long, value_name = "FILE")]
    pub pid_file: Option<PathBuf>,
    /// Command that SIGKILLs the broker (used when no pid is known).
    #[arg(long, value_name = "CMD")]
    pub kill_cmd: Option<String>,
    /// Start command for --vs.
    #[arg(long, value_name = "CMD")]
    pub vs_start_cmd: Option<String>,
    #[arg(long, value_name = "PID")]
    pub vs_kill_pid: Option<u32>,
    #[arg(long, value_name = "FILE")]
    pub vs_pid_file: Option<PathBuf>,
    #[arg(long, value_name = "CMD")]
    pub vs_kill_cmd: Option<String>,
    /// Longest wait in seconds for the restarted broker to show every queue
    /// at full depth [default: 900; smoke: 20].
    #[arg(long, value_name = "S")]
    pub recovery_timeout: Option<u64>,
    /// Where a started broker's stdout/stderr go [default: /dev/null].
    #[arg(long, value_name = "FILE")]
    pub broker_log: Option<PathBuf>,
}

/// How to kill and start one broker; remembers the broker it started.
#[derive(Debug, Clone, Default)]
pub struct Control {
    pub start_cmd: String,
    pub kill_pid: Option<u32>,
    pub pid_file: Option<PathBuf>,
    pub kill_cmd: Option<String>,
    pub log: Option<PathBuf>,
    started: Arc<Mutex<Option<Child>>>,
}

impl Control {
    #[must_use]
    pub fn new(start_cmd: impl Into<String>) -> Control {
        Control {
            start_cmd: start_cmd.into(),
            ..Control::default()
        }
    }

    /// Pid of the broker process group this bench started, if any.
    #[must_use]
    pub fn started_pid(&self) -> Option<u32> {
        self.started
            .lock()
            .expect("control lock")
            .as_ref()
            .map(Child::id)
    }

    /// SIGKILLs and reaps the broker this bench started (tests use this to
    /// stop what they started).
    pub fn kill_started(&self) -> Result<(), BenchError> {
        let Some(mut child) = self.started.lock().expect("control lock").take() else {
            return Ok(());
        };
        kill_group(child.id())?;
        child.wait().map_err(|source| BenchError::Io {
            context: "reap the killed broker".into(),
            source,
        })?;
        Ok(())
    }

    fn kill(&self) -> Result<(), BenchError> {
        if self.started_pid().is_some() {
            return self.kill_started();
        }
        if let Some(file) = &self.pid_file {
            let text = std::fs::read_to_string(file).map_err(|source| BenchError::Io {
                context: format!("read pid file {}", file.display()),
                source,
            })?;
            let pid: u32 = text.trim().parse().map_err(|_| {
                BenchError::Usage(format!("{}: not a pid: {text:?}", file.display()))
            })?;
            return kill(&pid.to_string());
        }
        if let Some(pid) = self.kill_pid {
            return kill(&pid.to_string());
        }
        if let Some(cmd) = &self.kill_cmd {
            return sh(cmd);
        }
        Err(BenchError::Usage(
            "restart needs --kill-pid, --pid, --pid-file or --kill-cmd to kill the broker".into(),
        ))
    }

    fn start(&self) -> Result<(), BenchError> {
        use std::os::unix::process::CommandExt as _;
        let (out, err) = match &self.log {
            Some(path) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| BenchError::Io {
                        context: format!("open broker log {}", path.display()),
                        source,
                    })?;
                let f2 = f.try_clone().map_err(|source| BenchError::Io {
                    context: "dup broker log".into(),
                    source,
                })?;
                (Stdio::from(f), Stdio::from(f2))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(&self.start_cmd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| BenchError::Io {
                context: format!("start broker: sh -c {:?}", self.start_cmd),
                source,
            })?;
        *self.started.lock().expect("control lock") = Some(child);
        Ok(())
    }

    /// Forgets a started command that already exited (it daemonized), so
    /// the next kill uses the pid file / pid / kill command instead.
    fn forget_if_exited(&self) {
        let mut guard = self.started.lock().expect("control lock");
        if let Some(child) = guard.as_mut() {
            if matches!(child.try_wait(), Ok(Some(_))) {
                *guard = None;
            }
        }
    }
}

fn kill_group(pgid: u32) -> Result<(), BenchError> {
    kill(&format!("-{pgid}"))
}

/// SIGKILL through the kill(1) program (a shell's builtin may not take a
/// process group).
fn kill(target: &str) -> Result<(), BenchError> {
    let status = std::process::Command::new("kill")
        .args(["-KILL", "--", target])
        .status()
        .map_err(|source| BenchError::Io {
            context: format!("run kill -KILL -- {target}"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(BenchError::Usage(format!(
            "kill -KILL -- {target} exited with {status}"
        )))
    }
}

fn sh(cmd: &str) -> Result<(), BenchError> {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .map_err(|source| BenchError::Io {
            context: format!("run {cmd:?}"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(BenchError::Usage(format!("{cmd:?} exited with {status}")))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    Warm,
    Cold,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub queues: usize,
    pub messages: u64,
    pub size: usize,
    pub rr_rate: f64,
    pub caches: Vec<Cache>,
    pub recovery_timeout: Duration,
    pub keep_queues: bool,
    /// Control of --uri ("a") and --vs ("b").
    pub control_a: Control,
    pub control_b: Option<Control>,
}

impl Config {
    pub fn from_args(a: &Args) -> Result<Config, BenchError> {
        let caches = match a.cache.as_str() {
            "warm" => vec![Cache::Warm],
            "cold" => vec![Cache::Cold],
            "both" => vec![Cache::Warm, Cache::Cold],
            other => {
                return Err(BenchError::Usage(format!(
                    "--cache warm|cold|both, not {other}"
                )))
            }
        };
        let start = a
            .start_cmd
            .clone()
            .ok_or_else(|| BenchError::Usage("restart needs --start-cmd".into()))?;
        let control_a = Control {
            kill_pid: a.kill_pid.or(a.common.pid),
            pid_file: a.pid_file.clone(),
            kill_cmd: a.kill_cmd.clone(),
            log: a.broker_log.clone(),
            ..Control::new(start)
        };
        let control_b = match (&a.common.vs, &a.vs_start_cmd) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(BenchError::Usage(
                    "restart with --vs needs --vs-start-cmd".into(),
                ))
            }
            (Some(_), Some(start)) => Some(Control {
                kill_pid: a.vs_kill_pid.or(a.common.vs_pid),
                pid_file: a.vs_pid_file.clone(),
                kill_cmd: a.vs_kill_cmd.clone(),
                log: a.broker_log.clone(),
                ..Control::new(start.clone())
            }),
        };
        Ok(Config {
            queues: a.queues.max(1),
            messages: a.messages.unwrap_or(match a.common.scale {
                Scale::Smoke => 50,
                Scale::Default => 20_000,
                Scale::Seed => 1_000_000,
            }),
            size: a.size.max(8),
            rr_rate: if a.common.scale == Scale::Smoke {
                20.0
            } else {
                a.rr_rate.max(0.0)
            },
            caches,
            recovery_timeout: Duration::from_secs(a.recovery_timeout.unwrap_or(
                if a.common.scale == Scale::Smoke {
                    20
                } else {
                    RECOVERY_TIMEOUT_S
                },
            )),
            keep_queues: a.keep_queues,
            control_a,
            control_b,
        })
    }

    fn control(&self, target: &Target) -> Result<&Control, BenchError> {
        match target.label {
            "b" => self
                .control_b
                .as_ref()
                .ok_or_else(|| BenchError::Usage("no restart control for --vs".into())),
            _ => Ok(&self.control_a),
        }
    }
}

/// host:port of an amqp:// URI (port 5672 when absent).
pub fn host_port(uri: &str) -> Result<String, BenchError> {
    let rest = uri
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| BenchError::Usage(format!("not a URI: {}", amqp::redact(uri))))?;
    let authority = rest.split('/').next().unwrap_or("");
    let hp = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hp.is_empty() {
        return Err(BenchError::Usage(format!(
            "no host in {}",
            amqp::redact(uri)
        )));
    }
    Ok(
        if hp
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hp.to_string()
        } else {
            format!("{hp}:5672")
        },
    )
}

pub async fn run_once(cfg: &Config, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
    let control = cfg.control(target)?;
    let prefix = amqp::unique_prefix("restart");
    let queues: Vec<String> = (0..cfg.queues).map(|i| format!("{prefix}-{i}")).collect();
    let (req_q, rep_q) = (format!("{prefix}-request"), format!("{prefix}-reply"));
    let mut out = Outcome::default();
    {
        let (conn, admin) = amqp::connect_channel(&target.uri, "restart admin", false).await?;
        for q in queues.iter().chain([&req_q, &rep_q]) {
            amqp::declare_durable(&admin, q).await?;
        }
        amqp::close(&conn).await;
    }

    // Request/reply load while filling.
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let rr = (cfg.rr_rate > 0.0).then(|| {
        tokio::spawn(request_reply(
            target.uri.clone(),
            req_q.clone(),
            rep_q.clone(),
            cfg.rr_rate,
            stop_rx,
        ))
    });

    // Fill.
    let total = cfg.messages * cfg.queues as u64;
    let pb = ui.bar(total, "restart fill");
    let filled = fill(cfg, target, &queues, &pb).await;
    pb.finish_and_clear();
    // Nobody listening any more only means the load already ended.
    stop.send(true).ok();
    let rr_result = match rr {
        Some(h) => Some(h.await.map_err(|e| BenchError::Task(e.to_string()))??),
        None => None,
    };
    for (p, c) in filled? {
        out.accounting.published += p;
        out.accounting.confirmed += c;
    }
    out.accounting
        .expect_eq("fill confirmed", out.accounting.confirmed, total);
    if let Some((round_trips, rtt_ms)) = rr_result {
        out.metrics.extend(
            crate::scenarios::latency_metrics("rr_round_trip", rtt_ms)
                .into_iter()
                .filter(|m| m.name.ends_with("median")),
        );
        out.metrics
            .push(Metric::new("rr_round_trips", "count", round_trips as f64));
    }

    // One uncommitted message per queue, left open at the kill.
    let (tx_conn, tx_ch) = amqp::connect_channel(&target.uri, "restart uncommitted", false).await?;
    tx_ch.tx_select().await.ctx("tx.select")?;
    for q in &queues {
        amqp::publish(&tx_ch, q, &amqp::body(cfg.size, 0)).await?;
    }
    {
        let (conn, admin) = amqp::connect_channel(&target.uri, "restart check", false).await?;
        for q in &queues {
            let d = amqp::depth(&admin, q).await?;
            out.accounting
                .expect_eq(&format!("depth of {q} before kill"), d, cfg.messages);
        }
        amqp::close(&conn).await;
    }

    for &cache in &cfg.caches {
        kill_and_time_restart(cfg, control, target, &queues, cache, ui, &mut out).await?;
    }
    // The uncommitted transaction died with the first broker.
    drop((tx_ch, tx_conn));
    if let Some(pid) = control.started_pid() {
        let note = format!("broker started by the bench is still running (process group {pid})");
        out.notes.push(note);
    }

    // Final check and clean-up on the restarted broker.
    let (conn, admin) = amqp::connect_channel(&target.uri, "restart cleanup", false).await?;
    for q in &queues {
        let d = if cfg.keep_queues {
            amqp::depth(&admin, q).await?
        } else {
            amqp::delete(&admin, q).await?
        };
        out.accounting
            .expect_eq(&format!("depth of {q} after restarts"), d, cfg.messages);
    }
    for q in [&req_q, &rep_q] {
        amqp::delete(&admin, q).await?;
    }
    amqp::close(&conn).await;
    Ok(out)
}

/// Fills every queue with `cfg.messages` persistent messages, one
/// connection per queue, confirms pipelined; per connection: (published,
/// confirmed).
async fn fill(
    cfg: &Config,
    target: &Target,
    queues: &[String],
    pb: &indicatif::ProgressBar,
) -> Result<Vec<(u64, u64)>, BenchError> {
    let mut tasks = Vec::new();
    for (i, q) in queues.iter().cloned().enumerate() {
        let (uri, n, size, pb) = (target.uri.clone(), cfg.messages, cfg.size, pb.clone());
        tasks.push(tokio::spawn(async move {
            let body = amqp::body(size, 0);
            let role = format!("restart filler {i}");
            amqp::publish_windowed(&uri, &role, &q, &body, n, 256, &pb).await
        }));
    }
    join_all(tasks).await
}

/// One kill -9 and restart with a warm or cold page cache: the times from
/// the start until the broker listens, accepts a connection, shows every
/// queue at full depth and delivers a first message.
async fn kill_and_time_restart(
    cfg: &Config,
    control: &Control,
    target: &Target,
    queues: &[String],
    cache: Cache,
    ui: &Ui,
    out: &mut Outcome,
) -> Result<(), BenchError> {
    let name = match cache {
        Cache::Warm => "warm",
        Cache::Cold => "cold",
    };
    let hp = host_port(&target.uri)?;
    control.kill()?;
    wait_down(&hp).await?;
    if cache == Cache::Cold {
        if let Err(why) = drop_page_cache() {
            out.notes.push(format!(
                "page cache not dropped ({why}): cold restart figures are warm"
            ));
        }
    }
    let t0 = Instant::now();
    control.start()?;
    let pb = ui.bar(3, format!("restart {name}"));
    let times = wait_recovered(
        &target.uri,
        &hp,
        queues,
        cfg.messages,
        cfg.recovery_timeout,
        &pb,
    )
    .await;
    pb.finish_and_clear();
    control.forget_if_exited();
    let (listen, connect, depth, first) = times?;
    for (what, at) in [
        ("listen_s", listen),
        ("connect_s", connect),
        ("all_depths_s", depth),
        ("first_message_s", first),
    ] {
        out.metrics.push(Metric::new(
            format!("{name}.{what}"),
            "s",
            (at - t0).as_secs_f64(),
        ));
    }
    Ok(())
}

/// Requester at `rate` round trips/s plus a responder; returns the round
/// trips completed and their times in ms.
async fn request_reply(
    uri: String,
    req_q: String,
    rep_q: String,
    rate: f64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(u64, Vec<f64>), BenchError> {
    let (resp_conn, resp_ch) = amqp::connect_channel(&uri, "restart responder", true).await?;
    let mut requests = resp_ch
        .basic_consume(
            req_q.as_str().into(),
            "responder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .ctx("consume requests")?;
    let rep = rep_q.clone();
    let responder = tokio::spawn(async move {
        while let Some(Ok(d)) = requests.next().await {
            // Echo the request (with its send stamp) as the reply.
            let Ok(c) = amqp::publish(&resp_ch, &rep, &d.data).await else {
                break;
            };
            if amqp::confirmed(c).await.is_err()
                || resp_ch
                    .basic_ack(d.delivery_tag, BasicAckOptions::default())
                    .await
                    .is_err()
            {
                break;
            }
        }
    });
    let (conn, ch) = amqp::connect_channel(&uri, "restart requester", true).await?;
    let mut replies = ch
        .basic_consume(
            rep_q.as_str().into(),
            "requester".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .ctx("consume replies")?;
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut rtt = Vec::new();
    'outer: loop {
        if *stop.borrow() {
            break;
        }
        let sent = amqp::now_us();
        let c = amqp::publish(&ch, &req_q, &amqp::body(2048, sent)).await?;
        amqp::confirmed(c).await?;
        let next = tokio::time::Instant::now() + period;
        // Wait for this request's reply (replies arrive in order).
        loop {
            tokio::select! {
                _ = stop.changed() => break 'outer,
                d = replies.next() => {
                    let Some(d) = d else { break 'outer };
                    let d = d.ctx("reply delivery")?;
                    ch.basic_ack(d.delivery_tag, BasicAckOptions::default()).await.ctx("ack reply")?;
                    if amqp::stamp_of(&d.data) == Some(sent) {
                        rtt.push((amqp::now_us() - sent) as f64 / 1e3);
                        break;
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.changed() => break,
            () = tokio::time::sleep_until(next) => {}
        }
    }
    amqp::close(&conn).await;
    amqp::close(&resp_conn).await;
    responder.abort();
    Ok((rtt.len() as u64, rtt))
}

/// Waits until nothing accepts connections at `hp`.
async fn wait_down(hp: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(DOWN_TIMEOUT_S);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(hp).await.is_err() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    Err(BenchError::Timeout(format!(
        "broker at {hp} still accepts connections {DOWN_TIMEOUT_S} s after the kill"
    )))
}

/// Times (listening, AMQP connection, all depths full, first message got).
async fn wait_recovered(
    uri: &str,
    hp: &str,
    queues: &[String],
    depth: u64,
    limit: Duration,
    pb: &indicatif::ProgressBar,
) -> Result<(Instant, Instant, Instant, Instant), BenchError> {
    let deadline = Instant::now() + limit;
    let poll = Duration::from_millis(POLL_MS);
    let timeout = |what: &str| BenchError::Timeout(format!("{what} within {limit:?} of restart"));
    while tokio::net::TcpStream::connect(hp).await.is_err() {
        if Instant::now() > deadline {
            return Err(timeout("broker listening"));
        }
        tokio::time::sleep(poll).await;
    }
    let listen = Instant::now();
    pb.inc(1);
    let conn = loop {
        // A freshly listening broker may still refuse the handshake.
        if let Ok(c) = amqp::connect(uri, "restart probe").await {
            break c;
        }
        if Instant::now() > deadline {
            return Err(timeout("AMQP connection"));
        }
        tokio::time::sleep(poll).await;
    };
    let connect = Instant::now();
    pb.inc(1);
    let mut ch = conn.create_channel().await.ctx("open channel")?;
    let mut next = 0;
    // What the queue being waited for last showed, for the timeout message.
    let mut last = String::new();
    while next < queues.len() {
        match amqp::depth(&ch, &queues[next]).await {
            Ok(d) if d >= depth => next += 1,
            Ok(d) => {
                last = format!("{} at depth {d} of {depth}", queues[next]);
                tokio::time::sleep(poll).await;
            }
            Err(e) => {
                // 404 while the queue is not recovered yet closes the channel.
                last = format!("{}: {e}", queues[next]);
                tokio::time::sleep(poll).await;
                ch = conn.create_channel().await.ctx("reopen channel")?;
            }
        }
        if Instant::now() > deadline {
            return Err(timeout(&format!(
                "all queues at full depth (last seen: {last})"
            )));
        }
    }
    let depths = Instant::now();
    pb.inc(1);
    loop {
        if let Some(m) = ch
            .basic_get(queues[0].as_str().into(), BasicGetOptions::default())
            .await
            .ctx("basic.get after restart")?
        {
            // Leave it on the queue: closing the channel requeues it.
            let _tag = m.delivery.delivery_tag;
            break;
        }
        if Instant::now() > deadline {
            return Err(timeout("first message"));
        }
        tokio::time::sleep(poll).await;
    }
    let first = Instant::now();
    ch.close(200, "probe done".into())
        .await
        .ctx("close probe channel")?;
    amqp::close(&conn).await;
    Ok((listen, connect, depths, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_of_uris() {
        assert_eq!(
            host_port("amqp://guest:guest@127.0.0.1:35672/%2f").unwrap(),
            "127.0.0.1:35672"
        );
        assert_eq!(host_port("amqp://localhost").unwrap(), "localhost:5672");
        assert_eq!(host_port("amqp://u:p@h/v").unwrap(), "h:5672");
        assert!(host_port("nope").is_err());
    }
}
