//! Results: one JSON line per figure per run, and the human summary
//! (ministat's table per figure, with the difference when `--vs` is given).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::stats::{difference, g6, Confidence, Summary};
use crate::BenchError;

/// One figure of one run against one broker.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub scenario: String,
    /// "a" for `--uri`, "b" for `--vs`.
    pub target: String,
    /// The broker's URI, password hidden.
    pub uri: String,
    /// 1-based run number.
    pub run: usize,
    pub metric: String,
    pub unit: String,
    pub value: f64,
    /// Seconds since the Unix epoch when the run ended.
    pub time_s: f64,
}

/// Appends samples to `results.jsonl` as they come, so an interrupted bench
/// keeps what it measured; also keeps them for the summary.
pub struct Recorder {
    path: PathBuf,
    file: std::fs::File,
    samples: Vec<Sample>,
}

impl Recorder {
    pub fn create(dir: &Path) -> Result<Recorder, BenchError> {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
            context: format!("create output directory {}", dir.display()),
            source,
        })?;
        let path = dir.join("results.jsonl");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| BenchError::Io {
                context: format!("open {}", path.display()),
                source,
            })?;
        Ok(Recorder {
            path,
            file,
            samples: Vec::new(),
        })
    }

    pub fn record(&mut self, sample: Sample) -> Result<(), BenchError> {
        let line = serde_json::to_string(&sample).expect("a Sample always serialises");
        writeln!(self.file, "{line}").map_err(|source| BenchError::Io {
            context: format!("append to {}", self.path.display()),
            source,
        })?;
        self.samples.push(sample);
        Ok(())
    }

    #[must_use]
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }
}

/// The human summary of `samples`: per metric, ministat's table with a row
/// per target, then the verdict of b against a.
#[must_use]
pub fn summary(samples: &[Sample], confidence: Confidence) -> String {
    let mut metrics: Vec<(&str, &str)> = Vec::new();
    for s in samples {
        if !metrics.iter().any(|(m, _)| *m == s.metric) {
            metrics.push((&s.metric, &s.unit));
        }
    }
    let mut targets: Vec<(&str, &str)> = Vec::new();
    for s in samples {
        if !targets.iter().any(|(t, _)| *t == s.target) {
            targets.push((&s.target, &s.uri));
        }
    }
    let mut out = String::new();
    if let Some(s) = samples.first() {
        writeln!(out, "scenario {}", s.scenario).ok();
    }
    for (t, uri) in &targets {
        writeln!(out, "{} {t} = {uri}", symbol(t)).ok();
    }
    let width = metrics
        .iter()
        .map(|(m, _)| m.len())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "\n{:width$} {:6}   {:>3} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "metric", "unit", "N", "Min", "Max", "Median", "Avg", "Stddev"
    )
    .ok();
    for (metric, unit) in metrics {
        let mut rows = Vec::new();
        for (i, (t, _)) in targets.iter().enumerate() {
            let values: Vec<f64> = samples
                .iter()
                .filter(|s| s.metric == metric && s.target == *t)
                .map(|s| s.value)
                .collect();
            let Some(sum) = Summary::of(&values) else {
                continue;
            };
            let (name, u) = if i == 0 { (metric, unit) } else { ("", "") };
            writeln!(
                out,
                "{name:width$} {u:6} {} {:>3} {:>11} {:>11} {:>11} {:>11} {:>11}",
                symbol(t),
                sum.n,
                g6(sum.min),
                g6(sum.max),
                g6(sum.median),
                g6(sum.mean),
                g6(sum.stddev)
            )
            .ok();
            rows.push(sum);
        }
        if rows.len() == 2 {
            let verdict = match difference(&rows[0], &rows[1], confidence) {
                Some(d) if d.proven => format!(
                    "+ vs x: difference at {}% confidence: {} +/- {} ({}% +/- {}%)",
                    confidence.label(),
                    g6(d.delta),
                    g6(d.half_width),
                    g6(d.delta_pct),
                    g6(d.half_width_pct)
                ),
                Some(_) => format!(
                    "+ vs x: no difference proven at {}% confidence",
                    confidence.label()
                ),
                None => "+ vs x: a difference needs at least 2 runs per broker (--runs)".into(),
            };
            writeln!(out, "{:width$} {verdict}", "").ok();
        }
    }
    out
}

fn symbol(target: &str) -> char {
    match target {
        "a" => 'x',
        "b" => '+',
        _ => '*',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: &str, run: usize, value: f64) -> Sample {
        Sample {
            scenario: "fanin".into(),
            target: target.into(),
            uri: format!("amqp://{target}"),
            run,
            metric: "shared.c1.msgs_per_s".into(),
            unit: "msg/s".into(),
            value,
            time_s: 0.0,
        }
    }

    #[test]
    fn summary_has_a_row_per_target_and_a_verdict() {
        let mut v = Vec::new();
        for (i, x) in [100.0, 101.0, 99.0].iter().enumerate() {
            v.push(sample("a", i + 1, *x));
            v.push(sample("b", i + 1, x * 2.0));
        }
        let text = summary(&v, Confidence::P99_5);
        assert!(text.contains("shared.c1.msgs_per_s msg/s"), "{text}");
        assert!(
            text.contains("+ vs x: difference at 99.5% confidence: 100 +/- "),
            "{text}"
        );
        assert!(text.contains("(100% +/- "), "{text}");
        let single: Vec<Sample> = v.iter().filter(|s| s.target == "a").cloned().collect();
        let text = summary(&single, Confidence::P99_5);
        assert!(!text.contains("difference"), "{text}");
    }

    #[test]
    fn recorder_appends_json_lines() {
        let dir = berth_testdir::TestDir::unmade("bench-rec");
        let mut r = Recorder::create(&dir).unwrap();
        r.record(sample("a", 1, 5.0)).unwrap();
        r.record(sample("a", 2, 6.0)).unwrap();
        let text = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["value"], 6.0);
        assert_eq!(lines[0]["metric"], "shared.c1.msgs_per_s");
    }
}
