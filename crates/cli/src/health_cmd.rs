//! `berth health`: a health check for container engines and Kubernetes
//! probes (packaging/), which need a command inside an image that holds
//! nothing but `berth`. It asks the broker's unauthenticated
//! `GET /api/health/checks/is-leader` (docs/MANAGEMENT.md) and exits 0
//! when the broker answers as a single node, a cluster's leader, or a
//! follower; with `--ready`, a follower that knows no leader (it reaches
//! no majority) fails too. A follower answers every HTTP request 503
//! (docs/CLUSTERING.md), so an HTTP probe alone cannot tell a healthy
//! follower from a broken member: this command reads the answer's body.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::admin::ApiArgs;

/// `berth health`.
#[derive(Args, Debug)]
pub struct HealthArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Also fail on a cluster member that knows no leader (for a
    /// readiness probe); without it such a member is alive (a liveness
    /// probe must not restart a member cut off from the others).
    #[arg(long)]
    ready: bool,
    /// Time allowed to connect and for the answer.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    timeout_ms: u64,
}

/// Runs the check; prints one line saying what the broker answered.
pub fn run(args: &HealthArgs) -> ExitCode {
    let path = "/api/health/checks/is-leader";
    let timeout = Duration::from_millis(args.timeout_ms);
    let (healthy, line) = match args.api.request("GET", path, None, timeout) {
        Ok((status, body)) => judge(status, &body, args.ready),
        Err(e) => (false, format!("failed: {e}")),
    };
    println!("{line}");
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Whether an answer of `is-leader` is healthy, and the line saying so.
fn judge(status: u16, body: &Value, ready: bool) -> (bool, String) {
    let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_owned);
    let node = text("node").unwrap_or_else(|| "this node".into());
    match status {
        200 if body.get("node").is_none() => (true, "ok: single node".into()),
        200 => (true, format!("ok: {node} leads")),
        // Only a cluster member's answer names its node.
        503 if body.get("node").is_some() => match text("leader") {
            Some(leader) => (true, format!("ok: {node} follows {leader}")),
            None => {
                let why = text("reason").unwrap_or_default();
                let line = format!("{node} knows no leader: {why}");
                if ready {
                    (false, format!("not ready: {line}"))
                } else {
                    (true, format!("alive: {line}"))
                }
            }
        },
        _ => (false, format!("failed: HTTP {status}: {body}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn leaders_followers_and_single_nodes_are_healthy() {
        assert!(judge(200, &json!({"status": "ok"}), true).0);
        assert!(
            judge(
                200,
                &json!({"status": "ok", "node": "n1", "leader": "n1"}),
                true
            )
            .0
        );
        let (ok, line) = judge(
            503,
            &json!({"status": "failed", "node": "n2", "leader": "n1", "reason": "x"}),
            true,
        );
        assert!(ok, "{line}");
        assert_eq!(line, "ok: n2 follows n1");
    }

    #[test]
    fn a_member_without_a_leader_is_alive_but_not_ready() {
        let body = json!({"status": "failed", "node": "n2", "leader": null, "reason": "no leader"});
        assert!(judge(503, &body, false).0);
        let (ok, line) = judge(503, &body, true);
        assert!(!ok);
        assert!(line.starts_with("not ready: n2 knows no leader"), "{line}");
    }

    #[test]
    fn anything_else_fails() {
        assert!(!judge(503, &json!({"status": "failed", "reason": "alarm"}), false).0);
        assert!(!judge(404, &Value::Null, false).0);
        assert!(!judge(500, &json!("oops"), false).0);
    }
}
