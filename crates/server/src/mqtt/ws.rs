//! MQTT over WebSocket (`net.mqtt_ws_listen`), as RabbitMQ's Web MQTT
//! plugin serves it for browsers: an HTTP upgrade on [`PATH`] with the
//! subprotocol `mqtt`, then MQTT packets in binary messages (MQTT 3.1.1
//! §6, 5.0 §6: a message may hold part of a packet or several). The
//! upgrade and the frames are `tokio-tungstenite`'s; a pump task turns
//! the messages into the byte stream the MQTT connection reads, and its
//! output into binary messages, so the connection code does not know it
//! is behind a WebSocket.
//!
//! Invariants:
//! - The upgrade is bounded by `net.handshake_timeout_ms`; a message or
//!   frame is bounded as an MQTT packet is (`limits.message_size_bytes_max`
//!   plus `MQTT_PACKET_HEADERS_BYTES_MAX`), and the pipe to the
//!   connection by `WS_PIPE_BYTES`: a client that floods waits for the
//!   connection to read, as on TCP.
//! - A text message is refused (MQTT §6: binary only): the connection
//!   ends.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::stream::{Reader, Writer};
use crate::limits;
use crate::state::Shared;

/// The path MQTT is served on, RabbitMQ's Web MQTT default.
pub const PATH: &str = "/ws";

/// The subprotocols accepted, in order of preference (`mqttv3.1` is what
/// some older browser clients offer).
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Bytes in flight each way between the pump and the connection.
const WS_PIPE_BYTES: usize = 64 * 1024;

/// The subprotocol to answer with, from a `Sec-WebSocket-Protocol`
/// request header's values; `Err` if some were offered and none is MQTT.
fn pick_subprotocol<'a>(
    offered: impl Iterator<Item = &'a str>,
) -> Result<Option<&'static str>, ()> {
    let offered: Vec<&str> = offered.flat_map(|v| v.split(',')).map(str::trim).collect();
    if offered.is_empty() {
        return Ok(None);
    }
    SUBPROTOCOLS
        .iter()
        .find(|p| offered.contains(p))
        .map(|p| Some(*p))
        .ok_or(())
}

fn refusal(status: StatusCode, why: &str) -> ErrorResponse {
    let mut r = ErrorResponse::new(Some(why.to_owned()));
    *r.status_mut() = status;
    r
}

/// Upgrades `stream` to a WebSocket carrying MQTT; `None` if the client
/// did not ask for it properly or in time (logged).
pub async fn upgrade(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> Option<(Reader, Writer)> {
    let bounds = Bounds {
        message_bytes_max: usize::try_from(shared.config.limits.message_size_bytes_max)
            .unwrap_or(usize::MAX),
        timeout: Duration::from_millis(shared.config.net.handshake_timeout_ms),
    };
    upgrade_within(stream, peer, bounds).await
}

/// What bounds an upgrade: the largest message it may carry, and the
/// time it may take.
#[derive(Clone, Copy)]
pub struct Bounds {
    pub message_bytes_max: usize,
    pub timeout: Duration,
}

/// [`upgrade`] without the broker (a cluster follower has none).
pub async fn upgrade_within(
    stream: TcpStream,
    peer: SocketAddr,
    bounds: Bounds,
) -> Option<(Reader, Writer)> {
    let max = bounds
        .message_bytes_max
        .saturating_add(limits::MQTT_PACKET_HEADERS_BYTES_MAX);
    let timeout = bounds.timeout;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    // The callback's type is tungstenite's (`Callback`): its error is the
    // HTTP answer itself, large or not.
    #[allow(clippy::result_large_err)]
    let check = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != PATH {
            return Err(refusal(StatusCode::NOT_FOUND, "MQTT is served on /ws"));
        }
        let offered = req
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|v| v.to_str().ok());
        match pick_subprotocol(offered) {
            Ok(None) => {}
            Ok(Some(p)) => {
                resp.headers_mut()
                    .insert("sec-websocket-protocol", HeaderValue::from_static(p));
            }
            Err(()) => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    "subprotocol mqtt not offered",
                ));
            }
        }
        Ok(resp)
    };
    let upgrading = tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(config));
    let ws = match tokio::time::timeout(timeout, upgrading).await {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "MQTT WebSocket upgrade refused");
            return None;
        }
        Err(_) => {
            tracing::info!(%peer, "MQTT WebSocket upgrade not done within {timeout:?}");
            return None;
        }
    };
    let (connection_side, pump_side) = tokio::io::duplex(WS_PIPE_BYTES);
    tokio::spawn(pump(ws, pump_side, peer));
    let (rd, wr) = tokio::io::split(connection_side);
    Some((Box::new(rd), Box::new(wr)))
}

/// Carries bytes between the WebSocket and the connection's pipe until
/// either side ends; once the client's side ended, the connection's last
/// packets get `CLOSE_TIMEOUT_MS` to go out.
async fn pump(ws: WebSocketStream<TcpStream>, pipe: DuplexStream, peer: SocketAddr) {
    let (mut sink, mut messages) = ws.split();
    let (mut from_connection, mut to_connection) = tokio::io::split(pipe);
    let inbound = async {
        while let Some(m) = messages.next().await {
            match m {
                Ok(Message::Binary(b)) => {
                    if to_connection.write_all(&b).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Close(_)) => break,
                Ok(Message::Text(_)) => {
                    tracing::info!(%peer, "MQTT WebSocket closed: a text message (MQTT is sent in binary messages)");
                    break;
                }
                // Pings are answered by tungstenite itself.
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "MQTT WebSocket read failed");
                    break;
                }
            }
        }
        let _connection_may_be_gone = to_connection.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; WS_PIPE_BYTES];
        loop {
            match from_connection.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let m = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
                    if sink.send(m).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _peer_may_be_gone = sink.close().await;
    };
    tokio::pin!(outbound);
    tokio::select! {
        () = inbound => {
            let wait = Duration::from_millis(limits::CLOSE_TIMEOUT_MS);
            let _done_or_given_up = tokio::time::timeout(wait, &mut outbound).await;
        }
        () = &mut outbound => {}
    }
}

#[cfg(test)]
mod tests {
    use super::pick_subprotocol;

    #[test]
    fn mqtt_is_picked_among_the_offered_subprotocols() {
        assert_eq!(pick_subprotocol(["mqtt"].into_iter()), Ok(Some("mqtt")));
        assert_eq!(
            pick_subprotocol(["chat, mqttv3.1"].into_iter()),
            Ok(Some("mqttv3.1"))
        );
        assert_eq!(pick_subprotocol([].into_iter()), Ok(None));
        assert_eq!(pick_subprotocol(["chat"].into_iter()), Err(()));
    }
}
