//! The live AMQP and MQTT connections, for the management API: who is connected,
//! from where, to which vhost, with which channels, and a handle to close
//! a connection from outside (`DELETE /api/connections/{name}`).
//!
//! Invariants:
//! - A connection is listed from its `connection.open-ok` until its
//!   cleanup; the entry is removed by the connection task itself.
//! - Closing through the registry never blocks: it records the reason and
//!   wakes the connection task, which sends `connection.close 320`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use berth_broker::channel::Channel;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// One open connection as the management API shows it.
pub struct ConnInfo {
    /// The server's connection id (also the exclusive-queue owner id).
    pub id: u64,
    /// RabbitMQ's connection name: `PEER -> LOCAL`.
    pub name: String,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub user: String,
    pub vhost: String,
    /// When `connection.open-ok` was sent, milliseconds since the epoch.
    pub connected_at_ms: u64,
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat_s: u64,
    /// The client's `client_properties`, as JSON.
    pub client_properties: serde_json::Value,
    /// `AMQP 0-9-1`, `MQTT 3.1.1` or `MQTT 5.0`, as RabbitMQ names them.
    pub protocol: &'static str,
    /// Over TLS.
    pub ssl: bool,
    /// Open channels by number.
    pub channels: Mutex<BTreeMap<u16, Arc<Channel>>>,
    /// Set by [`ConnInfo::close`]: the reason given to the client.
    close_reason: Mutex<Option<String>>,
    /// Wakes the connection task when a close is requested.
    pub close_requested: Notify,
}

impl ConnInfo {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        peer: SocketAddr,
        local: SocketAddr,
        user: String,
        vhost: String,
        frame_max: u32,
        channel_max: u16,
        heartbeat_s: u64,
        client_properties: serde_json::Value,
    ) -> Self {
        let connected_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            id,
            name: format!("{peer} -> {local}"),
            peer,
            local,
            user,
            vhost,
            connected_at_ms,
            frame_max,
            channel_max,
            heartbeat_s,
            client_properties,
            protocol: "AMQP 0-9-1",
            ssl: false,
            channels: Mutex::new(BTreeMap::new()),
            close_reason: Mutex::new(None),
            close_requested: Notify::new(),
        }
    }

    /// The same, with its protocol and whether it is TLS.
    pub fn with_protocol(mut self, protocol: &'static str, ssl: bool) -> Self {
        self.protocol = protocol;
        self.ssl = ssl;
        self
    }

    /// Asks the connection to close with 320 CONNECTION_FORCED and `reason`.
    pub fn close(&self, reason: String) {
        *self.close_reason.lock() = Some(reason);
        // notify_one keeps a permit if the task is not waiting right now.
        self.close_requested.notify_one();
    }

    /// The reason of a requested close, if one was requested.
    pub fn close_reason(&self) -> Option<String> {
        self.close_reason.lock().clone()
    }
}

/// Every live connection, by id.
#[derive(Default)]
pub struct Registry {
    conns: Mutex<HashMap<u64, Arc<ConnInfo>>>,
}

impl Registry {
    pub fn insert(&self, info: Arc<ConnInfo>) {
        self.conns.lock().insert(info.id, info);
    }

    pub fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// A snapshot, sorted by connection name.
    pub fn list(&self) -> Vec<Arc<ConnInfo>> {
        let mut all: Vec<_> = self.conns.lock().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<ConnInfo>> {
        self.conns.lock().values().find(|c| c.name == name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, port: u16) -> Arc<ConnInfo> {
        Arc::new(ConnInfo::new(
            id,
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from(([127, 0, 0, 1], 5672)),
            "guest".into(),
            "/".into(),
            131_072,
            2047,
            60,
            serde_json::Value::Null,
        ))
    }

    #[test]
    fn connections_are_found_by_rabbitmq_style_name_and_removed() {
        let r = Registry::default();
        r.insert(info(1, 40000));
        r.insert(info(2, 40001));
        let c = r
            .by_name("127.0.0.1:40001 -> 127.0.0.1:5672")
            .expect("listed");
        assert_eq!(c.id, 2);
        r.remove(2);
        assert!(r.by_name("127.0.0.1:40001 -> 127.0.0.1:5672").is_none());
        assert_eq!(r.list().len(), 1);
    }

    #[test]
    fn a_close_request_before_anyone_waits_is_not_lost() {
        let c = info(1, 40000);
        c.close("bye".into());
        assert_eq!(c.close_reason().as_deref(), Some("bye"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(1),
                c.close_requested.notified(),
            )
            .await
            .expect("the stored permit wakes the waiter");
        });
    }
}
