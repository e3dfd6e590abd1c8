//! CPU seconds used by a process and its descendants, from /proc (Linux).
//!
//! The broker's pid may be a launcher (RabbitMQ's `rabbitmq-server` script
//! runs `beam.smp` as a child), so the figure sums the whole process tree
//! found under the pid at sampling time. Reading fails softly: a bench
//! without /proc reports no CPU figures rather than refusing to run.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Clock ticks per second for /proc times (`getconf CLK_TCK`; 100 on every
/// Linux we know of, used when getconf is missing).
fn ticks_per_s() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// (ppid, utime + stime in ticks) from the text of /proc/PID/stat.
fn parse_stat(text: &str) -> Option<(u32, u64)> {
    // The command name (field 2) is in parentheses and may contain spaces;
    // fields are counted after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state(3) ppid(4) ... utime(14) stime(15) → indices 0,1,...,11,12.
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU seconds (user + system) of `pid` and all its live descendants, or
/// `None` when the process does not exist or /proc is unreadable.
#[must_use]
pub fn cpu_seconds_tree(pid: u32) -> Option<f64> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, own_ticks) = parse_stat(&own)?;
    let mut children: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|t| parse_stat(&t))
        {
            children.entry(ppid).or_default().push((p, ticks));
        }
    }
    let mut total = own_ticks;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &(c, ticks) in children.get(&p).map_or(&[][..], Vec::as_slice) {
            total += ticks;
            stack.push(c);
        }
    }
    #[allow(clippy::cast_precision_loss)]
    Some(total as f64 / ticks_per_s())
}

/// CPU seconds of this process (all threads).
#[must_use]
pub fn self_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, ticks) = parse_stat(&text)?;
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / ticks_per_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_command_name() {
        let line =
            "1234 (beam smp) S 42 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 30 0 1 2 3";
        assert_eq!(parse_stat(line), Some((42, 300)));
    }

    #[test]
    fn own_process_has_cpu_time() {
        let a = self_cpu_seconds().expect("/proc/self/stat readable on Linux");
        let b = cpu_seconds_tree(std::process::id()).expect("own pid");
        assert!(a >= 0.0 && b >= a * 0.5);
    }
}
