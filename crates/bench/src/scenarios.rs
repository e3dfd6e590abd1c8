//! The five seed experiments, and `compaction` (issue 16). Each module has its `Args` (clap), a `Config`
//! resolved from the args and the `--scale` preset, and `run_once`, one run
//! against one broker returning figures and accounting.

pub mod compaction;
pub mod fanin;
pub mod groupcommit;
pub mod pagesize;
pub mod restart;
pub mod spooler;

use tokio::task::JoinHandle;

use crate::stats::{percentile_sorted, Summary};
use crate::{BenchError, CommonArgs, Metric, Outcome, Target, Ui};

#[derive(clap::Subcommand, Debug, Clone)]
pub enum ScenarioArgs {
    /// Mail-queue seed (001): 1/5/10/20 concurrent producers of confirmed
    /// persistent 1 KB messages into one queue, then into one queue each;
    /// time to enqueue per message and throughput per concurrency.
    Fanin(fanin::Args),
    /// Page-store seed (002): 5 producers fill 5 durable queues with no
    /// consumer, then 5 consumers drain them; 2 KB and 16 KB bodies;
    /// produce and drain rates separately.
    Pagesize(pagesize::Args),
    /// Group-commit seed (003): concurrent transactional clients (publish k +
    /// commit, get k + ack + commit), with and without clients that roll
    /// back or stall before commit; tx/s and response time of the good ones.
    Groupcommit(groupcommit::Args),
    /// Spooler seed (000): many queues, many producer connections at a fixed
    /// rate, consumers on every queue, a pre-loaded backlog; end-to-end
    /// latency and status-query latency under load.
    Spooler(spooler::Args),
    /// Queue-manager restart seed (004): fill 10 durable queues under a
    /// request/reply load, SIGKILL the broker, restart it, time until every
    /// queue reports its depth and a consumer gets a message.
    Restart(restart::Args),
    /// Online compaction (issue 16): confirm latency of one steady
    /// publisher alone, then while a large compaction runs (triggered
    /// through the management API; needs --mgmt-url).
    Compaction(compaction::Args),
    /// Not a load: draws the latency-vs-rate curve of a PerfTest rate
    /// sweep (`scripts/perftest.sh --rates ...`, its runs.tsv) as SVG.
    Curve(crate::curve::Args),
}

impl ScenarioArgs {
    /// The options every load scenario takes; `None` for `curve`, which
    /// puts no load on a broker.
    #[must_use]
    pub fn common(&self) -> Option<&CommonArgs> {
        match self {
            ScenarioArgs::Fanin(a) => Some(&a.common),
            ScenarioArgs::Pagesize(a) => Some(&a.common),
            ScenarioArgs::Groupcommit(a) => Some(&a.common),
            ScenarioArgs::Spooler(a) => Some(&a.common),
            ScenarioArgs::Restart(a) => Some(&a.common),
            ScenarioArgs::Compaction(a) => Some(&a.common),
            ScenarioArgs::Curve(_) => None,
        }
    }
}

/// A scenario with its sizes resolved.
#[derive(Debug, Clone)]
pub enum Plan {
    Fanin(fanin::Config),
    Pagesize(pagesize::Config),
    Groupcommit(groupcommit::Config),
    Spooler(spooler::Config),
    Restart(Box<restart::Config>),
    Compaction(compaction::Config),
}

impl Plan {
    pub fn from_args(args: &ScenarioArgs) -> Result<Plan, BenchError> {
        Ok(match args {
            ScenarioArgs::Fanin(a) => Plan::Fanin(fanin::Config::from_args(a)?),
            ScenarioArgs::Pagesize(a) => Plan::Pagesize(pagesize::Config::from_args(a)?),
            ScenarioArgs::Groupcommit(a) => Plan::Groupcommit(groupcommit::Config::from_args(a)?),
            ScenarioArgs::Spooler(a) => Plan::Spooler(spooler::Config::from_args(a)?),
            ScenarioArgs::Restart(a) => Plan::Restart(Box::new(restart::Config::from_args(a)?)),
            ScenarioArgs::Compaction(a) => Plan::Compaction(compaction::Config::from_args(a)?),
            ScenarioArgs::Curve(_) => {
                return Err(BenchError::Usage("curve is not a load scenario".into()))
            }
        })
    }

    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Plan::Fanin(_) => "fanin",
            Plan::Pagesize(_) => "pagesize",
            Plan::Groupcommit(_) => "groupcommit",
            Plan::Spooler(_) => "spooler",
            Plan::Restart(_) => "restart",
            Plan::Compaction(_) => "compaction",
        }
    }

    /// Whether its figures include latency-bound ones (`limits.rs`).
    #[must_use]
    pub fn has_latency_bound(&self) -> bool {
        matches!(self, Plan::Fanin(_))
    }

    pub async fn run_once(&self, target: &Target, ui: &Ui) -> Result<Outcome, BenchError> {
        match self {
            Plan::Fanin(c) => fanin::run_once(c, target, ui).await,
            Plan::Pagesize(c) => pagesize::run_once(c, target, ui).await,
            Plan::Groupcommit(c) => groupcommit::run_once(c, target, ui).await,
            Plan::Spooler(c) => spooler::run_once(c, target, ui).await,
            Plan::Restart(c) => restart::run_once(c, target, ui).await,
            Plan::Compaction(c) => compaction::run_once(c, target, ui).await,
        }
    }
}

/// Median, p99, mean and max of latencies in milliseconds, named
/// `{prefix}_ms_median` etc.; nothing when there are none.
pub(crate) fn latency_metrics(prefix: &str, mut ms: Vec<f64>) -> Vec<Metric> {
    ms.sort_by(f64::total_cmp);
    let Some(s) = Summary::of(&ms) else {
        return Vec::new();
    };
    vec![
        Metric::new(format!("{prefix}_ms_median"), "ms", s.median),
        Metric::new(
            format!("{prefix}_ms_p99"),
            "ms",
            percentile_sorted(&ms, 0.99),
        ),
        Metric::new(format!("{prefix}_ms_mean"), "ms", s.mean),
        Metric::new(format!("{prefix}_ms_max"), "ms", s.max),
    ]
}

/// Awaits every task; the first error (or panic) wins, after all finished.
pub(crate) async fn join_all<T>(
    handles: Vec<JoinHandle<Result<T, BenchError>>>,
) -> Result<Vec<T>, BenchError> {
    let mut out = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for h in handles {
        match h.await {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(BenchError::Task(e.to_string()));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Parses "1,5,10,20".
pub(crate) fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, BenchError> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    BenchError::Usage(format!("{what}: {p:?} is not a positive integer"))
                })
        })
        .collect()
}

/// Seconds as a Duration, rejecting nonsense.
pub(crate) fn secs(s: f64, what: &str) -> Result<std::time::Duration, BenchError> {
    if s.is_finite() && s > 0.0 {
        Ok(std::time::Duration::from_secs_f64(s))
    } else {
        Err(BenchError::Usage(format!(
            "{what} must be a positive number of seconds, not {s}"
        )))
    }
}
