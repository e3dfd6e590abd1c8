//! Listening sockets: binding every configured address of one kind (AMQP,
//! AMQPS, HTTP, HTTPS) in one go, and taking the next connection from a
//! listener without spinning when accepting fails.
//!
//! Invariants:
//! - An IPv6 address is bound IPv6-only, so `[::]` and `0.0.0.0` listed
//!   side by side are independent sockets.
//! - Every listen backlog is [`limits::LISTEN_BACKLOG_CONNECTIONS`]; a
//!   failing `accept` waits [`limits::ACCEPT_BACKOFF_MS`] before the next.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::limits;
use crate::ServerError;

/// The listeners of one kind and the addresses they got (a port of 0 in
/// the configuration becomes the port the kernel picked).
pub struct Bound {
    pub listeners: Vec<TcpListener>,
    pub addrs: Vec<SocketAddr>,
}

impl Bound {
    /// The addresses as `ADDR[,ADDR...]`, for the ready line.
    pub fn addr_list(&self) -> String {
        let all: Vec<String> = self.addrs.iter().map(ToString::to_string).collect();
        all.join(",")
    }
}

/// Whether an unbindable `[::]` address may be skipped: a host without
/// IPv6 still serves IPv4 with the default AMQP configuration.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ipv6 {
    Required,
    SkipWhenUnavailable,
}

/// Binds every address of `addrs`.
pub fn bind_all(addrs: &[String], ipv6: Ipv6) -> Result<Bound, ServerError> {
    let mut listeners = Vec::new();
    for a in addrs {
        match bind(a) {
            Ok(l) => listeners.push(l),
            Err(e)
                if ipv6 == Ipv6::SkipWhenUnavailable
                    && a.starts_with("[::]")
                    && addrs.len() > 1 =>
            {
                tracing::warn!("skipping {a}: {e}");
            }
            Err(e) => return Err(e),
        }
    }
    let addrs = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    Ok(Bound { listeners, addrs })
}

fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    let err = |source| ServerError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let domain = socket2::Domain::for_address(sa);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(err)?;
    if sa.is_ipv6() {
        // [::] and 0.0.0.0 are listed separately; keep them independent.
        s.set_only_v6(true).map_err(err)?;
    }
    s.set_reuse_address(true).map_err(err)?;
    s.set_nonblocking(true).map_err(err)?;
    s.bind(&sa.into()).map_err(err)?;
    s.listen(limits::LISTEN_BACKLOG_CONNECTIONS).map_err(err)?;
    TcpListener::from_std(s.into()).map_err(err)
}

/// The next connection on `listener` (`scheme` names it in the log).
pub async fn accept(listener: &TcpListener, scheme: &str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(x) => return x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed ({scheme})");
                tokio::time::sleep(Duration::from_millis(limits::ACCEPT_BACKOFF_MS)).await;
            }
        }
    }
}
