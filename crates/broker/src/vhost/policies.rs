//! A vhost's policies in force: a new set replaces the old one whole and is
//! re-applied to every queue and exchange; a new queue or exchange gets the
//! set as it is when it is declared (or restored).
//!
//! Invariants:
//! - The set is replaced, never edited in place, and the broker serialises
//!   replacements. A new queue gets the set before it is put in the map (so
//!   no message reaches it without its policy) and again after (so a
//!   replacement that iterated the map before it was there is not missed);
//!   a new exchange gets it under the exchanges' write lock, which a
//!   replacement's iteration waits for.

use std::sync::Arc;
use std::time::Instant;

use super::VHost;
use crate::exchange::Exchange;
use crate::policy::VhostPolicies;
use crate::queue::Queue;

impl VHost {
    /// The policies and operator policies of this vhost.
    pub fn policies(&self) -> Arc<VhostPolicies> {
        Arc::clone(&self.policies.read())
    }

    /// Puts a new set in force on every queue and exchange.
    pub fn set_policies(&self, set: VhostPolicies, now: Instant) {
        *self.policies.write() = Arc::new(set);
        for q in self.queues() {
            self.apply_policies_to_queue(&q, now);
        }
        for e in self.exchanges() {
            self.apply_policies_to_exchange(&e);
        }
    }

    pub(super) fn apply_policies_to_queue(&self, q: &Arc<Queue>, now: Instant) {
        let applied = self.policies.read().for_queue(&q.name);
        q.set_policies(applied, now);
    }

    pub(super) fn apply_policies_to_exchange(&self, e: &Exchange) {
        let applied = self.policies.read().for_exchange(&e.name);
        e.set_policies(applied);
    }
}
