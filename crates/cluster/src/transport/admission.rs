//! Bounds on connections that have not yet proven the cluster secret (TLS
//! and secret handshakes, at most `HANDSHAKE_TIMEOUT_MS` each): per
//! address and in all, so a host that opens connections and never speaks
//! cannot hold a member's descriptors or memory, and cannot crowd out the
//! other addresses' handshakes.
//!
//! Invariants:
//! - At most [`PEER_HANDSHAKES_PER_ADDRESS_MAX`] handshakes run per remote
//!   address and [`PEER_HANDSHAKES_MAX`] in all; a connection over either
//!   bound is closed at once (its peer retries, as after any failure).
//! - A slot is given back when its handshake ends, however it ends (drop).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::limits::{PEER_HANDSHAKES_MAX, PEER_HANDSHAKES_PER_ADDRESS_MAX};

/// Handshakes running, by remote address.
#[derive(Default)]
pub(crate) struct Handshakes {
    running: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One running handshake's place; given back when dropped.
pub(crate) struct Slot {
    owner: Arc<Handshakes>,
    addr: IpAddr,
}

impl Handshakes {
    /// A place for a handshake from `addr`, or why there is none.
    pub(crate) fn take(self: &Arc<Self>, addr: IpAddr) -> Result<Slot, &'static str> {
        let mut r = self.running.lock();
        if r.0 >= PEER_HANDSHAKES_MAX {
            return Err("too many cluster handshakes running on this member");
        }
        let mine = r.1.entry(addr).or_default();
        if *mine >= PEER_HANDSHAKES_PER_ADDRESS_MAX {
            return Err("too many cluster handshakes running from this address");
        }
        *mine += 1;
        r.0 += 1;
        Ok(Slot {
            owner: Arc::clone(self),
            addr,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut r = self.owner.running.lock();
        r.0 -= 1;
        if let Some(n) = r.1.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                r.1.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_and_the_whole_have_a_bound() {
        let h = Arc::new(Handshakes::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut held: Vec<Slot> = (0..PEER_HANDSHAKES_PER_ADDRESS_MAX)
            .map(|_| h.take(a).unwrap())
            .collect();
        assert!(h.take(a).is_err(), "over the address's bound");
        held.pop();
        assert!(h.take(a).is_ok(), "a slot given back is free again");
        drop(held);
        let mut all = Vec::new();
        for i in 0..PEER_HANDSHAKES_MAX {
            let addr = IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8]);
            all.push(h.take(addr).unwrap());
        }
        assert!(
            h.take("10.9.9.9".parse().unwrap()).is_err(),
            "over the bound in all"
        );
        drop(all);
        assert!(h.running.lock().1.is_empty());
    }
}
