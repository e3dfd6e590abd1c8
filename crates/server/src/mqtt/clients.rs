//! One connection per client id and vhost, as MQTT requires: a CONNECT
//! with the id of a connected client takes the session over, and the
//! older connection is closed first (MQTT 3.1.1 §3.1.4, 5.0 §3.1.4,
//! reason code 0x8E in 5.0).
//!
//! Invariants:
//! - At most one connection holds a client id in a vhost once its
//!   CONNECT succeeded; a newer one waits (bounded by
//!   `MQTT_TAKEOVER_WAIT_MS`) for the older to let go, so the session's
//!   queues are never consumed by both.
//! - A connection lets go of its id only if it still holds it (a newer
//!   connection may have taken it already).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// What a connection holding a client id is told with.
struct Holder {
    connection_id: u64,
    /// Notified when a newer connection wants the id.
    taken_over: Arc<Notify>,
    /// Notified when the holder let go.
    released: Arc<Notify>,
}

/// The client ids connected now, per vhost.
#[derive(Default)]
pub struct Clients {
    held: Mutex<HashMap<(String, String), Holder>>,
    /// The QoS 2 state of kept sessions whose client is not connected:
    /// exactly once across a reconnect (in memory: a restart forgets it,
    /// docs/MQTT.md).
    kept_qos2: Mutex<HashMap<(String, String), Qos2State>>,
}

/// A session's QoS 2 packet ids in the middle of their exchange.
#[derive(Default)]
pub struct Qos2State {
    /// Received from the client, routed, PUBRECed, awaiting its PUBREL.
    pub awaiting_release: HashSet<u16>,
    /// Delivered to the client and PUBRECed by it, PUBRELed, awaiting
    /// its PUBCOMP.
    pub awaiting_comp: HashSet<u16>,
}

impl Qos2State {
    pub fn is_empty(&self) -> bool {
        self.awaiting_release.is_empty() && self.awaiting_comp.is_empty()
    }
}

/// A connection's hold on its client id; [`Clients::release`] gives it up.
pub struct Hold {
    pub taken_over: Arc<Notify>,
    released: Arc<Notify>,
}

impl Clients {
    /// Takes `client_id` in `vhost` for `connection_id`, asking its holder
    /// to close and waiting up to `wait` for it. `None` if the holder
    /// did not let go in time.
    pub async fn take(
        &self,
        vhost: &str,
        client_id: &str,
        connection_id: u64,
        wait: Duration,
    ) -> Option<Hold> {
        let key = (vhost.to_owned(), client_id.to_owned());
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let released = {
                let mut held = self.held.lock();
                match held.get(&key) {
                    None => {
                        let hold = Hold {
                            taken_over: Arc::new(Notify::new()),
                            released: Arc::new(Notify::new()),
                        };
                        held.insert(
                            key,
                            Holder {
                                connection_id,
                                taken_over: Arc::clone(&hold.taken_over),
                                released: Arc::clone(&hold.released),
                            },
                        );
                        return Some(hold);
                    }
                    Some(h) => {
                        h.taken_over.notify_one();
                        Arc::clone(&h.released)
                    }
                }
            };
            // `notify_one` keeps a permit, so a release between the lock
            // and this wait is not missed.
            if tokio::time::timeout_at(deadline, released.notified())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Gives up `client_id` if `connection_id` still holds it.
    pub fn release(&self, vhost: &str, client_id: &str, connection_id: u64, hold: &Hold) {
        let key = (vhost.to_owned(), client_id.to_owned());
        let mut held = self.held.lock();
        if held
            .get(&key)
            .is_some_and(|h| h.connection_id == connection_id)
        {
            held.remove(&key);
        }
        hold.released.notify_one();
    }

    /// The QoS 2 state of a kept session of `client_id` (empty for a
    /// new or clean session).
    pub fn take_qos2(&self, vhost: &str, client_id: &str) -> Qos2State {
        let key = (vhost.to_owned(), client_id.to_owned());
        self.kept_qos2.lock().remove(&key).unwrap_or_default()
    }

    /// Keeps a session's QoS 2 state for its next connection.
    pub fn keep_qos2(&self, vhost: &str, client_id: &str, state: Qos2State) {
        if state.is_empty() {
            return;
        }
        let key = (vhost.to_owned(), client_id.to_owned());
        self.kept_qos2.lock().insert(key, state);
    }

    /// Whether a connection holds `client_id` in `vhost` now.
    pub fn is_held(&self, vhost: &str, client_id: &str) -> bool {
        let key = (vhost.to_owned(), client_id.to_owned());
        self.held.lock().contains_key(&key)
    }

    /// Connected MQTT clients, for status and tests.
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_connect_takes_the_id_once_the_first_lets_go() {
        let clients = Arc::new(Clients::default());
        let first = clients
            .take("/", "c", 1, Duration::from_secs(1))
            .await
            .unwrap();
        let taken = Arc::clone(&first.taken_over);
        let c2 = Arc::clone(&clients);
        let second =
            tokio::spawn(async move { c2.take("/", "c", 2, Duration::from_secs(5)).await });
        taken.notified().await;
        clients.release("/", "c", 1, &first);
        let second = second.await.unwrap().expect("the id is free");
        assert_eq!(clients.len(), 1);
        clients.release("/", "c", 2, &second);
        assert!(clients.is_empty());
    }

    #[tokio::test]
    async fn a_holder_that_never_lets_go_makes_the_newer_connect_fail() {
        let clients = Clients::default();
        let _first = clients
            .take("/", "c", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(clients
            .take("/", "c", 2, Duration::from_millis(50))
            .await
            .is_none());
    }
}
