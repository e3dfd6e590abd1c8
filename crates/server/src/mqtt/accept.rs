//! The MQTT accept loop: the same connection limit and connection-id
//! counter as the AMQP listeners (`crate::accept::Accepting`), one task
//! per connection.
//!
//! Invariants:
//! - Connection ids come from the one counter every listener shares, so
//!   an MQTT clean session's exclusive queues can never be owned by an
//!   AMQP connection's id, or the reverse.
//! - Beyond `limits.connections_max` open connections (AMQP and MQTT
//!   together) a new one is closed at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::clients::Clients;
use super::retained::Stores;
use crate::accept::Accepting;

/// Accepts MQTT connections on `listener` until the task is aborted.
pub async fn accept_loop(
    listener: TcpListener,
    a: Accepting,
    clients: Arc<Clients>,
    retained: Arc<Stores>,
) {
    loop {
        let (stream, peer) = crate::listen::accept(&listener, "mqtt").await;
        let max = a.shared.config.limits.connections_max;
        if max > 0 && a.open.load(Ordering::Acquire) >= max {
            tracing::warn!(%peer, max, "MQTT connection refused: limits.connections_max reached");
            drop(stream);
            continue;
        }
        a.open.fetch_add(1, Ordering::AcqRel);
        let id = a.next_id.fetch_add(1, Ordering::Relaxed);
        let (shared, shutdown, open) = (
            Arc::clone(&a.shared),
            a.shutdown.clone(),
            Arc::clone(&a.open),
        );
        let mqtt = (Arc::clone(&clients), Arc::clone(&retained));
        tokio::spawn(async move {
            super::connection::serve(stream, peer, id, shared, mqtt, shutdown).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}
