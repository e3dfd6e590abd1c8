//! A client's CONNECT, up to its CONNACK: the first packet read (bounded
//! in time by `net.handshake_timeout_ms` and in size by
//! `MQTT_CONNECT_BYTES_MAX`), what of it berth refuses (with the reason
//! code of the client's protocol version), the login, the client id and
//! the session's lifetime.
//!
//! Invariants:
//! - Nothing of the broker changes before the login succeeded.
//! - Every refusal is answered with a CONNACK that says why (3.1.1 return
//!   codes are the codec's mapping of the 5.0 reason codes) and logged.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use mqtt5_protocol::packet::connack::ConnAckPacket;
use mqtt5_protocol::packet::connect::ConnectPacket;
use mqtt5_protocol::{Packet, ReasonCode};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::codec;
use super::session::Lifetime;
use super::topic;
use crate::limits;

/// What ended the CONNECT phase without a session.
pub enum Refused {
    /// Answer with a CONNACK of this reason, then close.
    Connack(ReasonCode, String),
    /// Close without a word (not MQTT, or nothing came).
    Close(String),
}

/// Reads the first packet, which must be a CONNECT.
pub async fn read_connect(
    rd: &mut (impl AsyncRead + Unpin),
    rbuf: &mut BytesMut,
    timeout: Duration,
) -> Result<Box<ConnectPacket>, Refused> {
    let read = async {
        loop {
            match codec::decode(rbuf, 4, limits::MQTT_CONNECT_BYTES_MAX) {
                Ok(Some(Packet::Connect(c))) => return Ok(c),
                Ok(Some(other)) => {
                    return Err(Refused::Close(format!(
                        "first packet is a {}, not a CONNECT",
                        other.packet_type_name()
                    )))
                }
                Ok(None) => {}
                Err(e) => return Err(Refused::Close(format!("bad CONNECT: {e}"))),
            }
            rbuf.reserve(4096);
            match rd.read_buf(rbuf).await {
                Ok(0) => return Err(Refused::Close("closed before CONNECT".into())),
                Ok(_) => {}
                Err(e) => return Err(Refused::Close(format!("read failed: {e}"))),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(Refused::Close(format!("no CONNECT within {timeout:?}"))),
    }
}

/// The CONNACK of a refusal, in the client's version.
pub fn connack_refusal(version: u8, reason: ReasonCode, out: &mut BytesMut) {
    let ack = if version == 5 {
        ConnAckPacket::new(false, reason)
    } else {
        ConnAckPacket::new_v311(false, reason)
    };
    if let Err(e) = codec::encode(&ack, out) {
        tracing::error!(error = %e, "could not encode a CONNACK");
    }
}

/// What berth refuses in a CONNECT before the login: the protocol
/// version, an authentication method (v5 enhanced auth), a will whose
/// topic is not a topic name, a client id too long for a queue name or
/// empty on a 3.1.1 persistent session.
pub fn check(c: &ConnectPacket) -> Result<(), Refused> {
    let refuse = |code, why: &str| Err(Refused::Connack(code, why.to_owned()));
    if c.protocol_version != 4 && c.protocol_version != 5 {
        return refuse(
            ReasonCode::UnsupportedProtocolVersion,
            "protocol level is not 4 (3.1.1) or 5",
        );
    }
    if c.properties.get_authentication_method().is_some() {
        return refuse(
            ReasonCode::BadAuthenticationMethod,
            "enhanced authentication (AUTH) is not supported",
        );
    }
    if c.client_id.len() > limits::MQTT_CLIENT_ID_BYTES_MAX {
        return refuse(
            ReasonCode::ClientIdentifierNotValid,
            "client id longer than MQTT_CLIENT_ID_BYTES_MAX",
        );
    }
    if c.client_id.is_empty() && !c.clean_start && c.protocol_version == 4 {
        return refuse(
            ReasonCode::ClientIdentifierNotValid,
            "an empty client id needs clean session = 1",
        );
    }
    if let Some(w) = &c.will {
        if topic::routing_key(&w.topic).is_err() {
            return refuse(
                ReasonCode::TopicNameInvalid,
                "will topic is not a topic name",
            );
        }
    }
    Ok(())
}

/// How long the session lives: 3.1.1 `clean session`, 5.0 session expiry.
pub fn lifetime(c: &ConnectPacket) -> Lifetime {
    if c.protocol_version == 4 {
        return if c.clean_start {
            Lifetime::Connection
        } else {
            Lifetime::Forever
        };
    }
    match c.properties.get_session_expiry_interval().unwrap_or(0) {
        0 => Lifetime::Connection,
        u32::MAX => Lifetime::Forever,
        s => Lifetime::ExpiresMs(u64::from(s) * 1000),
    }
}

/// A client id for a client that sent none (clean sessions only).
pub fn assigned_client_id(connection_id: u64, peer: SocketAddr) -> String {
    format!("berth-{connection_id}-{}", peer.port())
}

/// The CONNACK of an accepted CONNECT: what the server supports, so a
/// v5 client does not send what would be refused.
pub fn connack_accepted(
    version: u8,
    session_present: bool,
    assigned_client_id: Option<String>,
    packet_bytes_max: usize,
) -> ConnAckPacket {
    if version != 5 {
        return ConnAckPacket::new_v311(session_present, ReasonCode::Success);
    }
    let mut ack = ConnAckPacket::new(session_present, ReasonCode::Success)
        .with_retain_available(true)
        .with_shared_subscription_available(false)
        .with_subscription_identifier_available(false)
        .with_wildcard_subscription_available(true)
        .with_receive_maximum(limits::MQTT_PUBLISHES_UNACKED_MAX)
        .with_topic_alias_maximum(limits::MQTT_TOPIC_ALIASES_MAX)
        .with_maximum_packet_size(u32::try_from(packet_bytes_max).unwrap_or(u32::MAX));
    if let Some(id) = assigned_client_id {
        ack = ack.with_assigned_client_id(id);
    }
    ack
}
