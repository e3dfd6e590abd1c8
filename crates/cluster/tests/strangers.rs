//! A host that opens cluster connections and never speaks holds at most a
//! few handshake slots of a member: the rest of its connections are
//! closed at once, and the members keep committing.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

mod common;
use common::{commands, Cluster};

const STRANGER_CONNECTIONS: usize = 100;

async fn from_stranger(to: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    socket.connect(to.parse().unwrap()).await.unwrap()
}

/// Whether the member closed `s` (EOF or reset) before `deadline`.
async fn closed(s: &mut TcpStream, deadline: tokio::time::Instant) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {} // the handshake's hello: keep reading
        }
    }
}

/// Unauthenticated connections were unbounded: each of these was held
/// open for the whole handshake timeout (3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_strangers_are_bounded_per_address() {
    let cluster = Cluster::start("strangers", &BTreeMap::new(), &BTreeMap::new()).await;
    let leader = cluster.leader().await;
    let target = cluster.members[&1].clone();
    let mut held = Vec::new();
    for _ in 0..STRANGER_CONNECTIONS {
        held.push(from_stranger(&target).await);
    }
    // Well within the handshake timeout (3 s), which closes them all.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1_000);
    let mut closed_at_once = 0;
    for s in &mut held {
        if closed(s, deadline).await {
            closed_at_once += 1;
        }
    }
    assert!(
        closed_at_once >= STRANGER_CONNECTIONS - 8,
        "only {closed_at_once} of {STRANGER_CONNECTIONS} silent connections were closed at once"
    );
    cluster.propose_all(leader, 0, 20).await;
    cluster.agree(&commands(20)).await;
    drop(held);
    cluster.stop().await;
}
