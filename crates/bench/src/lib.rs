//! `berth bench`: the seed experiments as a load generator against any
//! AMQP 0-9-1 broker, with ministat-style statistics over repeated runs.
//!
//! Entry point: [`run`] with [`BenchArgs`] (a `clap::Args`), e.g.
//! `berth bench fanin --uri amqp://… --vs amqp://… --runs 5`.
//!
//! Each run of a scenario against a broker yields named figures (a
//! [`Metric`] each) and an [`Accounting`] of what was published, confirmed
//! and consumed. A run whose accounting does not balance fails the bench:
//! a figure from a broker that lost or duplicated messages is not a figure.
//! Runs alternate between `--uri` and `--vs` (a, b, a, b, …) so slow drift
//! of the machine spreads over both brokers.
//!
//! Client: lapin for declares, consumers and transactions; confirmed
//! producers (fanin, pagesize) use [`publisher`], which drives its socket
//! from the publishing task (lapin spends an OS thread per connection on
//! its I/O loop and hands every frame to it). The client's own CPU is
//! reported with every run (`client_cpu_util`, `client_cpu_us_per_msg`) to
//! show when the load generator, not the broker, is the limit.

pub mod amqp;
pub mod cpus;
pub mod curve;
pub mod handoff;
pub mod http;
pub mod limits;
pub mod procstat;
pub mod publisher;
pub mod report;
pub mod scenarios;
pub mod stats;
pub mod uri;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use scenarios::ScenarioArgs;

/// `berth bench SCENARIO [OPTIONS]`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: ScenarioArgs,
}

/// Options every scenario takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Broker to measure (AMQP URI; the vhost "/" is %2f).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub uri: String,
    /// Second broker to compare against; runs alternate between the two.
    #[arg(long, value_name = "URI")]
    pub vs: Option<String>,
    /// Repetitions per broker. Each figure is reported over these with N,
    /// min, max, median, mean, stddev. 5 runs give a t-test with 8 degrees
    /// of freedom; a run of a scenario's defaults takes up to ~2 minutes, so
    /// 5 runs against two brokers cost up to ~20 minutes.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Length in seconds of each timed load phase (scenario default if unset).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// Directory for results.jsonl and summary.txt
    /// [default: bench-results/SCENARIO-UNIXTIME].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Size preset: smoke (seconds, for tests), default (under 2 min per run),
    /// seed (the seed experiment's own sizes; long, needs disk).
    #[arg(long, value_enum, default_value_t = Scale::Default)]
    pub scale: Scale,
    /// Broker process id (of --uri): CPU seconds per message from /proc.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Broker process id of --vs.
    #[arg(long)]
    pub vs_pid: Option<u32>,
    /// Management API base URL of --uri (http://user:pass@host:port) for the
    /// status-query latency (`GET /api/queues`).
    #[arg(long, value_name = "URL")]
    pub mgmt_url: Option<String>,
    /// Management API base URL of --vs.
    #[arg(long, value_name = "URL")]
    pub vs_mgmt_url: Option<String>,
    /// Confidence level of the comparison: 80, 90, 95, 98, 99 or 99.5.
    #[arg(long, default_value = "99.5")]
    pub confidence: String,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Directory on the broker's data disk where the machine's fdatasync
    /// latency is timed, for the bound of latency-bound figures (fanin)
    /// [default: the --out directory].
    #[arg(long, value_name = "DIR")]
    pub limits_dir: Option<PathBuf>,
    /// Do not measure the machine's limits (fdatasync, loopback RTT,
    /// thread hand-off).
    #[arg(long)]
    pub no_limits: bool,
}

impl CommonArgs {
    /// Defaults for a programmatic run (tests, examples) against `uri`.
    #[must_use]
    pub fn for_uri(uri: &str) -> CommonArgs {
        CommonArgs {
            uri: uri.to_string(),
            vs: None,
            runs: 1,
            duration: None,
            out: None,
            scale: Scale::Smoke,
            pid: None,
            vs_pid: None,
            mgmt_url: None,
            vs_mgmt_url: None,
            confidence: "99.5".into(),
            quiet: true,
            limits_dir: None,
            no_limits: true,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Smoke,
    Default,
    Seed,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{context}: {source}")]
    Amqp {
        context: String,
        #[source]
        source: lapin::Error,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The broker said something the bench's own publisher does not
    /// accept (a close, an unexpected frame, a tag it never sent).
    #[error("amqp: {0}")]
    Protocol(String),
    #[error("accounting does not balance: {0}")]
    Accounting(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("http: {0}")]
    Http(String),
    #[error("{0}")]
    Usage(String),
    #[error("a load task failed: {0}")]
    Task(String),
}

/// A broker under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// "a" (`--uri`) or "b" (`--vs`).
    pub label: &'static str,
    pub uri: String,
    pub pid: Option<u32>,
    pub mgmt_url: Option<String>,
}

/// One named figure of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub unit: &'static str,
    pub value: f64,
}

impl Metric {
    #[must_use]
    pub fn new(name: impl Into<String>, unit: &'static str, value: f64) -> Metric {
        Metric {
            name: name.into(),
            unit,
            value,
        }
    }
}

/// What a run did with messages, and every check that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounting {
    pub published: u64,
    pub confirmed: u64,
    pub consumed: u64,
    /// Human descriptions of failed checks; empty when everything balanced.
    pub failures: Vec<String>,
}

impl Accounting {
    /// Records a failure unless `got == want`.
    pub fn expect_eq(&mut self, what: &str, got: u64, want: u64) {
        if got != want {
            self.failures
                .push(format!("{what}: got {got}, expected {want}"));
        }
    }

    pub fn add(&mut self, other: &Accounting) {
        self.published += other.published;
        self.confirmed += other.confirmed;
        self.consumed += other.consumed;
        self.failures.extend(other.failures.iter().cloned());
    }
}

/// The result of one run of a scenario against one broker.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub metrics: Vec<Metric>,
    pub accounting: Accounting,
    /// Messages the broker handled in the run, for CPU per message (0: no
    /// per-message CPU figure, e.g. when the broker was restarted).
    pub messages: u64,
    /// Remarks for the summary (e.g. "page cache could not be dropped").
    pub notes: Vec<String>,
}

/// Progress bars; hidden when quiet or when stderr is not a terminal.
#[derive(Clone)]
pub struct Ui {
    multi: MultiProgress,
    quiet: bool,
}

impl Ui {
    #[must_use]
    pub fn new(quiet: bool) -> Ui {
        let multi = if quiet {
            MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
        } else {
            MultiProgress::new()
        };
        Ui { multi, quiet }
    }

    /// A bar for a phase of `len` steps.
    #[must_use]
    pub fn bar(&self, len: u64, msg: impl Into<String>) -> ProgressBar {
        if self.quiet {
            return ProgressBar::hidden();
        }
        let pb = self.multi.add(ProgressBar::new(len));
        pb.set_style(
            ProgressStyle::with_template(
                "{msg:32} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
            )
            .expect("static template"),
        );
        pb.set_message(msg.into());
        pb
    }

    /// A bar for a timed phase, counting seconds.
    #[must_use]
    pub fn timed(&self, duration: Duration, msg: impl Into<String>) -> ProgressBar {
        let pb = self.bar(duration.as_secs().max(1), msg);
        if !self.quiet {
            pb.set_style(
                ProgressStyle::with_template(
                    "{msg:32} [{elapsed_precise}] {wide_bar} {pos}/{len} s",
                )
                .expect("static template"),
            );
        }
        pb
    }

    /// A line printed above the bars.
    pub fn println(&self, line: impl AsRef<str>) {
        if self.quiet {
            return;
        }
        // Printing fails only when stderr is gone; nothing to tell then.
        self.multi.println(line).ok();
    }
}

/// Ticks a timed bar once a second until dropped.
pub(crate) fn tick_seconds(pb: &ProgressBar, duration: Duration) -> tokio::task::JoinHandle<()> {
    let pb = pb.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            pb.set_position(start.elapsed().as_secs().min(duration.as_secs().max(1)));
            if start.elapsed() >= duration {
                break;
            }
        }
    })
}

/// Runs `berth bench` to completion on its own tokio runtime: every run
/// of the scenario against `--uri` (and `--vs`), results in `--out`, the
/// summary on stdout.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::Io {
            context: "start the async runtime".into(),
            source,
        })?;
    rt.block_on(run_async(args))
}

/// [`run`] for callers that already have a tokio runtime.
pub async fn run_async(args: BenchArgs) -> Result<(), BenchError> {
    let common = match &args.scenario {
        ScenarioArgs::Curve(a) => return curve::run(a),
        s => s
            .common()
            .expect("every load scenario has the common options"),
    };
    let plan = scenarios::Plan::from_args(&args.scenario)?;
    let confidence = stats::Confidence::parse(&common.confidence).ok_or_else(|| {
        BenchError::Usage(format!(
            "--confidence must be one of 80, 90, 95, 98, 99, 99.5, not {}",
            common.confidence
        ))
    })?;
    if common.runs == 0 {
        return Err(BenchError::Usage("--runs must be at least 1".into()));
    }
    let name = plan.name();
    let out = common.out.clone().unwrap_or_else(|| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("bench-results/{name}-{secs}"))
    });
    let mut recorder = report::Recorder::create(&out)?;
    // Measured before the load, so the bench's own work does not slow it.
    // The hand-off prices the broker's sleeps wherever its CPU is counted.
    let counts_cpu = common.pid.is_some() || common.vs_pid.is_some();
    let limits = if common.no_limits || !(plan.has_latency_bound() || counts_cpu) {
        None
    } else {
        Some(limits::measure(common.limits_dir.as_ref().unwrap_or(&out))?)
    };
    let mut targets = vec![Target {
        label: "a",
        uri: common.uri.clone(),
        pid: common.pid,
        mgmt_url: common.mgmt_url.clone(),
    }];
    if let Some(vs) = &common.vs {
        targets.push(Target {
            label: "b",
            uri: vs.clone(),
            pid: common.vs_pid,
            mgmt_url: common.vs_mgmt_url.clone(),
        });
    }
    let ui = Ui::new(common.quiet);
    let mut notes: Vec<String> = Vec::new();
    for run in 1..=common.runs {
        for target in &targets {
            let started = Instant::now();
            let outcome = measure(&plan, target, &ui).await?;
            eprintln!(
                "{name} run {run}/{} on {} ({}): {} published, {} confirmed, {} consumed, {:.1} s",
                common.runs,
                target.label,
                amqp::redact(&target.uri),
                outcome.accounting.published,
                outcome.accounting.confirmed,
                outcome.accounting.consumed,
                started.elapsed().as_secs_f64()
            );
            for n in &outcome.notes {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
            let time_s = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            for m in outcome.metrics {
                recorder.record(report::Sample {
                    scenario: name.to_string(),
                    target: target.label.to_string(),
                    uri: amqp::redact(&target.uri),
                    run,
                    metric: m.name,
                    unit: m.unit.to_string(),
                    value: m.value,
                    time_s,
                })?;
            }
        }
    }
    let mut text = report::summary(recorder.samples(), confidence);
    if let Some(l) = &limits {
        text.push_str(&limits::section(recorder.samples(), l));
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    text.push_str(&limits::cpu_section(
        recorder.samples(),
        cores,
        limits.as_ref().and_then(|l| l.handoffs.as_ref()),
    ));
    for n in &notes {
        text.push_str(&format!("\nnote: {n}"));
    }
    println!("{text}");
    let path = out.join("summary.txt");
    std::fs::write(&path, &text).map_err(|source| BenchError::Io {
        context: format!("write {}", path.display()),
        source,
    })?;
    eprintln!("results in {}", out.display());
    Ok(())
}

/// One run against one target, with CPU accounting around it; fails when
/// the run's accounting does not balance.
pub async fn measure(
    plan: &scenarios::Plan,
    target: &Target,
    ui: &Ui,
) -> Result<Outcome, BenchError> {
    let broker0 = target.pid.and_then(procstat::usage_tree);
    let client_cpu0 = procstat::self_cpu_seconds();
    let wall0 = Instant::now();
    let mut outcome = plan.run_once(target, ui).await?;
    let wall_s = wall0.elapsed().as_secs_f64();
    if !outcome.accounting.failures.is_empty() {
        return Err(BenchError::Accounting(format!(
            "{} on {}: {}",
            plan.name(),
            amqp::redact(&target.uri),
            outcome.accounting.failures.join("; ")
        )));
    }
    let msgs = outcome.messages as f64;
    if let (Some(c0), Some(c1)) = (client_cpu0, procstat::self_cpu_seconds()) {
        outcome
            .metrics
            .push(Metric::new("client_cpu_util", "cores", (c1 - c0) / wall_s));
        if msgs > 0.0 {
            outcome.metrics.push(Metric::new(
                "client_cpu_us_per_msg",
                "us/msg",
                (c1 - c0) * 1e6 / msgs,
            ));
        }
    }
    if let (Some(u0), Some(pid)) = (broker0, target.pid) {
        match procstat::usage_tree(pid) {
            Some(u1) if msgs > 0.0 => {
                let (c0, c1) = (u0.cpu_s, u1.cpu_s);
                if let Some(us) = u1.cpu_us_per_msg_since(&u0, outcome.messages) {
                    outcome
                        .metrics
                        .push(Metric::new("broker_cpu_us_per_msg", "us/msg", us));
                }
                outcome
                    .metrics
                    .push(Metric::new("broker_cpu_util", "cores", (c1 - c0) / wall_s));
                let sleeps = u1.sleeps.saturating_sub(u0.sleeps) as f64;
                outcome.metrics.push(Metric::new(
                    "broker_sleeps_per_msg",
                    "sleeps/msg",
                    sleeps / msgs,
                ));
            }
            Some(_) => {}
            None => outcome
                .notes
                .push(format!("broker pid {pid} vanished during the run")),
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn typical_command_lines_parse_into_plans() {
        let cli = Cli::try_parse_from([
            "bench",
            "fanin",
            "--uri",
            "amqp://a",
            "--vs",
            "amqp://b",
            "--runs",
            "3",
            "--concurrency",
            "1,2",
            "--pid",
            "7",
        ])
        .unwrap();
        let common = cli.bench.scenario.common().unwrap();
        assert_eq!((common.runs, common.pid), (3, Some(7)));
        assert_eq!(common.vs.as_deref(), Some("amqp://b"));
        let plan = scenarios::Plan::from_args(&cli.bench.scenario).unwrap();
        assert_eq!(plan.name(), "fanin");
        let cli = Cli::try_parse_from(["bench", "restart", "--scale", "smoke"]).unwrap();
        let err = scenarios::Plan::from_args(&cli.bench.scenario).unwrap_err();
        assert!(err.to_string().contains("--start-cmd"), "{err}");
    }
}
