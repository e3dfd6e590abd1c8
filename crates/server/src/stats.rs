//! Broker-wide message counters that no queue sees: publishes received,
//! routed and dropped as unroutable. Reported by `/metrics` under
//! `rabbitmq_prometheus`'s `rabbitmq_global_*` names.

use std::sync::atomic::{AtomicU64, Ordering};

/// `basic.publish`es received (whole messages).
pub static MESSAGES_RECEIVED: AtomicU64 = AtomicU64::new(0);
/// Received messages that reached at least one queue.
pub static MESSAGES_ROUTED: AtomicU64 = AtomicU64::new(0);
/// Received messages that reached no queue and were not returned.
pub static MESSAGES_UNROUTABLE_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Received messages that reached no queue and were returned (mandatory).
pub static MESSAGES_UNROUTABLE_RETURNED: AtomicU64 = AtomicU64::new(0);

/// Counts one routed publish.
pub fn count_publish(queues: usize, mandatory: bool) {
    MESSAGES_RECEIVED.fetch_add(1, Ordering::Relaxed);
    let counter = match (queues > 0, mandatory) {
        (true, _) => &MESSAGES_ROUTED,
        (false, true) => &MESSAGES_UNROUTABLE_RETURNED,
        (false, false) => &MESSAGES_UNROUTABLE_DROPPED,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
