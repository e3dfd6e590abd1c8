//! `berth status` and `berth queues|connections|exchanges list`: a running
//! broker seen through its management API, as tables sized to the
//! terminal (`COLUMNS`), or as JSON for scripts.
//!
//! Invariants:
//! - Every request is bounded by [`REQUEST_TIMEOUT_MS`]; lists ask the
//!   broker for one page (`--limit`), filtered and sorted server-side, so
//!   the command stays fast with thousands of queues.
//! - `--watch` redraws in place until interrupted.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use berth_bench::http::{get_body, BaseUrl};
use clap::Args;
use serde_json::{json, Value};

/// How long one API request may take.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Table width when `COLUMNS` is not set.
const DEFAULT_TERMINAL_COLUMNS: usize = 100;

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// Management API of the broker (berth serve --http-listen ...).
    #[arg(
        long,
        value_name = "URL",
        default_value = "http://guest:guest@127.0.0.1:15672"
    )]
    url: String,
    /// Only this vhost.
    #[arg(long)]
    vhost: Option<String>,
    /// Sort by this field (name, messages, messages_ready, consumers, ...).
    #[arg(long, default_value = "name")]
    sort: String,
    /// Reverse the sort (largest first).
    #[arg(long)]
    reverse: bool,
    /// Only names matching this regex (case-insensitive).
    #[arg(long, value_name = "REGEX")]
    filter: Option<String>,
    /// Rows to show (one page of the API, at most 500).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Redraw every SECONDS until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<u64>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// What `list` lists.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Queues,
    Exchanges,
    Connections,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Queues => "queues",
            Kind::Exchanges => "exchanges",
            Kind::Connections => "connections",
        }
    }

    /// (header, field, numeric) per column; the first column stretches.
    fn columns(self) -> &'static [(&'static str, &'static str, bool)] {
        match self {
            Kind::Queues => &[
                ("name", "name", false),
                ("vhost", "vhost", false),
                ("ready", "messages_ready", true),
                ("unacked", "messages_unacknowledged", true),
                ("consumers", "consumers", true),
                ("pub/s", "message_stats.publish_details.rate", true),
                ("ack/s", "message_stats.ack_details.rate", true),
            ],
            Kind::Exchanges => &[
                ("name", "name", false),
                ("vhost", "vhost", false),
                ("type", "type", false),
                ("durable", "durable", false),
                ("delayed", "messages_delayed", true),
            ],
            Kind::Connections => &[
                ("name", "name", false),
                ("user", "user", false),
                ("vhost", "vhost", false),
                ("channels", "channels", true),
            ],
        }
    }
}

/// Percent-encodes a URL path segment or query value.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

struct Client {
    base: BaseUrl,
}

impl Client {
    async fn get(&self, path: &str) -> Result<(u16, Value), String> {
        let (status, body) = get_body(&self.base, path, Duration::from_millis(REQUEST_TIMEOUT_MS))
            .await
            .map_err(|e| format!("{e} (is berth running with --http-listen at this address?)"))?;
        if status == 401 {
            return Err(format!(
                "GET {path}: 401 unauthorised: give a configured user in --url http://USER:PASS@HOST:PORT"
            ));
        }
        let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((status, v))
    }

    async fn json(&self, path: &str) -> Result<Value, String> {
        match self.get(path).await? {
            (200, v) => Ok(v),
            (s, v) => Err(format!(
                "GET {path}: HTTP {s}: {}",
                v["reason"].as_str().unwrap_or("")
            )),
        }
    }

    async fn text(&self, path: &str) -> Result<String, String> {
        let (status, body) = get_body(&self.base, path, Duration::from_millis(REQUEST_TIMEOUT_MS))
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("GET {path}: HTTP {status}"));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

fn list_path(kind: Kind, a: &ListArgs) -> String {
    let mut p = format!("/api/{}", kind.path());
    if let Some(v) = &a.vhost {
        if matches!(kind, Kind::Connections) {
            p = format!("/api/vhosts/{}/connections", enc(v));
        } else {
            let _ = write!(p, "/{}", enc(v));
        }
    }
    let _ = write!(
        p,
        "?page=1&page_size={}&sort={}&sort_reverse={}",
        a.limit.clamp(1, 500),
        enc(&a.sort),
        a.reverse
    );
    if let Some(f) = &a.filter {
        let _ = write!(p, "&name={}&use_regex=true", enc(f));
    }
    p
}

fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if n.is_f64() => format!("{:.1}", n.as_f64().unwrap_or(0.0)),
        Some(x) => x.to_string(),
    }
}

fn terminal_columns() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|c| *c >= 40)
        .unwrap_or(DEFAULT_TERMINAL_COLUMNS)
}

/// A table whose first column takes what the others leave of `width`.
pub fn table(kind: Kind, items: &[Value], width: usize) -> String {
    let cols = kind.columns();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| cols.iter().map(|(_, f, _)| cell(field(i, f))).collect())
        .collect();
    let mut widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(c, (h, _, _))| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
                .max(h.len())
        })
        .collect();
    let rest: usize = widths[1..].iter().map(|w| w + 2).sum();
    widths[0] = widths[0].min(width.saturating_sub(rest).max(8));
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        for (c, text) in cells.iter().enumerate() {
            let w = widths[c];
            let mut t: String = text.chars().take(w).collect();
            if text.chars().count() > w {
                t.pop();
                t.push('…');
            }
            if c > 0 {
                out.push_str("  ");
            }
            if cols[c].2 {
                let _ = write!(out, "{t:>w$}");
            } else {
                let _ = write!(out, "{t:<w$}");
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(
        &mut out,
        &cols
            .iter()
            .map(|(h, _, _)| (*h).to_owned())
            .collect::<Vec<_>>(),
    );
    for r in &rows {
        line(&mut out, r);
    }
    out
}

/// Per log group: fsyncs, mean fsync latency, poisoning and waiting for
/// disk space, from the `berth_store_*` lines of `/metrics`.
fn store_health(metrics: &str) -> Vec<Value> {
    let mut groups: std::collections::BTreeMap<String, [f64; 4]> = Default::default();
    for line in metrics.lines().filter(|l| l.starts_with("berth_store_")) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let group = labels
            .trim_start_matches("group=\"")
            .trim_end_matches("\"}")
            .to_owned();
        let slot = match name {
            "berth_store_fsyncs_total" => 0,
            "berth_store_fsync_seconds_total" => 1,
            "berth_store_poisoned" => 2,
            "berth_store_no_space" => 3,
            _ => continue,
        };
        groups.entry(group).or_default()[slot] = value.parse().unwrap_or(0.0);
    }
    groups
        .into_iter()
        .map(|(g, [syncs, secs, poisoned, no_space])| {
            let mean_ms = if syncs > 0.0 {
                secs * 1000.0 / syncs
            } else {
                0.0
            };
            json!({"group": g, "fsyncs": syncs, "fsync_ms_mean": mean_ms,
                "poisoned": poisoned > 0.0, "no_space": no_space > 0.0})
        })
        .collect()
}

async fn snapshot_status(c: &Client, a: &ListArgs) -> Result<Value, String> {
    let overview = c.json("/api/overview").await?;
    let queues = c.json(&list_path(Kind::Queues, a)).await?;
    let (_, alarms) = c.get("/api/health/checks/alarms").await?;
    let metrics = c.text("/metrics").await.unwrap_or_default();
    Ok(json!({
        "overview": overview,
        "queues": queues,
        "alarms": alarms,
        "store_groups": store_health(&metrics),
    }))
}

fn render_status(s: &Value, width: usize) -> String {
    let o = &s["overview"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {}  queues {}  connections {}  channels {}  consumers {}",
        cell(o.get("node")),
        cell(o.get("product_version")),
        cell(field(o, "object_totals.queues")),
        cell(field(o, "object_totals.connections")),
        cell(field(o, "object_totals.channels")),
        cell(field(o, "object_totals.consumers")),
    );
    let _ = writeln!(
        out,
        "messages ready {}  unacked {}  publish {}/s  deliver {}/s  ack {}/s",
        cell(field(o, "queue_totals.messages_ready")),
        cell(field(o, "queue_totals.messages_unacknowledged")),
        cell(field(o, "message_stats.publish_details.rate")),
        cell(field(o, "message_stats.deliver_get_details.rate")),
        cell(field(o, "message_stats.ack_details.rate")),
    );
    let d = &o["delayed_totals"];
    if d["exchanges"].as_u64().unwrap_or(0) > 0 {
        let next = match d["next_due_unix_ms"].as_u64() {
            Some(due) => {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
                let in_s = due.saturating_sub(now_ms) as f64 / 1000.0;
                format!(", next due in {in_s:.1} s")
            }
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "delayed messages {} in {} delayed exchanges{next}",
            cell(d.get("messages_delayed")),
            cell(d.get("exchanges")),
        );
    }
    let alarm = if s["alarms"]["status"] == "ok" {
        "none".to_owned()
    } else {
        cell(s["alarms"].get("reason"))
    };
    let _ = writeln!(out, "alarms: {alarm}");
    for g in s["store_groups"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "store group {}: {} fsyncs, mean fsync {:.2} ms{}",
            cell(g.get("group")),
            cell(g.get("fsyncs")),
            g["fsync_ms_mean"].as_f64().unwrap_or(0.0),
            if g["poisoned"] == true {
                ", POISONED (refuses writes until the broker restarts; see alarms)"
            } else if g["no_space"] == true {
                ", DISK FULL (refuses writes until space is freed; see alarms)"
            } else {
                ""
            }
        );
    }
    let q = &s["queues"];
    let _ = writeln!(
        out,
        "\nqueues {} of {} (filtered {})",
        cell(q.get("item_count")),
        cell(q.get("total_count")),
        cell(q.get("filtered_count"))
    );
    let items: &[Value] = q["items"].as_array().map_or(&[], Vec::as_slice);
    out.push_str(&table(Kind::Queues, items, width));
    out.push_str(&streams(items));
    out
}

/// One line per stream among `items`: what a stream has that the queue
/// table does not show (offsets, bytes, segments).
fn streams(items: &[Value]) -> String {
    let mut out = String::new();
    for q in items.iter().filter(|q| q["type"] == "stream") {
        let _ = writeln!(
            out,
            "stream {} ({}): {} messages, {} bytes, offsets {}..{}, {} segments",
            cell(q.get("name")),
            cell(q.get("vhost")),
            cell(q.get("messages")),
            cell(q.get("message_bytes")),
            cell(q.get("first_offset")),
            cell(q.get("last_offset")),
            cell(q.get("segments")),
        );
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Runs `once` (one fetch and render) once or, with `--watch`, forever.
fn run(a: &ListArgs, once: impl Fn(&Client) -> Result<String, String>) -> ExitCode {
    let client = match BaseUrl::parse(&a.url) {
        Ok(base) => Client { base },
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::from(2);
        }
    };
    loop {
        match once(&client) {
            Ok(text) => {
                if a.watch.is_some() {
                    // Home and clear: redraw in place.
                    print!("\x1b[H\x1b[2J");
                }
                print!("{text}");
            }
            Err(e) => {
                eprintln!("berth: {e}");
                if a.watch.is_none() {
                    return ExitCode::FAILURE;
                }
            }
        }
        match a.watch {
            Some(s) => std::thread::sleep(Duration::from_secs(s.max(1))),
            None => return ExitCode::SUCCESS,
        }
    }
}

/// `berth status`.
pub fn status(a: &ListArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::FAILURE;
        }
    };
    run(a, |c| {
        let s = rt.block_on(snapshot_status(c, a))?;
        Ok(if a.json {
            format!("{s}\n")
        } else {
            render_status(&s, terminal_columns())
        })
    })
}

/// `berth queues|exchanges|connections list`.
pub fn list(kind: Kind, a: &ListArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::FAILURE;
        }
    };
    run(a, |c| {
        let page = rt.block_on(c.json(&list_path(kind, a)))?;
        let items = page["items"].as_array().map_or(&[][..], Vec::as_slice);
        Ok(if a.json {
            format!("{}\n", Value::Array(items.to_vec()))
        } else {
            table(kind, items, terminal_columns())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_column_shrinks_to_fit_the_terminal() {
        let items = vec![
            json!({"name": "a-very-long-queue-name-that-does-not-fit", "vhost": "/",
            "messages_ready": 12, "messages_unacknowledged": 0, "consumers": 1,
            "message_stats": {"publish_details": {"rate": 2.5}, "ack_details": {"rate": 0.0}}}),
        ];
        let t = table(Kind::Queues, &items, 60);
        assert!(t.lines().all(|l| l.chars().count() <= 60), "{t}");
        assert!(
            t.contains('…') && t.contains("2.5") && t.contains("12"),
            "{t}"
        );
    }

    #[test]
    fn streams_show_their_offsets_bytes_and_segments() {
        let items = vec![
            json!({"name": "classic", "vhost": "/", "type": "classic"}),
            json!({"name": "events", "vhost": "/", "type": "stream", "messages": 40,
            "message_bytes": 4100, "first_offset": 160, "last_offset": 199, "segments": 5}),
        ];
        assert_eq!(
            streams(&items),
            "\nstream events (/): 40 messages, 4100 bytes, offsets 160..199, 5 segments\n"
        );
        assert_eq!(streams(&items[..1]), "");
    }

    #[test]
    fn list_paths_encode_vhost_and_regex() {
        let a = ListArgs {
            url: String::new(),
            vhost: Some("/".into()),
            sort: "messages".into(),
            reverse: true,
            filter: Some("^ord.*".into()),
            limit: 10,
            watch: None,
            json: false,
        };
        assert_eq!(
            list_path(Kind::Queues, &a),
            "/api/queues/%2F?page=1&page_size=10&sort=messages&sort_reverse=true&name=%5Eord.%2A&use_regex=true"
        );
    }

    #[test]
    fn store_health_reads_per_group_fsync_metrics() {
        let m = "berth_store_fsyncs_total{group=\"0\"} 4\nberth_store_fsync_seconds_total{group=\"0\"} 0.002\nberth_store_poisoned{group=\"0\"} 0\n";
        let g = store_health(m);
        assert_eq!(g.len(), 1);
        assert!((g[0]["fsync_ms_mean"].as_f64().unwrap_or(0.0) - 0.5).abs() < 1e-9);
    }

    /// Delayed exchanges' pending messages show on a line of their own
    /// (none when there is no delayed exchange).
    #[test]
    fn status_shows_pending_delayed_messages() {
        let s = |d: Value| {
            json!({
                "overview": {"delayed_totals": d},
                "queues": {"items": []},
                "alarms": {"status": "ok"},
                "store_groups": [],
            })
        };
        let none = render_status(&s(json!({"exchanges": 0, "messages_delayed": 0})), 200);
        assert!(!none.contains("delayed"), "{none}");
        let due = json!({"exchanges": 2, "messages_delayed": 1500, "next_due_unix_ms": 1});
        let out = render_status(&s(due), 200);
        assert!(
            out.contains("delayed messages 1500 in 2 delayed exchanges, next due in 0.0 s"),
            "{out}"
        );
    }

    /// A group that refuses writes shows on its own line, and the alarms
    /// line carries the broker's sentence with the remedy.
    #[test]
    fn status_shows_a_poisoned_and_a_full_group_with_the_alarm_reason() {
        let m = "berth_store_fsyncs_total{group=\"0\"} 4\nberth_store_poisoned{group=\"0\"} 1\nberth_store_no_space{group=\"0\"} 0\n\
                 berth_store_fsyncs_total{group=\"1\"} 4\nberth_store_poisoned{group=\"1\"} 0\nberth_store_no_space{group=\"1\"} 1\n";
        let reason = "resource alarm(s) in effect: log group 0 is poisoned and refuses writes (nacks every publish to its queues) after: fdatasync x: EIO; check the disk (dmesg, SMART), then restart the broker (stop and start `berth serve`)";
        let s = json!({
            "overview": {},
            "queues": {"items": []},
            "alarms": {"status": "failed", "reason": reason},
            "store_groups": store_health(m),
        });
        let out = render_status(&s, 400);
        assert!(out.contains(&format!("alarms: {reason}")), "{out}");
        assert!(
            out.contains("store group 0: 4.0 fsyncs, mean fsync 0.00 ms, POISONED (refuses writes until the broker restarts; see alarms)"),
            "{out}"
        );
        assert!(
            out.contains("store group 1: 4.0 fsyncs, mean fsync 0.00 ms, DISK FULL (refuses writes until space is freed; see alarms)"),
            "{out}"
        );
    }
}
