//! An MQTT connection in the management API's list of connections
//! (`/api/connections`, `berth connections list`), as RabbitMQ's MQTT
//! plugin shows one: protocol `MQTT 3.1.1` or `MQTT 5.0`, its user and
//! vhost, one channel (the session's), the keepalive as its timeout, the
//! client id among its client properties; `DELETE` closes it (v5:
//! DISCONNECT 0x98 administrative action).
//!
//! Invariants:
//! - Listed from its CONNACK until the connection task ends it
//!   (`Conn::finish` removes it).

use std::sync::Arc;

use mqtt5_protocol::packet::connect::ConnectPacket;
use serde_json::json;

use super::session::Session;
use super::stream::Link;
use crate::registry::ConnInfo;
use crate::state::Shared;

/// Lists the connection; the caller keeps the entry and removes it.
pub fn register(
    shared: &Shared,
    link: &Link,
    session: &Session,
    connect: &ConnectPacket,
) -> Arc<ConnInfo> {
    let protocol = if connect.protocol_version == 5 {
        "MQTT 5.0"
    } else {
        "MQTT 3.1.1"
    };
    let info = ConnInfo::new(
        link.id,
        link.peer,
        link.local,
        session.ch.session.user.to_string(),
        session.vhost.name.clone(),
        0,
        1,
        u64::from(connect.keep_alive),
        json!({
            "client_id": session.client_id(),
            "transport": link.transport,
            "clean_session": connect.clean_start,
        }),
    )
    .with_protocol(protocol, link.transport == "mqtts");
    let info = Arc::new(info);
    info.channels
        .lock()
        .insert(session.ch.id, Arc::clone(&session.ch));
    shared.registry.insert(Arc::clone(&info));
    info
}
