//! The one filter the binary's log adds to the operator's level: openraft's
//! per-attempt reports of a member it cannot reach are dropped, since the
//! cluster transport says once when a peer becomes unreachable and once
//! when it is back (`berth_cluster::is_peer_retry_noise` names them).
//! A level or `RUST_LOG` that names openraft itself gets everything.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use berth_server::cluster::is_peer_retry_noise;

/// Drops openraft's repeated "peer unreachable" events (see the module).
pub(crate) struct QuietPeerRetries;

impl QuietPeerRetries {
    /// The filter for a log whose level directives are `directives`:
    /// none when they name openraft (someone is looking at it).
    pub(crate) fn unless_named_in(directives: &str) -> Option<QuietPeerRetries> {
        (!directives.contains("openraft")).then_some(QuietPeerRetries)
    }
}

impl<S: Subscriber> Layer<S> for QuietPeerRetries {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let target = event.metadata().target();
        if !target.starts_with("openraft::") {
            return true;
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        !is_peer_retry_noise(target, &text.0)
    }
}

/// An event's message and field values, space-separated.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, _: &Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let _infallible = write!(self.0, "{value:?}");
    }

    fn record_str(&mut self, _: &Field, value: &str) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        self.0.push_str(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// What reaches the log: every event's target and message.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let mut text = Text(String::new());
            event.record(&mut text);
            let line = format!("{} {}", event.metadata().target(), text.0);
            self.0.lock().unwrap().push(line);
        }
    }

    fn logged(quiet: Option<QuietPeerRetries>) -> Vec<String> {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(seen.clone())
            .with(quiet);
        tracing::subscriber::with_default(subscriber, || {
            let err = "Unreachable node: std::io::error::Error: Connection refused (os error 111)";
            tracing::error!(target: "openraft::replication", err = %err, "RPCError");
            tracing::warn!(target: "openraft::engine::handler::replication_handler", "heartbeat error: {err}, no update to inflight data");
            tracing::error!(target: "openraft::replication", error = "StorageError: read failed", "error replication to target=2");
            tracing::warn!(target: "berth_cluster::transport::client", peer = 3, "cluster peer unreachable");
        });
        let lines = seen.0.lock().unwrap().clone();
        lines
    }

    #[test]
    fn openrafts_unreachable_reports_are_dropped_and_the_rest_kept() {
        let lines = logged(QuietPeerRetries::unless_named_in("info"));
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[0].contains("StorageError"), "{lines:#?}");
        assert!(lines[1].contains("cluster peer unreachable"), "{lines:#?}");
    }

    #[test]
    fn a_filter_naming_openraft_gets_everything() {
        let lines = logged(QuietPeerRetries::unless_named_in("info,openraft=debug"));
        assert_eq!(lines.len(), 4, "{lines:#?}");
    }
}
