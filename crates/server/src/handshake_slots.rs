//! The TLS handshake slots of an HTTPS listener: at most
//! [`limits::HTTPS_HANDSHAKES_MAX`] handshakes at once, and at most
//! [`limits::HTTPS_HANDSHAKES_PER_ADDRESS_MAX`] of them from one source
//! address (an IPv4 address or an IPv6 /64, as [`crate::throttle`] counts
//! them), so sockets from one address that never send a `ClientHello`
//! cannot hold every slot until they time out.
//!
//! Invariants:
//! - A [`Slot`] holds one place in the total and one in its address's
//!   count, and gives both back when dropped.
//! - The per-address counts hold only addresses with a handshake running,
//!   so there are at most `HTTPS_HANDSHAKES_MAX` of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::limits;
use crate::throttle::address_key;

/// The slots of one listener.
pub struct HandshakeSlots {
    total: Arc<Semaphore>,
    per_address: Arc<Mutex<HashMap<u128, usize>>>,
    per_address_max: usize,
}

/// One running handshake's place.
pub struct Slot {
    _total: OwnedSemaphorePermit,
    key: u128,
    per_address: Arc<Mutex<HashMap<u128, usize>>>,
}

impl Default for HandshakeSlots {
    fn default() -> Self {
        Self::new(
            limits::HTTPS_HANDSHAKES_MAX,
            limits::HTTPS_HANDSHAKES_PER_ADDRESS_MAX,
        )
    }
}

impl HandshakeSlots {
    pub fn new(total: usize, per_address_max: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            per_address: Arc::default(),
            per_address_max,
        }
    }

    /// Waits for a free place in the total (the accept loop waits here,
    /// before accepting, so the kernel's backlog holds the rest);
    /// `None` once the slots are closed.
    pub async fn free(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.total).acquire_owned().await.ok()
    }

    /// Takes the place of a connection from `ip` with a place in the total;
    /// `None` when its address has its share running already (the caller
    /// closes the connection).
    pub fn take(&self, total: OwnedSemaphorePermit, ip: IpAddr) -> Option<Slot> {
        let key = address_key(ip);
        let mut counts = self.per_address.lock();
        let n = counts.entry(key).or_insert(0);
        if *n >= self.per_address_max {
            return None;
        }
        *n += 1;
        Some(Slot {
            _total: total,
            key,
            per_address: Arc::clone(&self.per_address),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.per_address.lock();
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HandshakeSlots;

    #[tokio::test]
    async fn one_address_gets_its_share_and_another_still_gets_in() {
        let slots = HandshakeSlots::new(8, 3);
        let a = "127.0.0.1".parse().unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            let total = slots.free().await.unwrap();
            held.push(slots.take(total, a).expect("within the share"));
        }
        let total = slots.free().await.unwrap();
        assert!(slots.take(total, a).is_none(), "a 4th from one address");
        // The refused one gave its place in the total back.
        assert_eq!(slots.total.available_permits(), 5);
        let total = slots.free().await.unwrap();
        let other = slots.take(total, "127.0.0.2".parse().unwrap());
        assert!(other.is_some());
        // A finished handshake frees its address's place.
        held.pop();
        let total = slots.free().await.unwrap();
        let again = slots.take(total, a);
        assert!(again.is_some());
        drop(held);
        drop(other);
        assert_eq!(
            slots.per_address.lock().len(),
            1,
            "only the last slot's address"
        );
        drop(again);
        assert!(slots.per_address.lock().is_empty());
        assert_eq!(slots.total.available_permits(), 8);
    }
}
