//! `berth events`: the lifecycle events of a store's log groups, merged
//! into one time order (by time, group, sequence), as text or JSON lines;
//! `--follow` keeps merging live, like UniVerse's `usa -M`. Read-only: it
//! works on a running broker's files.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_broker::events::{decode, DecodedEvent};
use berth_events::file::{
    Damage, EventRecord, EventTail, GROUP_EVENT_FILE_PREFIX, MERGED_EVENT_FILE_PREFIX,
};
use berth_store::inspect::Layout;
use berth_store::storage::OsStorage;
use clap::Args;
use serde_json::json;

use crate::exit::{EXIT_PROBLEMS, EXIT_UNREADABLE};

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// A data directory of the store (repeat for each, in any order).
    #[arg(long = "data-dir", value_name = "DIR", required = true)]
    data_dir: Vec<PathBuf>,
    /// Keep running and print new events as they are written.
    #[arg(long)]
    follow: bool,
    /// Only events of queues whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    queue: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Only events from this time on: Unix seconds, or an age such as
    /// 90s, 15m, 2h, 1d.
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Read the combined log written every `event_log.merge_interval_s`
    /// (in the first data directory) instead of merging the groups' files.
    #[arg(long)]
    merged: bool,
    /// With --follow: hold events back this long so that slower groups'
    /// events can still be put in order.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    lag_ms: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// `--since` as Unix microseconds.
fn parse_since(s: &str) -> Result<u64, String> {
    let bad = || format!("--since {s:?}: expected Unix seconds or an age like 90s, 15m, 2h, 1d");
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(secs.saturating_mul(1_000_000));
    }
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    Ok(now_us().saturating_sub(n.saturating_mul(mult).saturating_mul(1_000_000)))
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC) for Unix microseconds.
pub fn format_time_us(us: u64) -> String {
    let secs = us / 1_000_000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        us % 1_000_000
    )
}

struct Printer {
    json: bool,
    queue: Option<regex::Regex>,
    since_us: u64,
    out: std::io::BufWriter<std::io::Stdout>,
    undecodable: u64,
}

impl Printer {
    /// Prints one event if it passes the filters; false once stdout is
    /// gone (a closed pipe ends the command quietly).
    fn print(&mut self, r: &EventRecord) -> bool {
        if r.time_us < self.since_us {
            return true;
        }
        let Some(e) = decode(&r.payload) else {
            self.undecodable += 1;
            return true;
        };
        if self.queue.as_ref().is_some_and(|re| !re.is_match(&e.queue)) {
            return true;
        }
        let line = if self.json {
            json_line(r, &e)
        } else {
            text_line(r, &e)
        };
        writeln!(self.out, "{line}").is_ok()
    }
}

fn json_line(r: &EventRecord, e: &DecodedEvent) -> String {
    json!({
        "time": format_time_us(r.time_us),
        "time_us": r.time_us,
        "group": r.group,
        "seq": r.seq,
        "event": e.kind.as_str(),
        "reason": e.reason,
        "vhost": e.vhost,
        "queue": e.queue,
        "msg": e.msg,
        "size": e.size,
        "connection": e.connection,
        "user": e.user,
        "detail": e.detail,
    })
    .to_string()
}

fn text_line(r: &EventRecord, e: &DecodedEvent) -> String {
    let mut s = format!(
        "{} g{}#{} {:<13} vhost={} queue={} msg={} size={}",
        format_time_us(r.time_us),
        r.group,
        r.seq,
        e.kind.as_str(),
        e.vhost,
        e.queue,
        e.msg,
        e.size
    );
    if !e.reason.is_empty() {
        s += &format!(" reason={}", e.reason);
    }
    if e.connection != 0 {
        s += &format!(" conn={} user={}", e.connection, e.user);
    }
    if !e.detail.is_empty() {
        s += &format!(" detail={}", e.detail);
    }
    s
}

pub fn run(a: EventsArgs) -> ExitCode {
    match run_inner(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth events: {e}");
            ExitCode::from(EXIT_UNREADABLE)
        }
    }
}

fn run_inner(a: EventsArgs) -> Result<ExitCode, String> {
    let layout = Layout::open(&OsStorage, &a.data_dir).map_err(|e| e.to_string())?;
    let queue = match &a.queue {
        Some(re) => Some(regex::Regex::new(re).map_err(|e| format!("--queue {re:?}: {e}"))?),
        None => None,
    };
    let since_us = a
        .since
        .as_deref()
        .map(parse_since)
        .transpose()?
        .unwrap_or(0);
    let mut printer = Printer {
        json: a.json,
        queue,
        since_us,
        out: std::io::BufWriter::new(std::io::stdout()),
        undecodable: 0,
    };
    let mut tails: Vec<EventTail> = if a.merged {
        vec![EventTail::new(
            layout.dirs[0].clone(),
            MERGED_EVENT_FILE_PREFIX,
        )]
    } else {
        (0..layout.manifest.group_count)
            .map(|g| EventTail::new(layout.group_dir(g), GROUP_EVENT_FILE_PREFIX))
            .collect()
    };
    // Read but not yet printed, ordered by (time, group, seq).
    let mut heap: BinaryHeap<Reverse<Keyed>> = BinaryHeap::new();
    let mut damaged: Vec<Damage> = Vec::new();
    loop {
        for t in &mut tails {
            let mut fresh = Vec::new();
            t.poll(&OsStorage, &mut fresh).map_err(|e| e.to_string())?;
            damaged.append(&mut t.damaged);
            heap.extend(fresh.into_iter().map(|r| Reverse(Keyed(r))));
        }
        for (path, offset, why) in damaged.drain(..) {
            eprintln!(
                "berth events: {} at offset {offset}: {why:?} record; skipped the rest of that file",
                path.display()
            );
            printer.undecodable += 1;
        }
        // Not following: everything is read, print it all. Following:
        // hold back the last `lag_ms` for groups that write later.
        let upto = if a.follow {
            now_us().saturating_sub(a.lag_ms.saturating_mul(1000))
        } else {
            u64::MAX
        };
        while heap.peek().is_some_and(|Reverse(k)| k.0.time_us <= upto) {
            let Reverse(Keyed(r)) = heap.pop().expect("peeked");
            if !printer.print(&r) {
                return Ok(ExitCode::SUCCESS);
            }
        }
        if printer.out.flush().is_err() {
            return Ok(ExitCode::SUCCESS);
        }
        if !a.follow {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if printer.undecodable > 0 {
        eprintln!(
            "berth events: {} damaged or undecodable part(s) skipped",
            printer.undecodable
        );
        return Ok(ExitCode::from(EXIT_PROBLEMS));
    }
    Ok(ExitCode::SUCCESS)
}

/// An event ordered by (time, group, seq).
struct Keyed(EventRecord);

impl PartialEq for Keyed {
    fn eq(&self, o: &Self) -> bool {
        self.0.order_key() == o.0.order_key()
    }
}
impl Eq for Keyed {}
impl PartialOrd for Keyed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Keyed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.order_key().cmp(&o.0.order_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc() {
        assert_eq!(format_time_us(0), "1970-01-01T00:00:00.000000Z");
        // Checked with `date -u -d @1795471987`.
        assert_eq!(
            format_time_us(1_795_471_987_674_092),
            "2026-11-23T22:13:07.674092Z"
        );
        // A leap day (`date -u -d @951782400`).
        assert_eq!(
            format_time_us(951_782_400_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn since_takes_seconds_or_an_age() {
        assert_eq!(parse_since("10"), Ok(10_000_000));
        let ago = now_us() - parse_since("2m").expect("age");
        assert!((119_000_000..=121_000_000).contains(&ago));
        assert!(parse_since("2x").is_err());
    }
}
