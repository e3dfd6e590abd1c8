//! The MQTT accept loop, for plain, TLS (MQTTS) and WebSocket listeners
//! alike: the same connection limit and connection-id counter as the
//! AMQP listeners (`crate::accept::Accepting`), the one step that differs
//! (a TLS handshake with its client-certificate user name, or a
//! WebSocket upgrade), then one task per connection.
//!
//! Invariants:
//! - Connection ids come from the one counter every listener shares, so
//!   an MQTT clean session's exclusive queues can never be owned by an
//!   AMQP connection's id, or the reverse.
//! - Beyond `limits.connections_max` open connections (AMQP and MQTT
//!   together) a new one is closed at once, before any handshake.
//! - A TLS handshake or WebSocket upgrade is bounded in time
//!   (`net.tls_handshake_timeout_ms`, `net.handshake_timeout_ms`) and
//!   costs only its own task.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use super::clients::Clients;
use super::retained::Stores;
use super::stream::{Link, Reader, Writer};
use crate::accept::Accepting;
use crate::tls::Tls;

/// What a listener's connections go through before MQTT starts.
#[derive(Clone)]
pub enum Transport {
    /// `net.mqtt_listen`.
    Plain,
    /// `net.mqtts_listen`: TLS with the `[tls]` certificate.
    Tls(Arc<Tls>),
    /// `net.mqtt_ws_listen`: a WebSocket upgrade on `/ws`.
    WebSocket,
}

impl Transport {
    /// The listener kind, as the ready line and logs name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Plain => "mqtt",
            Self::Tls(_) => "mqtts",
            Self::WebSocket => "mqtt-ws",
        }
    }
}

/// Accepts MQTT connections on `listener` until the task is aborted.
pub async fn accept_loop(
    listener: TcpListener,
    transport: Transport,
    a: Accepting,
    clients: Arc<Clients>,
    retained: Arc<Stores>,
) {
    loop {
        let (stream, peer) = crate::listen::accept(&listener, transport.kind()).await;
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
        let transport = transport.clone();
        tokio::spawn(async move {
            let local = stream.local_addr().unwrap_or(peer);
            if let Some((rd, wr, cert_name)) = open_stream(stream, peer, &transport, &shared).await
            {
                let link = Link {
                    peer,
                    local,
                    id,
                    cert_name,
                    transport: transport.kind(),
                };
                super::connection::serve((rd, wr), link, shared, mqtt, shutdown).await;
            }
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The transport's step: nothing, a TLS handshake (and the user name the
/// client certificate gives), or a WebSocket upgrade; `None` if it
/// failed (logged).
async fn open_stream(
    stream: TcpStream,
    peer: SocketAddr,
    transport: &Transport,
    shared: &crate::state::Shared,
) -> Option<(Reader, Writer, Option<String>)> {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    match transport {
        Transport::Plain => {
            let (rd, wr) = stream.into_split();
            Some((Box::new(rd), Box::new(wr), None))
        }
        Transport::Tls(tls) => {
            let (rd, wr, cert_name) =
                crate::accept::handshake(tls.acceptor(), stream, peer, shared).await?;
            Some((Box::new(rd), Box::new(wr), cert_name))
        }
        Transport::WebSocket => {
            let (rd, wr) = super::ws::upgrade(stream, peer, shared).await?;
            Some((rd, wr, None))
        }
    }
}
