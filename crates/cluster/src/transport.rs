//! How nodes talk: one TCP connection per (sender, receiver) pair, frames
//! delimited by a length prefix (tokio-util's codec), each frame one
//! postcard-encoded request or response. A connection starts with a
//! challenge-response proof of the cluster secret in both directions.
//!
//! Invariants:
//! - Nothing reaches Raft from a connection that has not proven the secret.
//! - A frame that does not decode closes its connection, never the node.

mod client;
pub use client::Heard;
mod handshake;
mod server;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use std::io;
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::limits::PEER_FRAME_BYTES_MAX;
use crate::types::{NodeId, TypeConfig};

pub(crate) use client::Network;
pub(crate) use server::serve;

/// Version of the frames below; a peer speaking another version is refused
/// at the handshake with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
pub(crate) enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
}

pub(crate) type Conn = Framed<TcpStream, LengthDelimitedCodec>;

pub(crate) fn framed(stream: TcpStream) -> Conn {
    let _ = stream.set_nodelay(true); // latency only; the connection works either way
    Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(PEER_FRAME_BYTES_MAX)
            .new_codec(),
    )
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
