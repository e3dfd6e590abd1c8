//! How nodes talk: one TCP connection per (sender, receiver) pair, frames
//! delimited by a length prefix (tokio-util's codec), each frame one
//! postcard-encoded request or response. With [`PeerTls`] every connection
//! is TLS first, both sides presenting a certificate their CA signed
//! (mutual TLS). Then, TLS or not, a connection starts with a
//! challenge-response proof of the cluster secret in both directions;
//! without TLS every later frame carries a MAC keyed from the secret and
//! that handshake (`frame_mac.rs`).
//!
//! Invariants:
//! - Nothing reaches Raft from a connection that has not proven the secret
//!   (and, with TLS, a certificate the CA signed), nor a frame that was not
//!   sent by the peer that proved it (TLS, or the frame's MAC).
//! - A frame that does not decode closes its connection, never the node.

mod admission;
mod client;
pub use client::Heard;
mod frame_mac;
mod handshake;
mod server;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use std::io;
use std::net::{IpAddr, SocketAddr};

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::rustls;
use tokio_util::codec::Framed;

use crate::limits::HANDSHAKE_FRAME_BYTES_MAX;
#[cfg(doc)]
use crate::limits::PEER_FRAME_BYTES_MAX;
use crate::types::{NodeId, TypeConfig};

pub(crate) use client::{Network, Peer};
pub(crate) use frame_mac::FrameKeys;
pub(crate) use server::serve;

/// Version of the frames below; a peer speaking another version is refused
/// at the handshake with both versions named.
pub const PROTOCOL_VERSION: u32 = 4;

#[derive(Serialize, Deserialize)]
pub(crate) enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// The leader asks for the member's report (`report.rs`).
    Report,
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Report(crate::report::MemberReport),
}

/// TLS between members: this member's server side (its certificate, and
/// client certificates required and verified against the CA) and client
/// side (the CA to verify peers by, and its own certificate to present).
/// Built by the caller from its certificate files.
#[derive(Clone)]
pub struct PeerTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

/// A peer connection's byte stream: plain TCP or TLS over it.
pub(crate) trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> PeerIo for T {}

pub(crate) type Conn = Framed<Box<dyn PeerIo>, frame_mac::PeerCodec>;

/// The server name a peer's certificate must carry: the host of its
/// `host:port` (an IP address or a DNS name).
fn server_name(addr: &str) -> io::Result<rustls::pki_types::ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is not a host name a certificate can carry: {e}"),
        )
    })
}

/// Wraps a connected stream in TLS as its client, checking that the
/// peer's certificate names the host of `addr`.
pub(crate) async fn tls_connect(
    tls: &PeerTls,
    addr: &str,
    stream: TcpStream,
) -> io::Result<Box<dyn PeerIo>> {
    let _ = stream.set_nodelay(true); // latency only; the connection works either way
    let name = server_name(addr)?;
    let tls_stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client))
        .connect(name, stream)
        .await?;
    Ok(Box::new(tls_stream))
}

/// Wraps an accepted stream in TLS as its server.
pub(crate) async fn tls_accept(tls: &PeerTls, stream: TcpStream) -> io::Result<Box<dyn PeerIo>> {
    let _ = stream.set_nodelay(true); // latency only; the connection works either way
    let tls_stream = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.server))
        .accept(stream)
        .await?;
    Ok(Box::new(tls_stream))
}

/// A plain TCP stream as a peer stream.
pub(crate) fn plain(stream: TcpStream) -> Box<dyn PeerIo> {
    let _ = stream.set_nodelay(true); // latency only; the connection works either way
    Box::new(stream)
}

/// A new connection, taking only handshake-sized frames until
/// [`authenticated`] lifts the limit.
pub(crate) fn framed(stream: Box<dyn PeerIo>) -> Conn {
    Framed::new(stream, frame_mac::PeerCodec::new(HANDSHAKE_FRAME_BYTES_MAX))
}

/// The peer proved the secret: it may send frames up to `frame_max` (an
/// append's size, [`PEER_FRAME_BYTES_MAX`] outside tests). On a plain link
/// (`tls` false) every frame from now on carries a MAC under `keys`
/// (`frame_mac.rs`); TLS authenticates its own.
pub(crate) fn authenticated(conn: &mut Conn, frame_max: usize, keys: FrameKeys, tls: bool) {
    conn.codec_mut()
        .set_limit(frame_max, (!tls).then_some(keys));
}

/// Connects to a peer's `host:port`. With a `source`, the connection
/// leaves from that address (the node's own cluster address), so peers and
/// firewalls see one address per node, and a rule between two nodes' addresses
/// partitions exactly those two.
pub(crate) async fn dial(addr: &str, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = None;
    for to in tokio::net::lookup_host(addr).await? {
        if to.is_ipv4() != source.is_ipv4() {
            continue;
        }
        let socket = if to.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(source, 0))?;
        match socket.connect(to).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!(
                "{addr} has no address of the same family as this node's cluster address {source}"
            ),
        )
    }))
}

/// Decodes `bytes` as each frame a peer can send (for the fuzz target).
pub(crate) fn decode_untrusted(bytes: &[u8]) {
    let _ = postcard::from_bytes::<Request>(bytes);
    handshake::decode_untrusted(bytes);
}
