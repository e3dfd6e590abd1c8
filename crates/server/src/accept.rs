//! The AMQP accept loop, for plain and TLS listeners alike: the
//! connection limit, the connection ids, and the one step that differs
//! (a TLS handshake, bounded by `net.tls_handshake_timeout_ms`, and the user
//! name its client certificate gives) before the connection code takes
//! over.
//!
//! Invariants:
//! - One counter hands out connection ids for every listener, so ids
//!   never collide (exclusive queues are owned by connection id).
//! - Beyond `limits.connections_max` open connections a new one is
//!   closed at once, before any handshake.
//! - A slow or failing TLS handshake costs only its own task.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::socket::{ReadStream, WriteStream};
use crate::state::Shared;
use crate::tls::Tls;

/// What a listener's connections go through before AMQP starts.
#[derive(Clone)]
pub enum Transport {
    Plain,
    Tls(Arc<Tls>),
}

impl Transport {
    fn scheme(&self) -> &'static str {
        match self {
            Self::Plain => "amqp",
            Self::Tls(_) => "amqps",
        }
    }
}

/// What every accept loop of the server shares.
#[derive(Clone)]
pub struct Accepting {
    pub shared: Arc<Shared>,
    pub shutdown: watch::Receiver<bool>,
    /// Connections open now, for the limit and the shutdown wait.
    pub open: Arc<AtomicUsize>,
    /// The next connection id.
    pub next_id: Arc<AtomicU64>,
}

/// Accepts connections on `listener` until the task is aborted, each
/// served in a task of its own.
pub async fn accept_loop(listener: TcpListener, transport: Transport, a: Accepting) {
    loop {
        let (stream, peer) = crate::listen::accept(&listener, transport.scheme()).await;
        let max = a.shared.config.limits.connections_max;
        if max > 0 && a.open.load(Ordering::Acquire) >= max {
            tracing::warn!(%peer, max, "connection refused: limits.connections_max reached");
            drop(stream);
            continue;
        }
        a.open.fetch_add(1, Ordering::AcqRel);
        let id = a.next_id.fetch_add(1, Ordering::Relaxed);
        // The acceptor is taken now, so a certificate reloaded later
        // applies to later connections only.
        let step = match &transport {
            Transport::Plain => None,
            Transport::Tls(tls) => Some(tls.acceptor()),
        };
        let (shared, shutdown, open) = (
            Arc::clone(&a.shared),
            a.shutdown.clone(),
            Arc::clone(&a.open),
        );
        tokio::spawn(async move {
            serve_one(stream, peer, id, step, shared, shutdown).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

async fn serve_one(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(&stream)
        .set_tcp_notsent_lowat(crate::limits::SOCKET_UNSENT_BYTES_MAX)
    {
        tracing::debug!(%peer, error = %e, "could not set TCP_NOTSENT_LOWAT");
    }
    let local = stream.local_addr().unwrap_or(peer);
    let (rd, wr, cert_name) = match tls {
        None => {
            let (rd, wr) = crate::socket::plain(stream);
            (rd, wr, None)
        }
        Some(acceptor) => match handshake(acceptor, stream, peer, &shared).await {
            Some(x) => x,
            None => return,
        },
    };
    crate::connection::serve_stream(rd, wr, (peer, local), id, shared, shutdown, cert_name).await;
}

/// The TLS step: the handshake (bounded), then the user name the client
/// certificate gives, if any. `None` when the handshake failed (logged).
pub(crate) async fn handshake(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> Option<(ReadStream, WriteStream, Option<String>)> {
    let timeout = Duration::from_millis(shared.config.net.tls_handshake_timeout_ms);
    let tls = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "TLS handshake failed");
            return None;
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake timed out after {timeout:?}");
            return None;
        }
    };
    let login = shared.config.tls.cert_login();
    let cert_name = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| login.user_name(c));
    let (rd, wr) = crate::socket::tls(tls);
    Some((rd, wr, cert_name))
}
