//! `berth cluster status|add-node|remove-node`: a cluster through its
//! leader's management API (docs/CLUSTERING.md). Pointed at a follower,
//! the answer says which member leads and where.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::admin::ApiArgs;

/// `berth cluster ...`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Members, the leader, each member's log position and lag, health.
    Status,
    /// Add a member (started with the same secret, its own name in its
    /// peer list); it catches up, by snapshot if need be, then votes.
    AddNode {
        /// NAME@HOST:PORT of its cluster listener.
        peer: String,
    },
    /// Remove a member (e.g. a dead one, before adding its replacement).
    RemoveNode { name: String },
}

fn text(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

fn text_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// The status as a table: one line for the cluster, one per member.
pub fn render(v: &Value) -> String {
    let mut out = format!(
        "node {}  role {}  term {}  leader {}  log {}  applied {}  snapshot {}\n",
        text(v, "node"),
        text(v, "role"),
        text(v, "term"),
        text(v, "leader"),
        text(v, "last_log_index"),
        text(v, "applied_index"),
        text(v, "snapshot_index"),
    );
    out.push_str(&format!(
        "cluster id {}  member id {}\n",
        text(v, "cluster_id"),
        text(v, "member_id"),
    ));
    out.push_str(&format!(
        "{:<12} {:<22} {:<22} {:<7} {:<8} {:>10} {:>8} {:>8}  {}\n",
        "member", "cluster", "amqp", "leader", "running", "matched", "lag", "heard_ms", "alarms"
    ));
    for m in v
        .get("members")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let alarms = match m.get("alarms").and_then(Value::as_array) {
            Some(a) if a.is_empty() => "none".to_string(),
            Some(a) => a.iter().map(text_of).collect::<Vec<_>>().join("; "),
            None => "-".to_string(),
        };
        out.push_str(&format!(
            "{:<12} {:<22} {:<22} {:<7} {:<8} {:>10} {:>8} {:>8}  {}\n",
            text(m, "name"),
            text(m, "cluster_address"),
            text(m, "amqp"),
            text(m, "leader"),
            text(m, "running"),
            text(m, "matched_index"),
            text(m, "lag_entries"),
            text(m, "millis_since_heard"),
            alarms,
        ));
    }
    out
}

pub fn run(args: &ClusterArgs) -> Result<(), String> {
    let api = &args.api;
    match &args.command {
        ClusterCommand::Status => {
            let v = api.call("GET", "/api/berth/cluster", None)?;
            if v.get("clustered") == Some(&Value::Bool(false)) {
                return Err("this broker runs as a single node (no cluster.node_id)".into());
            }
            print!("{}", render(&v));
        }
        ClusterCommand::AddNode { peer } => {
            api.call(
                "POST",
                "/api/berth/cluster/members",
                Some(&json!({"peer": peer})),
            )?;
            println!("{peer} added");
        }
        ClusterCommand::RemoveNode { name } => {
            api.call(
                "DELETE",
                &format!("/api/berth/cluster/members/{name}"),
                None,
            )?;
            println!("{name} removed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_every_member_and_the_leader() {
        let v = json!({"node": "n1", "role": "leader", "term": 3, "leader": "n1",
            "last_log_index": 10, "applied_index": 10, "snapshot_index": null,
            "members": [{"name": "n1", "cluster_address": "127.0.0.1:1", "amqp": "127.0.0.1:5672",
                         "leader": true, "running": true, "matched_index": 10, "lag_entries": 0, "millis_since_heard": 0},
                        {"name": "n2", "cluster_address": "127.0.0.1:2", "amqp": "",
                         "leader": false, "running": false, "matched_index": 4, "lag_entries": 6, "millis_since_heard": 9000,
                         "alarms": ["disk (5 bytes free)"]}]});
        let t = render(&v);
        assert!(t.contains("leader n1"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("n2")
                && l.contains("false")
                && l.contains('6')
                && l.ends_with("disk (5 bytes free)")),
            "{t}"
        );
        assert_eq!(t.lines().count(), 5, "{t}");
    }
}
