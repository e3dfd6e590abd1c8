//! Which of openraft's log events only repeat that a peer cannot be
//! reached: openraft 0.9 logs every failed attempt to reach a member
//! (`ERROR RPCError … Connection refused` and four warnings, every
//! heartbeat, about ten lines a second for as long as the member is down).
//! berth's transport says it once instead — `cluster peer unreachable`
//! when a peer stops answering, `cluster peer reachable again` when it
//! answers ([`crate::transport::Heard`]) — so the binary's log filter
//! drops these (see `init_logging` in the cli).
//!
//! Only events of openraft's replication that name a network failure
//! (or the back-off that follows one) match: a storage error, a remote
//! error or a too-large payload in the same places still reaches the log.

/// openraft's targets that report each failed replication attempt.
const TARGETS: [&str; 2] = [
    "openraft::replication",
    "openraft::engine::handler::replication_handler",
];

/// How openraft 0.9 shows a failure to reach a peer (`RPCError`'s
/// `Unreachable`, `Network` and `Timeout` variants).
const NETWORK_FAILURES: [&str; 3] = ["Unreachable node: ", "NetworkError: ", "timeout after "];

/// Whether an event of `target` whose message and other field values are
/// `text` only repeats that a peer cannot be reached.
#[must_use]
pub fn is_peer_retry_noise(target: &str, text: &str) -> bool {
    TARGETS.contains(&target)
        && (text.contains("backoff mode: drain events")
            || NETWORK_FAILURES.iter().any(|f| text.contains(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines one leader logged in 12 s with a member killed
    /// (openraft 0.9.25, three debug berths on loopback).
    #[test]
    fn openrafts_reports_of_an_unreachable_peer_are_noise() {
        for (target, text) in [
            (
                "openraft::replication",
                "RPCError Unreachable node: std::io::error::Error: Connection refused (os error 111)",
            ),
            (
                "openraft::replication",
                "error replication to target=626982245195372582 Unreachable node: std::io::error::Error: Connection refused (os error 111)",
            ),
            (
                "openraft::replication",
                "RPCError NetworkError: std::io::error::Error: peer closed the connection",
            ),
            (
                "openraft::replication",
                "openraft::replication::ReplicationCore<_, _, _>::backoff_drain_events backoff mode: drain events without processing them 499.99953ms",
            ),
            (
                "openraft::engine::handler::replication_handler",
                "update progress error HeartBeat Unreachable node: std::io::error::Error: Connection refused (os error 111)",
            ),
            (
                "openraft::engine::handler::replication_handler",
                "heartbeat error: Unreachable node: std::io::error::Error: Connection refused (os error 111), no update to inflight data",
            ),
        ] {
            assert!(is_peer_retry_noise(target, text), "{target}: {text}");
        }
    }

    #[test]
    fn other_errors_and_other_targets_are_kept() {
        for (target, text) in [
            // A storage error while replicating.
            (
                "openraft::replication",
                "error replication to target=2 StorageError: read log entries: Input/output error",
            ),
            // A peer that answered with an error.
            ("openraft::replication", "RPCError RemoteError: fatal"),
            // The same words from elsewhere.
            (
                "openraft::core::raft_core",
                "Unreachable node: std::io::error::Error: Connection refused",
            ),
            ("berth_cluster::transport::client", "NetworkError: x"),
        ] {
            assert!(!is_peer_retry_noise(target, text), "{target}: {text}");
        }
    }
}
