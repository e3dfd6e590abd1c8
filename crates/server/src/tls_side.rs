//! The AMQPS side: accept loops that run the TLS handshake (bounded by
//! `net.handshake_timeout_ms`) and hand the connection to the same
//! connection code as plain TCP, and the SIGHUP handler that reloads the
//! certificate, key and CA file (for AMQPS and HTTPS alike).
//!
//! Invariants:
//! - A slow or failing TLS handshake costs only its own task.
//! - TLS connection ids come from their own counter starting at
//!   [`TLS_CONNECTION_ID_BASE`], so they never collide with plain ones
//!   (exclusive queues are owned by connection id).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connection::{self, Shared};
use crate::limits;
use crate::tls::Tls;

/// First id of TLS connections (plain ones count up from 1).
pub const TLS_CONNECTION_ID_BASE: u64 = 1 << 48;

/// Starts one accept loop per listener and the SIGHUP reloader.
pub fn start(
    tls: &Arc<Tls>,
    listeners: Vec<TcpListener>,
    shared: &Arc<Shared>,
    shutdown: &watch::Receiver<bool>,
    open: &Arc<AtomicUsize>,
) {
    let next_id = Arc::new(AtomicU64::new(TLS_CONNECTION_ID_BASE));
    for l in listeners {
        let (tls, shared, shutdown, open, next_id) = (
            Arc::clone(tls),
            Arc::clone(shared),
            shutdown.clone(),
            Arc::clone(open),
            Arc::clone(&next_id),
        );
        tokio::spawn(async move {
            let mut stop = shutdown.clone();
            tokio::select! {
                () = accept_loop(l, tls, shared, shutdown, open, next_id) => {}
                _ = stop.changed() => {}
            }
        });
    }
    let tls = Arc::clone(tls);
    let mut stop = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!(
                "cannot install the SIGHUP handler; TLS certificates will not be reloaded"
            );
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and CA file reloaded"),
                    Err(e) => tracing::error!("SIGHUP: TLS reload failed, keeping the current certificate: {e}"),
                },
                _ = stop.changed() => return,
            }
        }
    });
}

async fn accept_loop(
    listener: TcpListener,
    tls: Arc<Tls>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
    next_id: Arc<AtomicU64>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed (amqps)");
                tokio::time::sleep(Duration::from_millis(limits::ACCEPT_BACKOFF_MS)).await;
                continue;
            }
        };
        let max = shared.config.limits.connections_max;
        if max > 0 && open.load(Ordering::Acquire) >= max {
            tracing::warn!(%peer, max, "connection refused: limits.connections_max reached");
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let (acceptor, shared, shutdown, open) = (
            tls.acceptor(),
            Arc::clone(&shared),
            shutdown.clone(),
            Arc::clone(&open),
        );
        tokio::spawn(async move {
            serve_one(acceptor, stream, peer, id, shared, shutdown).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

async fn serve_one(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let local = stream.local_addr().unwrap_or(peer);
    let timeout = Duration::from_millis(shared.config.net.handshake_timeout_ms);
    let tls = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake timed out after {timeout:?}");
            return;
        }
    };
    let login = shared.config.tls.cert_login();
    let cert_name = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| login.user_name(c));
    let (rd, wr) = crate::stream::tls(tls);
    connection::serve_stream(rd, wr, (peer, local), id, shared, shutdown, cert_name).await;
}
