//! The secret handshake, in the spirit of Erlang's cookie challenge: each
//! side sends a random challenge and answers the other's with an
//! HMAC-SHA256 keyed by the cluster secret, so a stranger can neither join
//! nor impersonate a node, and the secret never crosses the wire.
//!
//! Each side also names itself (node id and member id, see `identity`)
//! inside its proof, and each checks the other's member id against the
//! one it met before: a member whose data directory was replaced is
//! refused under its old name.
//!
//! ```text
//! server → client  Hello  { version, server_challenge }
//! client → server  Answer { version, node, member, client_challenge,
//!                           proof = HMAC(secret, "client" ‖ server_challenge ‖ client_challenge ‖ node ‖ member) }
//! server → client  Verdict::Accepted { node, member,
//!                           proof = HMAC(secret, "server" ‖ client_challenge ‖ server_challenge ‖ node ‖ member) }
//!                | Verdict::Refused { reason }
//! ```

use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::{Conn, FrameKeys, PROTOCOL_VERSION};
use crate::identity::{Identity, MemberId};
use crate::limits::{CHALLENGE_BYTES, HANDSHAKE_TIMEOUT_MS};
use crate::types::NodeId;

type Challenge = [u8; CHALLENGE_BYTES];

#[derive(Serialize, Deserialize)]
struct Hello {
    version: u32,
    challenge: Challenge,
}

#[derive(Serialize, Deserialize)]
struct Answer {
    version: u32,
    node: NodeId,
    member: MemberId,
    challenge: Challenge,
    proof: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
enum Verdict {
    Accepted {
        node: NodeId,
        member: MemberId,
        proof: Vec<u8>,
    },
    Refused {
        reason: String,
    },
}

fn proof(
    secret: &[u8],
    role: &[u8],
    (first, second): (&Challenge, &Challenge),
    node: NodeId,
    member: MemberId,
) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(role);
    mac.update(first);
    mac.update(second);
    mac.update(&node.to_le_bytes());
    mac.update(&member.to_le_bytes());
    mac
}

fn challenge() -> Challenge {
    let mut c = [0u8; CHALLENGE_BYTES];
    rand::rng().fill_bytes(&mut c);
    c
}

fn refused(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, reason.into())
}

async fn send<T: Serialize>(conn: &mut Conn, value: &T) -> io::Result<()> {
    let bytes = postcard::to_allocvec(value).map_err(io::Error::other)?;
    conn.send(Bytes::from(bytes)).await
}

async fn recv<T: for<'de> Deserialize<'de>>(conn: &mut Conn) -> io::Result<T> {
    let frame = conn.next().await.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed during the handshake",
        )
    })??;
    postcard::from_bytes(&frame).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("handshake frame does not decode: {e}"),
        )
    })
}

fn timeout() -> Duration {
    Duration::from_millis(HANDSHAKE_TIMEOUT_MS)
}

/// The accepting side, as node `node`. Returns the proven peer's node id
/// and this connection's frame keys.
pub(crate) async fn accept(
    conn: &mut Conn,
    secret: &[u8],
    node: NodeId,
    identity: &Identity,
) -> io::Result<(NodeId, FrameKeys)> {
    tokio::time::timeout(timeout(), async {
        let ours = challenge();
        send(conn, &Hello { version: PROTOCOL_VERSION, challenge: ours }).await?;
        let answer: Answer = recv(conn).await?;
        if answer.version != PROTOCOL_VERSION {
            let reason = format!("peer speaks cluster protocol {}, this node {PROTOCOL_VERSION}: run one berth version across the cluster", answer.version);
            send(conn, &Verdict::Refused { reason: reason.clone() }).await?;
            return Err(refused(reason));
        }
        let claimed = proof(secret, b"client", (&ours, &answer.challenge), answer.node, answer.member);
        if claimed.verify_slice(&answer.proof).is_err() {
            let reason = "wrong cluster secret: every node needs the same cluster.secret_file contents".to_string();
            send(conn, &Verdict::Refused { reason: reason.clone() }).await?;
            return Err(refused(format!("node {} proved no knowledge of the secret ({reason})", answer.node)));
        }
        if let Err(reason) = identity.check(answer.node, answer.member) {
            send(conn, &Verdict::Refused { reason: reason.clone() }).await?;
            return Err(refused(reason));
        }
        let member = identity.own();
        let ours_proof = proof(secret, b"server", (&answer.challenge, &ours), node, member).finalize().into_bytes().to_vec();
        send(conn, &Verdict::Accepted { node, member, proof: ours_proof }).await?;
        let keys = FrameKeys::derive(secret, (&ours, &answer.challenge), false);
        Ok((answer.node, keys))
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "peer did not finish the handshake in time"))?
}

/// The connecting side: proves itself as `node` and checks that the
/// server is `target`, knows the secret, and is the member met before.
/// Returns this connection's frame keys.
pub(crate) async fn connect(
    conn: &mut Conn,
    secret: &[u8],
    (node, target): (NodeId, NodeId),
    identity: &Identity,
) -> io::Result<FrameKeys> {
    tokio::time::timeout(timeout(), async {
        let hello: Hello = recv(conn).await?;
        if hello.version != PROTOCOL_VERSION {
            return Err(refused(format!(
                "peer speaks cluster protocol {}, this node {PROTOCOL_VERSION}",
                hello.version
            )));
        }
        let ours = challenge();
        let member = identity.own();
        let our_proof = proof(secret, b"client", (&hello.challenge, &ours), node, member)
            .finalize()
            .into_bytes()
            .to_vec();
        send(
            conn,
            &Answer {
                version: PROTOCOL_VERSION,
                node,
                member,
                challenge: ours,
                proof: our_proof,
            },
        )
        .await?;
        match recv(conn).await? {
            Verdict::Refused { reason } => {
                Err(refused(format!("the peer refused this node: {reason}")))
            }
            Verdict::Accepted {
                node: theirs_node,
                member: theirs_member,
                proof: theirs,
            } => {
                proof(secret, b"server", (&ours, &hello.challenge), theirs_node, theirs_member)
                    .verify_slice(&theirs)
                    .map_err(|_| {
                        refused(
                            "the peer does not know the cluster secret: it is not a member of this cluster",
                        )
                    })?;
                if theirs_node != target {
                    return Err(refused(format!(
                        "the peer at this address is node {theirs_node}, not {target}: check cluster.peers"
                    )));
                }
                identity.check(target, theirs_member).map_err(refused)?;
                Ok(FrameKeys::derive(secret, (&hello.challenge, &ours), true))
            }
        }
    })
    .await
    .map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "peer did not finish the handshake in time",
        )
    })?
}

/// Decodes `bytes` as each handshake frame (for the fuzz target).
pub(crate) fn decode_untrusted(bytes: &[u8]) {
    let _ = postcard::from_bytes::<Hello>(bytes);
    let _ = postcard::from_bytes::<Answer>(bytes);
    let _ = postcard::from_bytes::<Verdict>(bytes);
}
