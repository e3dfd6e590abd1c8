//! The secret handshake, in the spirit of Erlang's cookie challenge: each
//! side sends a random challenge and answers the other's with an
//! HMAC-SHA256 keyed by the cluster secret, so a stranger can neither join
//! nor impersonate a node, and the secret never crosses the wire.
//!
//! Each side also names itself (node id, member id and cluster id, see
//! `identity`) inside its proof; each checks the other's cluster id
//! against its own (a member of another cluster sharing the secret is
//! refused) and its member id against the one it met before (a member
//! whose data directory was replaced is refused under its old name).
//!
//! ```text
//! server → client  Hello  { version, server_challenge }
//! client → server  Answer { version, node, member, cluster, client_challenge,
//!                           proof = HMAC(secret, "client" ‖ server_challenge ‖ client_challenge ‖ node ‖ member ‖ cluster) }
//! server → client  Verdict::Accepted { node, member, cluster,
//!                           proof = HMAC(secret, "server" ‖ client_challenge ‖ server_challenge ‖ node ‖ member ‖ cluster) }
//!                | Verdict::Refused { reason }
//! ```
//! (`cluster` is 0 in a proof while the member does not know its cluster.)

use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::{Conn, FrameKeys, PROTOCOL_VERSION};
use crate::identity::{ClusterId, Identity, MemberId};
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
    cluster: Option<ClusterId>,
    challenge: Challenge,
    proof: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
enum Verdict {
    Accepted {
        node: NodeId,
        member: MemberId,
        cluster: Option<ClusterId>,
        proof: Vec<u8>,
    },
    Refused {
        reason: String,
    },
}

/// Who a side says it is: node id, member id, cluster id.
type Names = (NodeId, MemberId, Option<ClusterId>);

fn proof(
    secret: &[u8],
    role: &[u8],
    (first, second): (&Challenge, &Challenge),
    (node, member, cluster): Names,
) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(role);
    mac.update(first);
    mac.update(second);
    mac.update(&node.to_le_bytes());
    mac.update(&member.to_le_bytes());
    mac.update(&cluster.unwrap_or(0).to_le_bytes());
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
        let claimed = proof(secret, b"client", (&ours, &answer.challenge), (answer.node, answer.member, answer.cluster));
        if claimed.verify_slice(&answer.proof).is_err() {
            let reason = "wrong cluster secret: every node needs the same cluster.secret_file contents".to_string();
            send(conn, &Verdict::Refused { reason: reason.clone() }).await?;
            return Err(refused(format!("node {} proved no knowledge of the secret ({reason})", answer.node)));
        }
        // The cluster first: a member of another cluster is not learned.
        if let Err(reason) = identity
            .check_cluster(answer.node, answer.cluster)
            .and_then(|()| identity.check(answer.node, answer.member))
        {
            send(conn, &Verdict::Refused { reason: reason.clone() }).await?;
            return Err(refused(reason));
        }
        let member = identity.own();
        let cluster = identity.cluster();
        let ours_proof = proof(secret, b"server", (&answer.challenge, &ours), (node, member, cluster)).finalize().into_bytes().to_vec();
        send(conn, &Verdict::Accepted { node, member, cluster, proof: ours_proof }).await?;
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
        let cluster = identity.cluster();
        let our_proof = proof(secret, b"client", (&hello.challenge, &ours), (node, member, cluster))
            .finalize()
            .into_bytes()
            .to_vec();
        send(
            conn,
            &Answer {
                version: PROTOCOL_VERSION,
                node,
                member,
                cluster,
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
                cluster: theirs_cluster,
                proof: theirs,
            } => {
                proof(secret, b"server", (&ours, &hello.challenge), (theirs_node, theirs_member, theirs_cluster))
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
                identity
                    .check_cluster(target, theirs_cluster)
                    .and_then(|()| identity.check(target, theirs_member))
                    .map_err(refused)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use berth_testdir::TestDir;

    const SECRET: &[u8] = b"a cluster secret of enough bytes";

    fn pipe() -> (Conn, Conn) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        (
            super::super::framed(Box::new(a)),
            super::super::framed(Box::new(b)),
        )
    }

    /// Before cluster ids, two members of different clusters that share
    /// the secret and had not met under these node ids proved each other
    /// and talked Raft.
    #[tokio::test]
    async fn members_of_two_clusters_refuse_each_other_and_learn_nothing() {
        let (da, db) = (TestDir::new("hs-cluster-a"), TestDir::new("hs-cluster-b"));
        let (ia, ib) = (
            Identity::open(da.path()).unwrap(),
            Identity::open(db.path()).unwrap(),
        );
        let (a_id, b_id) = (ia.found_cluster().unwrap(), ib.found_cluster().unwrap());
        let (mut server, mut client) = pipe();
        let (accepted, connected) = tokio::join!(
            accept(&mut server, SECRET, 1, &ia),
            connect(&mut client, SECRET, (2, 1), &ib)
        );
        let e = accepted.err().expect("the server refuses").to_string();
        assert!(
            e.contains(&format!("{a_id:032x}")) && e.contains(&format!("{b_id:032x}")),
            "{e}"
        );
        let e = connected.err().expect("the client is refused").to_string();
        assert!(e.contains("cluster.peers"), "{e}");
        assert!(!ia.knows(2), "a member of another cluster was learned");
        assert_eq!((ia.cluster(), ib.cluster()), (Some(a_id), Some(b_id)));
    }

    #[tokio::test]
    async fn a_member_that_knows_no_cluster_learns_it_from_either_side() {
        let (da, dn, dm) = (
            TestDir::new("hs-learn-a"),
            TestDir::new("hs-learn-n"),
            TestDir::new("hs-learn-m"),
        );
        let ia = Identity::open(da.path()).unwrap();
        let a_id = ia.found_cluster().unwrap();
        // The new member connects to one that knows.
        let new = Identity::open(dn.path()).unwrap();
        let (mut server, mut client) = pipe();
        let (accepted, connected) = tokio::join!(
            accept(&mut server, SECRET, 1, &ia),
            connect(&mut client, SECRET, (2, 1), &new)
        );
        accepted.unwrap();
        connected.unwrap();
        assert_eq!(new.cluster(), Some(a_id));
        // One that knows connects to the new member.
        let other = Identity::open(dm.path()).unwrap();
        let (mut server, mut client) = pipe();
        let (accepted, connected) = tokio::join!(
            accept(&mut server, SECRET, 3, &other),
            connect(&mut client, SECRET, (1, 3), &ia)
        );
        accepted.unwrap();
        connected.unwrap();
        assert_eq!(Identity::open(dm.path()).unwrap().cluster(), Some(a_id));
    }

    /// The cluster id is inside the proof: a verdict whose cluster id was
    /// changed on the way does not verify.
    #[test]
    fn the_proof_binds_the_cluster_id() {
        let (c1, c2) = (challenge(), challenge());
        let good = proof(SECRET, b"server", (&c1, &c2), (1, 7, Some(9)))
            .finalize()
            .into_bytes();
        assert!(proof(SECRET, b"server", (&c1, &c2), (1, 7, Some(10)))
            .verify_slice(&good)
            .is_err());
        assert!(proof(SECRET, b"server", (&c1, &c2), (1, 7, Some(9)))
            .verify_slice(&good)
            .is_ok());
    }
}
