//! The sending side: openraft's network factory and one client per peer,
//! each holding at most one authenticated connection, re-made on demand.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

use super::{framed, handshake, Conn, Request, Response};
use crate::identity::Identity;
use crate::limits::APPEND_BYTES_TARGET;
use crate::types::{NodeId, TypeConfig};

type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// Makes a [`Peer`] for each member openraft replicates to.
#[derive(Clone)]
pub(crate) struct Network {
    pub(crate) node: NodeId,
    pub(crate) secret: Arc<Vec<u8>>,
    pub(crate) identity: Arc<Identity>,
    pub(crate) heard: Arc<Heard>,
    /// The address outgoing connections leave from (see `dial`).
    pub(crate) source: Option<std::net::IpAddr>,
    pub(crate) tls: Option<super::PeerTls>,
    /// Largest frame to send (see `NodeConfig::peer_frame_bytes_max`).
    pub(crate) frame_max: usize,
}

/// When each peer last answered a call of this node (for the members'
/// `running` in status: a leader calls every member every heartbeat), and
/// since when its calls fail: the log says once that a peer became
/// unreachable and once that it answers again, however often openraft
/// retries in between (its own per-attempt reports are dropped by the
/// binary's log filter, see [`crate::is_peer_retry_noise`]).
#[derive(Default)]
pub struct Heard(parking_lot::Mutex<std::collections::BTreeMap<NodeId, Reach>>);

#[derive(Default)]
struct Reach {
    answered: Option<Instant>,
    /// When its calls began to fail; `None` while they are answered.
    failing_since: Option<Instant>,
}

impl Heard {
    fn answered(&self, peer: NodeId, addr: &str) {
        let now = Instant::now();
        let was_failing = {
            let mut m = self.0.lock();
            let r = m.entry(peer).or_default();
            r.answered = Some(now);
            r.failing_since.take()
        };
        if let Some(since) = was_failing {
            tracing::info!(
                peer,
                addr,
                unreachable_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                "cluster peer reachable again"
            );
        }
    }

    fn failed(&self, peer: NodeId, addr: &str, error: &io::Error) {
        let first = {
            let mut m = self.0.lock();
            let r = m.entry(peer).or_default();
            let first = r.failing_since.is_none();
            r.failing_since.get_or_insert_with(Instant::now);
            first
        };
        if first {
            tracing::warn!(
                peer,
                addr,
                %error,
                "cluster peer unreachable; retrying, and saying so again only once it answers"
            );
        }
    }

    /// How long ago `peer` last answered, if it ever did.
    pub fn since(&self, peer: NodeId) -> Option<Duration> {
        self.0
            .lock()
            .get(&peer)
            .and_then(|r| r.answered)
            .map(|t| t.elapsed())
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            node: self.node,
            target,
            addr: node.addr.clone(),
            secret: self.secret.clone(),
            identity: self.identity.clone(),
            heard: self.heard.clone(),
            source: self.source,
            tls: self.tls.clone(),
            frame_max: self.frame_max,
            conn: None,
        }
    }
}

pub(crate) struct Peer {
    node: NodeId,
    target: NodeId,
    addr: String,
    secret: Arc<Vec<u8>>,
    identity: Arc<Identity>,
    heard: Arc<Heard>,
    source: Option<std::net::IpAddr>,
    tls: Option<super::PeerTls>,
    frame_max: usize,
    conn: Option<Conn>,
}

/// Why one call failed, before it is shaped into openraft's error.
enum CallError {
    /// No connection could be made or proven: back off.
    Unreachable(io::Error),
    /// The connection broke or timed out mid-call: retry.
    Network(io::Error),
}

impl Peer {
    /// Connects and proves both sides (learning the peer's member id if
    /// it is new), then lets the connection go.
    pub(crate) async fn meet(mut self) -> io::Result<()> {
        match self.connected().await {
            Ok(_) => Ok(()),
            Err(CallError::Unreachable(e) | CallError::Network(e)) => Err(e),
        }
    }

    /// Asks the member for its report (`report.rs`), within `ttl`.
    pub(crate) async fn report(
        &mut self,
        ttl: Duration,
    ) -> io::Result<crate::report::MemberReport> {
        match self.call(&Request::Report, ttl).await {
            Ok(Response::Report(r)) => Ok(r),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer answered a different request",
            )),
            Err(CallError::Unreachable(e) | CallError::Network(e)) => Err(e),
        }
    }

    async fn connected(&mut self) -> Result<&mut Conn, CallError> {
        if self.conn.is_none() {
            let stream = super::dial(&self.addr, self.source)
                .await
                .map_err(CallError::Unreachable)?;
            // Why a handshake failed is in the error, which the log shows
            // once (`Heard::failed`), not at every retry.
            let stream = match &self.tls {
                Some(tls) => super::tls_connect(tls, &self.addr, stream)
                    .await
                    .map_err(|e| {
                        CallError::Unreachable(context("cluster TLS handshake failed", e))
                    })?,
                None => super::plain(stream),
            };
            let mut conn = framed(stream);
            let keys = handshake::connect(
                &mut conn,
                &self.secret,
                (self.node, self.target),
                &self.identity,
            )
            .await
            .map_err(|e| CallError::Unreachable(context("cluster handshake failed", e)))?;
            super::authenticated(&mut conn, self.frame_max, keys, self.tls.is_some());
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    async fn call(&mut self, request: &Request, ttl: Duration) -> Result<Response, CallError> {
        let bytes =
            postcard::to_allocvec(request).map_err(|e| CallError::Network(io::Error::other(e)))?;
        self.call_encoded(bytes, ttl).await
    }

    async fn call_encoded(&mut self, bytes: Vec<u8>, ttl: Duration) -> Result<Response, CallError> {
        let result = tokio::time::timeout(ttl, async {
            let conn = self.connected().await?;
            conn.send(Bytes::from(bytes))
                .await
                .map_err(CallError::Network)?;
            let frame = conn
                .next()
                .await
                .ok_or_else(|| {
                    CallError::Network(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection",
                    ))
                })?
                .map_err(CallError::Network)?;
            postcard::from_bytes(&frame).map_err(|e| {
                CallError::Network(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("response does not decode: {e}"),
                ))
            })
        })
        .await
        .unwrap_or_else(|_| {
            Err(CallError::Network(io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer in time",
            )))
        });
        match &result {
            Err(CallError::Unreachable(e) | CallError::Network(e)) => {
                self.conn = None; // a half-used connection cannot be trusted to line up answers
                self.heard.failed(self.target, &self.addr, e);
            }
            Ok(_) => self.heard.answered(self.target, &self.addr),
        }
        result
    }

    fn shape<E: std::error::Error>(&self, e: CallError) -> RPCError<NodeId, BasicNode, E> {
        match e {
            CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallError::Network(e) => RPCError::Network(NetworkError::new(&e)),
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer answered a different request",
        );
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        // Too big to send (or to be answered in time) at once: openraft
        // sends fewer entries next. Sized before encoding, so no append is
        // encoded only to be thrown away.
        let (fit, size) =
            crate::types::entries_within(&rpc.entries, self.frame_max.min(APPEND_BYTES_TARGET));
        if fit < rpc.entries.len() {
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(fit as u64),
            ));
        }
        // Encoded into a buffer of about its size: growing one by doubling
        // would copy a multi-megabyte append several times.
        let bytes = postcard::to_extend(&Request::Append(rpc), Vec::with_capacity(size))
            .map_err(|e| self.shape(CallError::Network(io::Error::other(e))))?;
        match self.call_encoded(bytes, option.hard_ttl()).await {
            Ok(Response::Append(r)) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.shape(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        match self.call(&Request::Snapshot(rpc), option.hard_ttl()).await {
            Ok(Response::Snapshot(r)) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.shape(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        match self.call(&Request::Vote(rpc), option.hard_ttl()).await {
            Ok(Response::Vote(r)) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.shape(e)),
        }
    }
}

/// `e` with what was being done in front, its kind kept.
fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}
