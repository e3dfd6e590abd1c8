//! The receiving side: accepts peers, proves the secret, and hands each
//! request to the local Raft node. A peer whose connection closes while it
//! leads is most likely dead (its process ended): the node asks for an
//! election at once instead of waiting out the election timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;

use super::{framed, handshake, Conn, Request, Response};
use crate::identity::Identity;
use crate::limits::{
    ELECTION_RETRIES, HANDSHAKE_TIMEOUT_MS, LEADER_DEATH_RETRY_MS, LEADER_PROBE_AT_MS,
    LEADER_PROBE_TIMEOUT_MS,
};
use crate::report::Reports;
use crate::standing::Standing;
use crate::types::{NodeId, Raft};
use openraft::error::{Fatal, RaftError};

/// Accepts peers until the task is aborted.
/// Each connection runs in a task of one set, so that aborting this task
/// (the node stops) closes every peer connection too.
pub(crate) async fn serve(
    listener: TcpListener,
    raft: Raft,
    (secret, identity): (Arc<Vec<u8>>, Arc<Identity>),
    (standing, reports): (Arc<Standing>, Arc<Reports>),
    tls: Option<super::PeerTls>,
    frame_max: usize,
) {
    let node = raft.metrics().borrow().id;
    let mut connections = tokio::task::JoinSet::new();
    let handshakes = Arc::new(super::admission::Handshakes::default());
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, addr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors and the like: wait, never spin.
                tracing::warn!(error = %e, "cluster listener cannot accept");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match handshakes.take(addr.ip()) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(%addr, "closed a cluster connection at once: {why}");
                continue;
            }
        };
        let raft = raft.clone();
        let secret = secret.clone();
        let identity = identity.clone();
        let standing = standing.clone();
        let reports = reports.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let stream = match &tls {
                Some(tls) => {
                    let limit = std::time::Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
                    match tokio::time::timeout(limit, super::tls_accept(tls, stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::warn!(%addr, error = %e, "refused a cluster connection: TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(%addr, "refused a cluster connection: no TLS handshake within {limit:?}");
                            return;
                        }
                    }
                }
                None => super::plain(stream),
            };
            let mut conn = framed(stream);
            let proven = handshake::accept(&mut conn, &secret, node, &identity).await;
            drop(slot);
            match proven {
                Ok((peer, keys)) => {
                    super::authenticated(&mut conn, frame_max, keys, tls.is_some());
                    serve_peer(conn, peer, &raft, (&standing, &reports)).await;
                }
                // A member probing whether this one is alive connects and
                // closes at once; that is not worth a warning.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    tracing::debug!(%addr, "a cluster connection closed before its handshake (a probe)");
                }
                Err(e) => tracing::warn!(%addr, error = %e, "refused a cluster connection"),
            }
        });
    }
}

async fn serve_peer(
    mut conn: Conn,
    peer: NodeId,
    raft: &Raft,
    (standing, reports): (&Standing, &Reports),
) {
    while let Some(frame) = conn.next().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(peer, error = %e, "closing a cluster connection: bad frame");
                break;
            }
        };
        let request: Request = match postcard::from_bytes(&frame) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(peer, error = %e, "closing a cluster connection: request does not decode");
                break;
            }
        };
        let response = match request {
            Request::Append(rpc) => {
                let commit = rpc.leader_commit.map(|c| c.index);
                let reply = raft.append_entries(rpc).await;
                if crate::probation::from_current_leader(&reply) {
                    standing.probation.heard_commit(commit);
                }
                Response::Append(reply)
            }
            // On probation this node may lack entries it acknowledged: it
            // must not help elect anyone (probation.rs).
            Request::Vote(_) if standing.probation.active() => {
                Response::Vote(Err(RaftError::Fatal(Fatal::Stopped)))
            }
            Request::Vote(rpc) => Response::Vote(raft.vote(rpc).await),
            Request::Snapshot(rpc) => Response::Snapshot(raft.install_snapshot(rpc).await),
            Request::Report => Response::Report(reports.local()),
        };
        let bytes = match postcard::to_allocvec(&response) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(peer, error = %e, "cannot encode a cluster response");
                break;
            }
        };
        if conn.send(Bytes::from(bytes)).await.is_err() {
            break;
        }
        let applied = raft.metrics().borrow().last_applied.map(|l| l.index);
        if standing.probation.end_if_caught_up(applied) {
            tracing::info!(
                applied,
                "caught up with the leader after a damaged log: this node votes and may lead again"
            );
            if !standing.fenced.load(std::sync::atomic::Ordering::Acquire) {
                raft.runtime_config().elect(true);
            }
        }
    }
    // The leader's connection closed. If its process is gone, a connect to
    // its address is refused at once, and an election now costs one round
    // trip instead of the election timeout. A leader that is merely slow or
    // partitioned keeps its port open (or does not answer), so a silent
    // failure still waits for the timeout.
    let start = tokio::time::Instant::now();
    for at in LEADER_PROBE_AT_MS {
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        let (leader, addr) = {
            let m = raft.metrics().borrow().clone();
            (
                m.current_leader,
                m.membership_config
                    .membership()
                    .get_node(&peer)
                    .map(|n| n.addr.clone()),
            )
        };
        if leader != Some(peer) {
            return; // another member leads (or an election runs) already
        }
        let Some(addr) = addr else { return };
        let probe = tokio::time::timeout(
            Duration::from_millis(LEADER_PROBE_TIMEOUT_MS),
            tokio::net::TcpStream::connect(&addr),
        )
        .await;
        if let Ok(Err(e)) = probe {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                tracing::info!(peer, %addr, "the leader's process is gone (connection refused); asking for an election");
                if standing.may_stand() {
                    elect_after_leader_died(raft, peer).await;
                } else {
                    tracing::info!("not standing: this node is fenced or on probation");
                }
                return;
            }
        }
    }
}

/// Every survivor that saw the leader die stands at once, so the first
/// round is often split: at one term the vote of the larger node id wins,
/// but a voter refuses a candidate with less log. When the round is
/// split, the survivor with the larger id lost on log to a smaller one, so
/// the survivors ask again in ascending id order, the smallest first —
/// the others still stand in the old term and grant the new one — instead
/// of each waiting out a random election timeout.
async fn elect_after_leader_died(raft: &Raft, dead: NodeId) {
    let (me, survivors) = {
        let m = raft.metrics().borrow().clone();
        let survivors: Vec<NodeId> = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|id| *id != dead)
            .collect();
        (m.id, survivors)
    };
    let rank = survivors.iter().filter(|id| **id < me).count() as u64;
    let start = tokio::time::Instant::now();
    for round in 0..=ELECTION_RETRIES {
        if round > 0 {
            let at = LEADER_DEATH_RETRY_MS * (rank + 1) * round;
            tokio::time::sleep_until(start + Duration::from_millis(at)).await;
            // A leader is known: standing again would depose it. (This
            // node's vote naming another candidate is no reason to stop:
            // a candidate that sees a greater vote in an answer takes it
            // over even when it refused that candidate for its shorter
            // log — then only standing again elects anyone before the
            // timeout. Seen: the survivor with the longer log stopped and
            // the election waited 2.4 s.)
            let leader = raft.metrics().borrow().current_leader;
            if leader.is_some_and(|l| l != dead) {
                return;
            }
            tracing::info!(round, "no leader yet after the leader died; standing again");
        }
        if let Err(e) = raft.trigger().elect().await {
            tracing::warn!(error = %e, "cannot start an election");
            return;
        }
    }
}
