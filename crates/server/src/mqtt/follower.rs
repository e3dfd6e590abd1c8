//! A cluster follower's MQTT listeners (plain, TLS and WebSocket alike,
//! after the TLS handshake or WebSocket upgrade): it holds no broker, so every
//! client is answered its CONNECT with a CONNACK "server unavailable"
//! (3.1.1 return code 3, v5 reason 0x88), and a client with several
//! servers moves on to the next (the leader serves). Before, a follower
//! bound the port and never accepted: clients waited in the listen
//! backlog until their own timeout.
//!
//! Invariants:
//! - Each exchange is bounded by `net.handshake_timeout_ms` and costs only
//!   its own task; a follower reads nothing but one CONNECT.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mqtt5_protocol::ReasonCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::connect;
use super::stream::{Reader, Writer};
use crate::cluster::view::ClusterView;

/// What a follower's listener does before MQTT starts.
#[derive(Clone)]
pub enum Over {
    Plain,
    Tls(tokio_rustls::TlsAcceptor),
    WebSocket(super::ws::Bounds),
}

/// Turns away every client on `listener` until the task is aborted.
pub async fn turn_away(
    listener: TcpListener,
    over: Over,
    view: Arc<ClusterView>,
    timeout: Duration,
) {
    let kind = match over {
        Over::Plain => "mqtt",
        Over::Tls(_) => "mqtts",
        Over::WebSocket(_) => "mqtt-ws",
    };
    loop {
        let (stream, peer) = crate::listen::accept(&listener, kind).await;
        let why = view.not_leader_text(|s| format!("amqp {}", s.amqp));
        let over = over.clone();
        tokio::spawn(async move {
            let (mut rd, mut wr): (Reader, Writer) = match over {
                Over::Plain => {
                    let (rd, wr) = stream.into_split();
                    (Box::new(rd), Box::new(wr))
                }
                Over::Tls(acceptor) => {
                    let Ok(Ok(tls)) = tokio::time::timeout(timeout, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    let (rd, wr) = tokio::io::split(tls);
                    (Box::new(rd), Box::new(wr))
                }
                Over::WebSocket(bounds) => {
                    let Some(pair) = super::ws::upgrade_within(stream, peer, bounds).await else {
                        return;
                    };
                    pair
                }
            };
            let mut buf = BytesMut::with_capacity(1024);
            let Ok(c) = connect::read_connect(&mut rd, &mut buf, timeout).await else {
                return;
            };
            let mut out = BytesMut::new();
            connect::connack_refusal(c.protocol_version, ReasonCode::ServerUnavailable, &mut out);
            let _client_may_be_gone = wr.write_all(&out).await;
            let _client_may_be_gone = wr.flush().await;
            tracing::debug!(%peer, "an MQTT client was turned away: {why}");
        });
    }
}
