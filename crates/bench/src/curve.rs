//! `berth bench curve`: the latency-vs-rate curve of two brokers as an SVG
//! picture (issue 20 goal 3), drawn from the runs of a PerfTest rate sweep
//! (`scripts/perftest.sh --rates "1000 5000 … max"`, its `runs.tsv`).
//!
//! One panel per consumer prefetch; in each, per broker, the consumer
//! latency's p50 and p99 (the median over the runs, with a bar from the
//! runs' min to their max) against the rate the consumer received (the
//! runs' median), both axes logarithmic. The received rate, not the offered
//! one, is the x value so an unthrottled run ("max") lands where the broker
//! took it.
//!
//! Drawn with `plotters` (SVG backend only, no font crates: text is SVG
//! `<text>` laid out by its built-in estimate), so a reader of
//! docs/BENCHMARKS.md sees the curve without running anything.

use std::collections::BTreeMap;
use std::path::PathBuf;

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::BenchError;

/// `berth bench curve --tsv RUNS --svg OUT`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// A rate sweep's runs.tsv (`scripts/perftest.sh --rates …`): columns
    /// broker, prefetch, rate, recv_msgs_per_s, latency_median_us,
    /// latency_p99_us (others are ignored).
    #[arg(long, value_name = "FILE")]
    pub tsv: PathBuf,
    /// Where to write the picture.
    #[arg(long, value_name = "FILE")]
    pub svg: PathBuf,
    /// A line above the panels (e.g. the date, machine and command).
    #[arg(long, default_value = "consumer latency vs rate (PerfTest)")]
    pub title: String,
}

/// One PerfTest run of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub broker: String,
    /// 0: no `basic.qos` (unlimited).
    pub prefetch: u32,
    /// The offered rate in msg/s; `None` for "max" (unthrottled).
    pub offered: Option<u64>,
    pub recv_msgs_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Min, median and max of one figure over a point's runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            f64::midpoint(v[n / 2 - 1], v[n / 2])
        };
        Spread {
            min: v[0],
            median,
            max: v[n - 1],
        }
    }
}

/// The runs of one broker at one offered rate and prefetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub broker: String,
    pub prefetch: u32,
    pub offered: Option<u64>,
    pub runs: usize,
    pub recv_msgs_per_s: Spread,
    pub p50_us: Spread,
    pub p99_us: Spread,
}

/// Parses a sweep's runs.tsv by its header's column names. Rows with a
/// missing figure ("nan", a run PerfTest did not report) are skipped.
pub fn parse_runs(text: &str) -> Result<Vec<Run>, BenchError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| BenchError::Usage("the runs file is empty".into()))?
        .split('\t')
        .collect();
    let col = |name: &str| {
        header.iter().position(|h| *h == name).ok_or_else(|| {
            BenchError::Usage(format!(
                "the runs file has no column {name} (is it a --rates sweep's runs.tsv?)"
            ))
        })
    };
    let (broker, prefetch, rate) = (col("broker")?, col("prefetch")?, col("rate")?);
    let (recv, p50, p99) = (
        col("recv_msgs_per_s")?,
        col("latency_median_us")?,
        col("latency_p99_us")?,
    );
    let mut runs = Vec::new();
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let field = |c: usize| {
            f.get(c).copied().ok_or_else(|| {
                BenchError::Usage(format!("line {}: {} fields, too few", i + 2, f.len()))
            })
        };
        let number = |c: usize| -> Result<Option<f64>, BenchError> {
            let s = field(c)?;
            if s == "nan" {
                return Ok(None);
            }
            s.parse::<f64>().map(Some).map_err(|e| {
                BenchError::Usage(format!(
                    "line {}: {:?} in column {}: {e}",
                    i + 2,
                    s,
                    header[c]
                ))
            })
        };
        let (Some(recv_msgs_per_s), Some(p50_us), Some(p99_us)) =
            (number(recv)?, number(p50)?, number(p99)?)
        else {
            continue;
        };
        let offered = match field(rate)? {
            "max" => None,
            s => Some(
                s.parse::<u64>()
                    .map_err(|e| BenchError::Usage(format!("line {}: rate {s:?}: {e}", i + 2)))?,
            ),
        };
        let prefetch = field(prefetch)?
            .parse::<u32>()
            .map_err(|e| BenchError::Usage(format!("line {}: prefetch: {e}", i + 2)))?;
        runs.push(Run {
            broker: field(broker)?.to_owned(),
            prefetch,
            offered,
            recv_msgs_per_s,
            p50_us,
            p99_us,
        });
    }
    Ok(runs)
}

/// The runs grouped by broker, prefetch and offered rate, in that order
/// (within a broker and prefetch: by rate, "max" last).
#[must_use]
pub fn points(runs: &[Run]) -> Vec<Point> {
    let mut groups: BTreeMap<(String, u32, u64), Vec<&Run>> = BTreeMap::new();
    for r in runs {
        let rate_key = r.offered.unwrap_or(u64::MAX);
        groups
            .entry((r.broker.clone(), r.prefetch, rate_key))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|((broker, prefetch, _), rs)| Point {
            broker,
            prefetch,
            offered: rs[0].offered,
            runs: rs.len(),
            recv_msgs_per_s: Spread::of(rs.iter().map(|r| r.recv_msgs_per_s).collect()),
            p50_us: Spread::of(rs.iter().map(|r| r.p50_us).collect()),
            p99_us: Spread::of(rs.iter().map(|r| r.p99_us).collect()),
        })
        .collect()
}

fn plot_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Usage(format!("drawing the curve: {e}"))
}

/// A broker's colour: berth blue, anything else (RabbitMQ) orange.
fn colour_of(broker: &str) -> RGBColor {
    if broker == "berth" {
        RGBColor(31, 119, 180)
    } else {
        RGBColor(230, 120, 20)
    }
}

fn prefetch_name(prefetch: u32) -> String {
    if prefetch == 0 {
        "unlimited prefetch".into()
    } else {
        format!("prefetch {prefetch}")
    }
}

/// The SVG text of the curve.
pub fn render_svg(points: &[Point], title: &str) -> Result<String, BenchError> {
    if points.is_empty() {
        return Err(BenchError::Usage("no runs to draw".into()));
    }
    let mut prefetches: Vec<u32> = points.iter().map(|p| p.prefetch).collect();
    prefetches.sort_unstable();
    prefetches.dedup();
    let brokers: Vec<String> = {
        let mut b: Vec<String> = points.iter().map(|p| p.broker.clone()).collect();
        b.sort();
        b.dedup();
        b
    };
    // One scale for every panel, so the panels compare at a glance.
    let x_lo = points
        .iter()
        .map(|p| p.recv_msgs_per_s.median)
        .fold(f64::INFINITY, f64::min);
    let x_hi = points
        .iter()
        .map(|p| p.recv_msgs_per_s.median)
        .fold(0.0, f64::max);
    let y_lo = points
        .iter()
        .map(|p| p.p50_us.min)
        .fold(f64::INFINITY, f64::min)
        / 1000.0;
    let y_hi = points.iter().map(|p| p.p99_us.max).fold(0.0, f64::max) / 1000.0;
    let x_range = (x_lo / 1.3).max(1.0)..x_hi * 1.3;
    let y_range = (y_lo / 1.5).max(0.001)..(y_hi * 1.5).max(0.01);

    let width = 520 * u32::try_from(prefetches.len()).unwrap_or(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (top, body) = root.split_vertically(36);
        top.titled(title, ("sans-serif", 16)).map_err(plot_error)?;
        let panels = body.split_evenly((1, prefetches.len()));
        for (area, &prefetch) in panels.iter().zip(&prefetches) {
            let mut chart = ChartBuilder::on(area)
                .caption(prefetch_name(prefetch), ("sans-serif", 15))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(56)
                .build_cartesian_2d(x_range.clone().log_scale(), y_range.clone().log_scale())
                .map_err(plot_error)?;
            chart
                .configure_mesh()
                .x_labels(6)
                .y_labels(8)
                .max_light_lines(1)
                .x_desc("messages received per second")
                .y_desc("consumer latency (ms)")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| format!("{y}"))
                .draw()
                .map_err(plot_error)?;
            for broker in &brokers {
                let colour = colour_of(broker);
                let mine: Vec<&Point> = points
                    .iter()
                    .filter(|p| &p.broker == broker && p.prefetch == prefetch)
                    .collect();
                for (name, pick, dashed) in [
                    ("p50", (|p: &Point| p.p50_us) as fn(&Point) -> Spread, false),
                    ("p99", |p: &Point| p.p99_us, true),
                ] {
                    let xy: Vec<(f64, f64)> = mine
                        .iter()
                        .map(|p| (p.recv_msgs_per_s.median, pick(p).median / 1000.0))
                        .collect();
                    let style = colour.stroke_width(2);
                    let series = if dashed {
                        chart.draw_series(DashedLineSeries::new(xy.clone(), 6, 4, style))
                    } else {
                        chart.draw_series(LineSeries::new(xy.clone(), style))
                    }
                    .map_err(plot_error)?;
                    let label = series.label(format!("{broker} {name}"));
                    if dashed {
                        label.legend(move |(x, y)| {
                            DashedPathElement::new(
                                vec![(x, y), (x + 18, y)],
                                5,
                                3,
                                colour.stroke_width(2),
                            )
                        });
                    } else {
                        label.legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                        });
                    }
                    chart
                        .draw_series(mine.iter().map(|p| {
                            let s = pick(p);
                            ErrorBar::new_vertical(
                                p.recv_msgs_per_s.median,
                                s.min / 1000.0,
                                s.median / 1000.0,
                                s.max / 1000.0,
                                colour.filled(),
                                6,
                            )
                        }))
                        .map_err(plot_error)?;
                    if dashed {
                        chart
                            .draw_series(
                                xy.iter()
                                    .map(|&c| TriangleMarker::new(c, 4, colour.filled())),
                            )
                            .map_err(plot_error)?;
                    } else {
                        chart
                            .draw_series(xy.iter().map(|&c| Circle::new(c, 3, colour.filled())))
                            .map_err(plot_error)?;
                    }
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// Reads `--tsv`, writes `--svg`, and prints the points it drew.
pub fn run(args: &Args) -> Result<(), BenchError> {
    let text = std::fs::read_to_string(&args.tsv).map_err(|source| BenchError::Io {
        context: format!("read {}", args.tsv.display()),
        source,
    })?;
    let points = points(&parse_runs(&text)?);
    let svg = render_svg(&points, &args.title)?;
    std::fs::write(&args.svg, svg).map_err(|source| BenchError::Io {
        context: format!("write {}", args.svg.display()),
        source,
    })?;
    println!(
        "{:9} {:>8} {:>6} {:>4} {:>10} {:>10} {:>10}",
        "broker", "prefetch", "rate", "runs", "recv/s", "p50 ms", "p99 ms"
    );
    for p in &points {
        println!(
            "{:9} {:>8} {:>6} {:>4} {:>10.0} {:>10.2} {:>10.2}",
            p.broker,
            p.prefetch,
            p.offered
                .map_or_else(|| "max".to_owned(), |r| r.to_string()),
            p.runs,
            p.recv_msgs_per_s.median,
            p.p50_us.median / 1000.0,
            p.p99_us.median / 1000.0
        );
    }
    println!("wrote {}", args.svg.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWEEP: &str = "run\tbroker\tprefetch\trate\tsend_msgs_per_s\trecv_msgs_per_s\tlatency_median_us\tlatency_p99_us\tbroker_cpu_us_per_msg\n\
        1\tberth\t100\t1000\t1000\t1000\t200\t900\t50\n\
        1\trabbitmq\t100\t1000\t1000\t1000\t1200\t5000\t90\n\
        2\tberth\t100\t1000\t1000\t1001\t220\t950\t50\n\
        3\tberth\t100\t1000\t1000\t999\t180\t800\t50\n\
        1\tberth\t100\tmax\t30000\t29000\t15000\t40000\t30\n\
        1\tberth\t0\tmax\t50000\t48000\tnan\tnan\t20\n";

    #[test]
    fn a_sweep_groups_into_points_with_the_median_of_its_runs() {
        let runs = parse_runs(SWEEP).unwrap();
        assert_eq!(runs.len(), 5, "the run with no latency is skipped");
        let pts = points(&runs);
        let berth_1k = &pts[0];
        assert_eq!(
            (
                berth_1k.broker.as_str(),
                berth_1k.prefetch,
                berth_1k.offered
            ),
            ("berth", 100, Some(1000))
        );
        assert_eq!(berth_1k.runs, 3);
        assert_eq!(
            berth_1k.p50_us,
            Spread {
                min: 180.0,
                median: 200.0,
                max: 220.0
            }
        );
        assert_eq!(pts[1].offered, None, "max sorts after the fixed rates");
        assert_eq!(pts[2].broker, "rabbitmq");
    }

    #[test]
    fn the_svg_has_a_labelled_line_per_broker_and_percentile() {
        let svg = render_svg(&points(&parse_runs(SWEEP).unwrap()), "test sweep").unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        for label in [
            "berth p50",
            "berth p99",
            "rabbitmq p50",
            "rabbitmq p99",
            "prefetch 100",
            "test sweep",
        ] {
            assert!(svg.contains(label), "no {label:?} in the picture");
        }
        assert!(svg.contains("<polyline"), "no line drawn");
    }

    #[test]
    fn a_file_without_the_sweep_columns_is_refused_by_name() {
        let err = parse_runs("run\tbroker\tsend_msgs_per_s\n1\tberth\t5\n").unwrap_err();
        assert!(err.to_string().contains("prefetch"), "{err}");
    }
}
