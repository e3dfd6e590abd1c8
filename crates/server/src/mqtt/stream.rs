//! What carries an MQTT connection, whichever listener accepted it: its
//! read and write halves (TCP, TLS, or the pipe to a WebSocket's pump)
//! and what the accept loop learnt about it.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};

/// A connection's read half, whatever carries it.
pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's write half, whatever carries it.
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// What carries a connection, as the accept loop found it.
pub struct Link {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The connection id (from the counter every listener shares).
    pub id: u64,
    /// The user name of a verified TLS client certificate (MQTTS).
    pub cert_name: Option<String>,
    /// `mqtt`, `mqtts` or `mqtt-ws`.
    pub transport: &'static str,
}
