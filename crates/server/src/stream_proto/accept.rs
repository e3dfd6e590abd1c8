//! The stream protocol's accept loop: the same connection limit and
//! connection-id counter as the AMQP and MQTT listeners
//! (`crate::accept::Accepting`), one task per connection.
//!
//! Invariants:
//! - Connection ids come from the one counter every listener shares, so
//!   no two connections of any protocol own the same exclusive queues.
//! - Beyond `limits.connections_max` open connections (all protocols
//!   together) a new one is closed at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::tracking::Tracking;
use crate::accept::Accepting;

/// Accepts stream protocol connections on `listener` until the task is
/// aborted.
pub async fn accept_loop(listener: TcpListener, a: Accepting, tracking: Arc<Tracking>) {
    loop {
        let (stream, peer) = crate::listen::accept(&listener, "stream").await;
        let max = a.shared.config.limits.connections_max;
        if max > 0 && a.open.load(Ordering::Acquire) >= max {
            tracing::warn!(%peer, max, "stream connection refused: limits.connections_max reached");
            drop(stream);
            continue;
        }
        a.open.fetch_add(1, Ordering::AcqRel);
        let id = a.next_id.fetch_add(1, Ordering::Relaxed);
        let (shared, shutdown, open, tracking) = (
            Arc::clone(&a.shared),
            a.shutdown.clone(),
            Arc::clone(&a.open),
            Arc::clone(&tracking),
        );
        tokio::spawn(async move {
            super::connection::serve(stream, peer, id, shared, tracking, shutdown).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}
