//! CPU seconds used by a process and its descendants, and the sleeps of
//! their threads, from /proc (Linux).
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

/// `pid` and all its live descendants, each with its CPU ticks (user +
/// system), or `None` when the process does not exist or /proc is
/// unreadable.
fn tree(pid: u32) -> Option<Vec<(u32, u64)>> {
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
    let mut found = vec![(pid, own_ticks)];
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &(c, ticks) in children.get(&p).map_or(&[][..], Vec::as_slice) {
            found.push((c, ticks));
            stack.push(c);
        }
    }
    Some(found)
}

/// The voluntary context switches in the text of a thread's
/// /proc/PID/task/TID/status: each is a sleep, and the wake-up that ends
/// it.
fn parse_sleeps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What a process tree has used so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// CPU seconds (user + system).
    pub cpu_s: f64,
    /// Sleeps (voluntary context switches) of every live thread; threads
    /// that have exited are not counted.
    pub sleeps: u64,
}

impl Usage {
    /// CPU microseconds per message spent since `earlier` over `msgs`
    /// messages; `None` without messages.
    #[must_use]
    pub fn cpu_us_per_msg_since(&self, earlier: &Usage, msgs: u64) -> Option<f64> {
        (msgs > 0).then(|| (self.cpu_s - earlier.cpu_s) * 1e6 / msgs as f64)
    }
}

/// The usage of `pid` and all its live descendants, from one walk of
/// /proc; `None` when the process does not exist or /proc is unreadable.
#[must_use]
pub fn usage_tree(pid: u32) -> Option<Usage> {
    let found = tree(pid)?;
    let mut ticks = 0;
    let mut sleeps = 0;
    for (p, t) in found {
        ticks += t;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Some(n) = std::fs::read_to_string(task.path().join("status"))
                .ok()
                .and_then(|t| parse_sleeps(&t))
            {
                sleeps += n;
            }
        }
    }
    let cpu_s = ticks as f64 / ticks_per_s();
    Some(Usage { cpu_s, sleeps })
}

/// CPU seconds of this process (all threads).
#[must_use]
pub fn self_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, ticks) = parse_stat(&text)?;
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
    fn parses_voluntary_switches_not_involuntary_ones() {
        let status =
            "Name:\tberth\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(parse_sleeps(status), Some(1234));
        assert_eq!(parse_sleeps("Name:\tberth\n"), None);
    }

    #[test]
    fn the_sleeps_of_a_process_are_counted() {
        use std::io::Write as _;
        // A shell that waits for 20 short sleeps, then for its input: it
        // is counted while alive.
        let mut sh = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 20 ]; do sleep 0.01; i=$((i+1)); done; echo done; read x",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.as_mut().expect("piped")),
            &mut line,
        )
        .expect("read");
        assert_eq!(line.trim(), "done");
        let sleeps = usage_tree(sh.id()).expect("a live process").sleeps;
        let _ = sh.stdin.take().expect("piped").write_all(b"\n");
        sh.wait().expect("wait");
        assert!(sleeps >= 20, "{sleeps}");
    }

    #[test]
    fn cpu_per_message_is_the_difference_over_the_messages() {
        let at = |cpu_s| Usage { cpu_s, sleeps: 0 };
        let per = at(3.5).cpu_us_per_msg_since(&at(3.0), 100_000);
        assert!(per.is_some_and(|us| (us - 5.0).abs() < 1e-9), "{per:?}");
        assert_eq!(at(3.5).cpu_us_per_msg_since(&at(3.0), 0), None);
    }

    #[test]
    fn own_process_has_cpu_time() {
        let a = self_cpu_seconds().expect("/proc/self/stat readable on Linux");
        let b = usage_tree(std::process::id()).expect("own pid").cpu_s;
        assert!(a >= 0.0 && b >= a * 0.5);
    }
}
