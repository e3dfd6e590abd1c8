//! The machine's own limits, measured where the bench runs, and the bound
//! they put on each latency-bound figure (issue 20 goal 1).
//!
//! A confirmed persistent publish is not confirmed before its record is
//! fdatasynced and the confirm has crossed back to the client. With N
//! producers that each keep one publish in flight (fanin), and one
//! fdatasync covering all N (group commit), no broker confirms more than
//! N / (fsync + RTT) messages a second on this machine: the *bound*. The
//! summary prints it beside each such figure with the fraction of it each
//! broker reached.
//!
//! - fsync: the cheapest durable append the disk takes. Blocks of
//!   [`FSYNC_APPEND_BYTES`] written in order into a file of the given
//!   directory (put it on the broker's data disk) that already holds
//!   zeros, so no write changes its size, past the page cache
//!   (`O_DIRECT`) where the file system allows it, each followed by
//!   `fdatasync`: as berth's writer appends to a prepared segment. The
//!   median of [`FSYNC_SAMPLES`]. (Appends that grow a file, through the
//!   page cache, took twice as long on the reference VM: a bound taken
//!   from them was one berth's own appends went past.) Also the CPU the
//!   appending thread spent per append: on a VM, kicking the virtual disk
//!   costs the guest CPU (70 µs of it on the reference VM), a floor for
//!   a message that has an fdatasync to itself.
//! - RTT: a 64-byte ping-pong over a loopback TCP connection
//!   (`TCP_NODELAY`), the median of [`RTT_SAMPLES`], timed with both ends
//!   pinned within one CPU and across two (their medians differed 4-fold
//!   when the scheduler placed them, flipping from run to run). The bound
//!   takes the cheaper: a bound is the most any broker could reach.
//! - Hand-off: what one thread waking another that sleeps costs in CPU,
//!   within one CPU and across two (`handoff.rs`). It prices the broker's
//!   sleeps per message in the CPU section.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use crate::cpus;
use crate::handoff::{self, Handoff, Handoffs};
use crate::report::Sample;
use crate::stats::{g6, percentile_sorted};
use crate::BenchError;

/// fdatasync calls timed.
pub const FSYNC_SAMPLES: usize = 200;
/// Bytes appended before each fdatasync (about one batch of small records).
pub const FSYNC_APPEND_BYTES: usize = 4096;
/// Loopback round trips timed.
pub const RTT_SAMPLES: usize = 2000;

/// What was measured, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub fsync_s_median: f64,
    pub fsync_s_p99: f64,
    /// CPU the appending thread spent per append (the write and its
    /// fdatasync): on a VM, kicking the virtual disk costs the guest CPU.
    /// A message with an fdatasync of its own costs at least this.
    pub fsync_cpu_s: f64,
    /// The cheaper placement's loopback round trip (the bound's).
    pub rtt_s_median: f64,
    pub rtt_s_p99: f64,
    /// The round trip's median within one CPU, and across two where the
    /// process may use two.
    pub rtt_within_s_median: f64,
    pub rtt_across_s_median: Option<f64>,
    /// One thread waking another that sleeps; `None` when it could not be
    /// timed (the bench runs on without it).
    pub handoffs: Option<Handoffs>,
}

impl Limits {
    /// The most confirmed publishes per second `producers` can get, one
    /// in flight each, when one fdatasync covers them all.
    #[must_use]
    pub fn fanin_bound_per_s(&self, producers: usize) -> f64 {
        let n = producers as f64;
        n / (self.fsync_s_median + self.rtt_s_median)
    }
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { context, source }
}

/// Measures the limits; `dir` should be on the broker's data disk. The
/// hand-off only prices a diagnostic figure, so a machine where it cannot
/// be timed (threads that may not be pinned) gets a warning, not a failed
/// bench.
pub fn measure(dir: &Path) -> Result<Limits, BenchError> {
    let (fsync_s_median, fsync_s_p99, fsync_cpu_s) = fsync_seconds(dir)?;
    let cpus = cpus::allowed();
    let first = cpus.first().copied();
    let within = rtt_seconds(first.map(|c| (c, c)))?;
    let across = match (first, cpus.get(1)) {
        (Some(a), Some(&b)) => Some(rtt_seconds(Some((a, b)))?),
        _ => None,
    };
    let (rtt_s_median, rtt_s_p99) = match across {
        Some(a) if a.0 < within.0 => a,
        _ => within,
    };
    let handoffs = handoff::measure()
        .map_err(|e| eprintln!("warning: the thread hand-off was not timed: {e}"))
        .ok();
    Ok(Limits {
        fsync_s_median,
        fsync_s_p99,
        fsync_cpu_s,
        rtt_s_median,
        rtt_s_p99,
        rtt_within_s_median: within.0,
        rtt_across_s_median: across.map(|a| a.0),
        handoffs,
    })
}

fn median_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (percentile_sorted(&v, 0.5), percentile_sorted(&v, 0.99))
}

/// The append's median and p99 wall time, and its CPU (the mean).
fn fsync_seconds(dir: &Path) -> Result<(f64, f64, f64), BenchError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let path = dir.join(format!(".berth-bench-fsync-{}", std::process::id()));
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(io(format!("create {}", path.display())))?;
        let zeros = vec![0u8; FSYNC_SAMPLES * FSYNC_APPEND_BYTES];
        file.write_all_at(&zeros, 0)
            .map_err(io(format!("write zeros to {}", path.display())))?;
        file.sync_data()
            .map_err(io(format!("fdatasync {}", path.display())))?;
        // Past the page cache where the file system allows it (not tmpfs).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .or_else(|_| std::fs::OpenOptions::new().write(true).open(&path))
            .map_err(io(format!("open {}", path.display())))?;
        // O_DIRECT memory starts on a block boundary.
        let mut mem = vec![0x5a_u8; 2 * FSYNC_APPEND_BYTES];
        let at = mem.as_ptr().align_offset(FSYNC_APPEND_BYTES);
        let block = &mut mem[at..at + FSYNC_APPEND_BYTES];
        let mut took = Vec::with_capacity(FSYNC_SAMPLES);
        let cpu0 = cpus::thread_cpu_s();
        for i in 0..FSYNC_SAMPLES {
            let t0 = Instant::now();
            file.write_all_at(block, (i * FSYNC_APPEND_BYTES) as u64)
                .map_err(io(format!("append to {}", path.display())))?;
            file.sync_data()
                .map_err(io(format!("fdatasync {}", path.display())))?;
            took.push(t0.elapsed().as_secs_f64());
        }
        let cpu = (cpus::thread_cpu_s() - cpu0) / FSYNC_SAMPLES as f64;
        Ok((took, cpu))
    })();
    let removed = std::fs::remove_file(&path).map_err(io(format!("remove {}", path.display())));
    let (took, cpu) = match (result, removed) {
        (Ok(took), Ok(())) => took,
        (Err(e), _) | (Ok(_), Err(e)) => return Err(e),
    };
    let (median, p99) = median_p99(took);
    Ok((median, p99, cpu))
}

/// The loopback round trip's median and p99, the client's thread and the
/// echo's pinned to `cpus` (client, echo) when given. A thread that may not
/// be pinned runs where the scheduler puts it.
fn rtt_seconds(cpus: Option<(usize, usize)>) -> Result<(f64, f64), BenchError> {
    let pin = |cpu: Option<usize>| {
        if let Some(Err(e)) = cpu.map(cpus::pin) {
            eprintln!("warning: loopback RTT probe: {e}");
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind loopback".into()))?;
    let addr = listener
        .local_addr()
        .map_err(io("loopback address".into()))?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        pin(cpus.map(|c| c.1));
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        for _ in 0..RTT_SAMPLES {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let client = std::thread::spawn(move || -> Result<Vec<f64>, BenchError> {
        pin(cpus.map(|c| c.0));
        let mut s = TcpStream::connect(addr).map_err(io("connect loopback".into()))?;
        s.set_nodelay(true).map_err(io("TCP_NODELAY".into()))?;
        let mut buf = [7u8; 64];
        let mut took = Vec::with_capacity(RTT_SAMPLES);
        for _ in 0..RTT_SAMPLES {
            let t0 = Instant::now();
            s.write_all(&buf).map_err(io("loopback write".into()))?;
            s.read_exact(&mut buf).map_err(io("loopback read".into()))?;
            took.push(t0.elapsed().as_secs_f64());
        }
        Ok(took)
    });
    let took = client
        .join()
        .map_err(|_| BenchError::Task("the loopback client thread panicked".into()))??;
    echo.join()
        .map_err(|_| BenchError::Task("the loopback echo thread panicked".into()))?
        .map_err(io("loopback echo".into()))?;
    Ok(median_p99(took))
}

/// The producers a latency-bound figure had, one publish in flight each:
/// fanin's `MODE.cN.msgs_per_s`.
fn producers_of(scenario: &str, metric: &str) -> Option<usize> {
    if scenario != "fanin" {
        return None;
    }
    let rest = metric.strip_suffix(".msgs_per_s")?;
    let (_, c) = rest.split_once(".c")?;
    c.parse().ok()
}

/// The limits section of the summary: the two latencies, then per
/// latency-bound figure its bound and each broker's median as a fraction
/// of it. Empty when the scenario has no latency-bound figure.
#[must_use]
pub fn section(samples: &[Sample], limits: &Limits) -> String {
    let mut rows: Vec<(String, usize)> = Vec::new();
    for s in samples {
        if let Some(n) = producers_of(&s.scenario, &s.metric) {
            if !rows.iter().any(|(m, _)| *m == s.metric) {
                rows.push((s.metric.clone(), n));
            }
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let ms = |s: f64| g6(s * 1e3);
    let mut out = format!(
        "\nmachine limits: fdatasync {} ms median ({} ms p99, {FSYNC_SAMPLES} appends of {FSYNC_APPEND_BYTES} B, each costing {} us of its thread's CPU), loopback RTT {} ms median ({} ms p99; {} ms within one CPU, {} ms across two)\n",
        ms(limits.fsync_s_median),
        ms(limits.fsync_s_p99),
        g6(limits.fsync_cpu_s * 1e6),
        ms(limits.rtt_s_median),
        ms(limits.rtt_s_p99),
        ms(limits.rtt_within_s_median),
        limits.rtt_across_s_median.map_or_else(|| "-".into(), ms)
    );
    out.push_str(
        "bound = producers / (fsync + RTT): one publish in flight each, one fdatasync for all\n",
    );
    let _ = writeln!(
        out,
        "{:<24} {:>12} {:>12} {:>8} {:>12} {:>8}",
        "figure", "bound msg/s", "a median", "a/bound", "b median", "b/bound"
    );
    for (metric, n) in rows {
        let bound = limits.fanin_bound_per_s(n);
        let median = |target: &str| median_of(samples, &metric, target);
        let cell = |m: Option<f64>| {
            m.map_or(("-".into(), "-".into()), |m| {
                (g6(m), format!("{:.0}%", 100.0 * m / bound))
            })
        };
        let (a, a_frac) = cell(median("a"));
        let (b, b_frac) = cell(median("b"));
        let _ = writeln!(
            out,
            "{metric:<24} {:>12} {a:>12} {a_frac:>8} {b:>12} {b_frac:>8}",
            g6(bound)
        );
    }
    out
}

/// The median of `metric` over `target`'s runs.
fn median_of(samples: &[Sample], metric: &str, target: &str) -> Option<f64> {
    let mut v: Vec<f64> = samples
        .iter()
        .filter(|s| s.metric == metric && s.target == target)
        .map(|s| s.value)
        .collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| percentile_sorted(&v, 0.5))
}

/// CPU per message of the load generator beside the broker's (issue 20
/// goal 8), per target: medians of `client_cpu_us_per_msg` and
/// `broker_cpu_us_per_msg`, and the rate at which the two together would
/// fill `cores` (the machine's CPU bound when both share it). With the
/// broker's sleeps per message (`broker_sleeps_per_msg`) and the
/// machine's hand-off cost, also what those sleeps and their wake-ups cost
/// at that price. Empty when no run reported the client's CPU.
#[must_use]
pub fn cpu_section(samples: &[Sample], cores: usize, handoffs: Option<&Handoffs>) -> String {
    let mut out = String::new();
    for target in ["a", "b"] {
        let Some(client) = median_of(samples, "client_cpu_us_per_msg", target) else {
            continue;
        };
        if out.is_empty() {
            let _ = writeln!(
                out,
                "\nCPU per message (medians): client = this bench, broker = --pid; bound = {cores} cores / (client + broker)"
            );
            if let Some(h) = handoffs {
                let cost = |p: &Handoff| {
                    format!(
                        "{} us of CPU ({} us wall)",
                        g6(p.cpu_s * 1e6),
                        g6(p.wall_s * 1e6)
                    )
                };
                let across = h.across.as_ref().map_or_else(|| "-".into(), &cost);
                let _ = writeln!(
                    out,
                    "sleeps = the broker's voluntary context switches; a thread hand-off (a wake-up and a sleep) costs {} within one CPU, {across} across two: hand-offs = sleeps x those",
                    cost(&h.within)
                );
            }
            let _ = writeln!(
                out,
                "{:<8} {:>14} {:>14} {:>16} {:>12} {:>16}",
                "target",
                "client us/msg",
                "broker us/msg",
                "CPU bound msg/s",
                "sleeps/msg",
                "hand-offs us/msg"
            );
        }
        let broker = median_of(samples, "broker_cpu_us_per_msg", target);
        let bound = broker.map(|b| cores as f64 * 1e6 / (client + b));
        let sleeps = median_of(samples, "broker_sleeps_per_msg", target);
        let priced = sleeps.zip(handoffs).map(|(n, h)| {
            let price = |p: &Handoff| g6(n * p.cpu_s * 1e6);
            match &h.across {
                Some(across) => format!("{}-{}", price(&h.within), price(across)),
                None => price(&h.within),
            }
        });
        let _ = writeln!(
            out,
            "{target:<8} {:>14} {:>14} {:>16} {:>12} {:>16}",
            g6(client),
            broker.map_or("-".into(), g6),
            bound.map_or("-".into(), g6),
            sleeps.map_or("-".into(), g6),
            priced.unwrap_or_else(|| "-".into())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: &str, metric: &str, value: f64) -> Sample {
        Sample {
            scenario: "fanin".into(),
            target: target.into(),
            uri: String::new(),
            run: 1,
            metric: metric.into(),
            unit: "msg/s".into(),
            value,
            time_s: 0.0,
        }
    }

    /// 0.3 ms fsync, 0.1 ms RTT; a hand-off of 4 us within a CPU, 20 us
    /// of CPU (40 us wall) across two.
    fn limits() -> Limits {
        Limits {
            fsync_s_median: 0.0003,
            fsync_s_p99: 0.001,
            fsync_cpu_s: 0.000_07,
            rtt_s_median: 0.0001,
            rtt_s_p99: 0.0002,
            rtt_within_s_median: 0.0001,
            rtt_across_s_median: Some(0.0004),
            handoffs: Some(Handoffs {
                within: Handoff {
                    wall_s: 0.000_004,
                    cpu_s: 0.000_004,
                },
                across: Some(Handoff {
                    wall_s: 0.000_04,
                    cpu_s: 0.000_02,
                }),
            }),
        }
    }

    #[test]
    fn each_fanin_rate_gets_its_bound_and_fraction() {
        // 0.3 ms fsync + 0.1 ms RTT: 2,500 msg/s per producer.
        let limits = limits();
        assert!((limits.fanin_bound_per_s(10) - 25_000.0).abs() < 1e-6);
        let samples = [
            sample("a", "shared.c10.msgs_per_s", 20_000.0),
            sample("b", "shared.c10.msgs_per_s", 5_000.0),
            sample("a", "shared.c10.enqueue_ms_median", 0.5),
        ];
        let text = section(&samples, &limits);
        let row = text
            .lines()
            .find(|l| l.starts_with("shared.c10.msgs_per_s"))
            .expect("a row for the rate");
        assert!(
            row.contains("25000") && row.contains("80%") && row.contains("20%"),
            "{row}"
        );
        assert!(!text.contains("enqueue_ms"), "{text}");
        assert!(
            text.contains("0.1 ms within one CPU, 0.4 ms across two"),
            "{text}"
        );
        assert_eq!(section(&samples[2..], &limits), "");
    }

    #[test]
    fn cpu_per_message_of_client_and_broker_side_by_side() {
        let mut samples = Vec::new();
        for (client, broker) in [(10.0, 40.0), (12.0, 38.0), (30.0, 90.0)] {
            samples.push(sample("a", "client_cpu_us_per_msg", client));
            samples.push(sample("a", "broker_cpu_us_per_msg", broker));
        }
        samples.push(sample("b", "client_cpu_us_per_msg", 11.0));
        let text = cpu_section(&samples, 2, None);
        let row = |t: &str| {
            text.lines()
                .find(|l| l.starts_with(t))
                .unwrap_or_else(|| panic!("no row for {t}: {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        // Medians 12 and 40: 2 cores / 52 us = 38,461.5 msg/s.
        assert_eq!(row("a "), ["a", "12", "40", "38461.5", "-", "-"], "{text}");
        assert_eq!(row("b "), ["b", "11", "-", "-", "-", "-"], "{text}");
        assert_eq!(
            cpu_section(&samples[1..2], 2, None),
            "",
            "no client figure, no section"
        );
    }

    #[test]
    fn sleeps_per_message_are_priced_at_the_machines_hand_off() {
        let limits = limits();
        let mut samples = Vec::new();
        for (broker, sleeps) in [(70.0, 1.0), (80.0, 1.5), (90.0, 2.0)] {
            samples.push(sample("a", "client_cpu_us_per_msg", 20.0));
            samples.push(sample("a", "broker_cpu_us_per_msg", broker));
            samples.push(sample("a", "broker_sleeps_per_msg", sleeps));
        }
        let text = cpu_section(&samples, 2, limits.handoffs.as_ref());
        assert!(
            text.contains("costs 4 us of CPU (4 us wall) within one CPU, 20 us of CPU (40 us wall) across two"),
            "{text}"
        );
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("a "))
            .expect("a row")
            .split_whitespace()
            .collect();
        // Medians: 1.5 sleeps per message at 4 to 20 us each.
        assert_eq!(row, ["a", "20", "80", "20000", "1.5", "6-30"], "{text}");
    }

    #[test]
    fn the_limits_are_measured() {
        let dir = berth_testdir::TestDir::unmade("limits");
        let l = measure(&dir).expect("measure");
        assert!(
            l.fsync_s_median > 0.0 && l.fsync_s_p99 >= l.fsync_s_median,
            "{l:?}"
        );
        assert!(
            l.rtt_s_median > 0.0 && l.rtt_s_p99 >= l.rtt_s_median,
            "{l:?}"
        );
        assert!(l.handoffs.is_some_and(|h| h.within.cpu_s > 0.0), "{l:?}");
        // An append costs some CPU, and no more than it took.
        assert!(
            l.fsync_cpu_s > 0.0 && l.fsync_cpu_s < l.fsync_s_p99 * 2.0,
            "{l:?}"
        );
        // The bound takes the cheaper placement's round trip.
        let cheaper = l
            .rtt_across_s_median
            .map_or(l.rtt_within_s_median, |a| a.min(l.rtt_within_s_median));
        assert_eq!(l.rtt_s_median, cheaper, "{l:?}");
    }
}
