//! A cluster follower's stream listener: it holds no broker, so every
//! client is answered its first request with that request's response
//! code "stream not available" (0x06) and a Close saying which member
//! leads; a client with several addresses moves on (the leader serves).
//!
//! Invariants:
//! - Each exchange is bounded by `net.handshake_timeout_ms` and costs
//!   only its own task; a follower reads at most one initial frame.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::frame::{self, code, key};
use crate::cluster::view::ClusterView;
use crate::limits::STREAM_PROTO_INITIAL_FRAME_BYTES_MAX;

/// Turns away every client on `listener` until the task is aborted.
pub async fn turn_away(listener: TcpListener, view: Arc<ClusterView>, timeout: Duration) {
    loop {
        let (mut stream, peer) = crate::listen::accept(&listener, "stream").await;
        let why = view.not_leader_text(|s| format!("amqp {}", s.amqp));
        tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(4096);
            let read = async {
                loop {
                    match frame::check(&buf, STREAM_PROTO_INITIAL_FRAME_BYTES_MAX) {
                        Ok(Some(n)) => return Some(buf.split_to(n).freeze()),
                        Ok(None) => {}
                        Err(_) => return None,
                    }
                    match stream.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return None,
                        Ok(_) => {}
                    }
                }
            };
            let Ok(Some(first)) = tokio::time::timeout(timeout, read).await else {
                return;
            };
            let mut out = BytesMut::new();
            // Key and correlation id of a request (PeerProperties first).
            if first.len() >= 12 {
                let k = u16::from_be_bytes([first[4], first[5]]);
                let corr = u32::from_be_bytes([first[8], first[9], first[10], first[11]]);
                if k & key::RESPONSE == 0 && k != key::HEARTBEAT {
                    frame::put_response(&mut out, k, corr, code::STREAM_NOT_AVAILABLE);
                }
            }
            frame::put_close(&mut out, 1, code::STREAM_NOT_AVAILABLE, &why);
            let _client_may_be_gone = stream.write_all(&out).await;
            tracing::debug!(%peer, "a stream client was turned away: {why}");
        });
    }
}
