//! HTTPS for the management API: the same router as the HTTP listener,
//! served over the AMQPS TLS setup ([`crate::tls::Tls`]), so one SIGHUP
//! reload serves both and `tls.verify_peer` / `tls.fail_if_no_peer_cert`
//! apply alike.
//!
//! Invariants:
//! - A slow or failing TLS handshake costs only its own task: handshakes
//!   run beside the accept loop (at most [`limits::HTTPS_HANDSHAKES_MAX`]
//!   at once and [`limits::HTTPS_HANDSHAKES_PER_ADDRESS_MAX`] from one
//!   address, see [`crate::handshake_slots`], each bounded by
//!   `net.tls_handshake_timeout_ms`) and only finished ones reach the HTTP
//!   server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

use crate::handshake_slots::HandshakeSlots;
use crate::limits;
use crate::tls::Tls;

/// Connections whose TLS handshake is done, as axum's listener.
struct Handshaken {
    done: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for Handshaken {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.done.recv().await {
            Some(x) => x,
            // The accept loop ended (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Serves `app` on `listener` over TLS until `shutdown` changes.
pub fn serve(
    tls: &Arc<Tls>,
    listener: TcpListener,
    app: Router,
    handshake_timeout: Duration,
    shutdown: &watch::Receiver<bool>,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let (tx, done) = mpsc::channel(limits::HTTPS_HANDSHAKES_MAX);
    let mut stop = shutdown.clone();
    let accepting = tokio::spawn(accept_loop(
        Arc::clone(tls),
        listener,
        tx,
        handshake_timeout,
        shutdown.clone(),
    ));
    tokio::spawn(async move {
        let served = axum::serve(
            Handshaken { done, local }.tap_io(|_| {}),
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _sender_dropped_means_stop_too = stop.changed().await;
        })
        .await;
        accepting.abort();
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTPS listener failed");
        }
    });
    Ok(())
}

async fn accept_loop(
    tls: Arc<Tls>,
    listener: TcpListener,
    done: mpsc::Sender<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = HandshakeSlots::default();
    loop {
        let Some(total) = slots.free().await else {
            return;
        };
        // No new connection once shutdown is asked (the connections open
        // may take a while to finish; meanwhile another server — a new
        // leader's — may serve this port).
        let (stream, peer) = tokio::select! {
            a = crate::listen::accept(&listener, "https") => a,
            _ = shutdown.changed() => return,
        };
        let Some(slot) = slots.take(total, peer.ip()) else {
            tracing::debug!(%peer, "HTTPS: closed, its address has {} TLS handshakes running",
                limits::HTTPS_HANDSHAKES_PER_ADDRESS_MAX);
            continue;
        };
        let (acceptor, done) = (tls.acceptor(), done.clone());
        tokio::spawn(async move {
            let shaken = tokio::time::timeout(timeout, acceptor.accept(stream)).await;
            drop(slot);
            match shaken {
                Ok(Ok(s)) => {
                    let _server_gone_at_shutdown = done.send((s, peer)).await;
                }
                Ok(Err(e)) => tracing::info!(%peer, error = %e, "HTTPS: TLS handshake failed"),
                Err(_) => tracing::info!(%peer, "HTTPS: TLS handshake timed out after {timeout:?}"),
            }
        });
    }
}
