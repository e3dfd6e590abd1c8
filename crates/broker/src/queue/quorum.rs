//! What a quorum queue promises beyond a classic durable one, as RabbitMQ
//! documents it: every message it takes is written to the journal whatever
//! its delivery mode, and a message is delivered (or fetched) only once
//! that write is durable — committed on a majority of members' disks in a
//! cluster, fdatasynced on one node — so no consumer ever processes a
//! message that the next leader, or the next start, does not have.
//!
//! Invariants:
//! - A message waiting for its write ([`Commit::Awaiting`]) is never handed
//!   to a consumer or `basic.get`; it holds back the messages behind it
//!   (publish order is kept).
//! - A message whose write failed ([`Commit::Failed`]: its publisher was
//!   nacked) is dropped when it reaches the head, and its removal is
//!   journaled (after the failed write, so a write that did land after all
//!   is removed too).
//! - The completion that ends the wait runs the queue's dispatch again.
//! - A message's count of returns (nack or reject with requeue, its
//!   channel closed unacked) is journaled at each return (a retry mark,
//!   `durable/retry_mark.rs`), so `x-delivery-count` and the
//!   `x-delivery-limit` quota survive a restart and a failover, as they
//!   do in RabbitMQ's quorum queues.
//! - With a delivery limit, a delivery is counted as a return before it
//!   leaves (the same mark, written without waiting): a delivery still
//!   out when the leader dies (or the node stops) never comes back as a
//!   return, yet it counts, so a message that takes its consumer's member
//!   down with it cannot loop past the limit across failovers. A message
//!   restored past its limit is dead-lettered (`delivery_limit`) instead
//!   of delivered.

use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{delivery_limit, Effects, Queue, QueueState};
use crate::args::QueueType;
use crate::durable::Done;
use crate::message::{Commit, Message};
use crate::ready::{Body, Entry};

/// What the head of a quorum queue allows.
pub(super) enum Head {
    /// Deliverable.
    Ready(Entry),
    /// Its write is not durable yet: put back, deliver nothing now.
    Awaiting(Entry),
}

impl Queue {
    /// Puts a returned entry back in its place; in a quorum queue its
    /// count of returns is journaled first (a mark with no wait).
    pub(super) fn requeue_counted(&self, s: &mut QueueState, e: Entry, fx: &mut Effects) {
        if self.is_quorum() && !self.counts_deliveries() {
            self.mark_returns(s, &e, 0, fx);
        }
        // Else its delivery's mark already holds this count.
        s.ready.insert_by_seq(e);
    }

    /// Whether deliveries are counted as they leave (a quorum queue with
    /// a delivery limit), not as they come back.
    pub(super) fn counts_deliveries(&self) -> bool {
        self.is_quorum() && delivery_limit(&self.args()).is_some()
    }

    /// Before a delivery that expects an ack leaves a queue that
    /// [counts deliveries](Queue::counts_deliveries): journals its count
    /// of returns as if it came back (`returns` + 1).
    pub(super) fn mark_delivery(
        &self,
        s: &mut QueueState,
        stored: Option<u64>,
        returns: u32,
        fx: &mut Effects,
    ) {
        if self.counts_deliveries() {
            self.write_mark(s, stored, returns.saturating_add(1), 0, fx);
        }
    }

    /// Whether a message about to be delivered with `returns` already
    /// counted is over the queue's limit (restored from a delivery
    /// mark: its last delivery never came back).
    pub(super) fn over_limit(&self, returns: u32) -> bool {
        self.is_quorum() && delivery_limit(&self.args()).is_some_and(|l| u64::from(returns) > l)
    }

    /// A quorum queue (`x-queue-type: quorum`).
    pub fn is_quorum(&self) -> bool {
        self.declared_args.queue_type == QueueType::Quorum
    }

    /// Whether `msg` routed here is written to the journal: a persistent
    /// message to a durable queue, or any message to a quorum queue.
    pub(crate) fn stores(&self, msg: &Message) -> bool {
        self.store_id.is_some() && !self.is_stream() && (msg.persistent || self.is_quorum())
    }

    /// Sorts the head entry `e` of this queue by its write's state;
    /// `None`: its write failed, it is dropped (its removal is in `fx`).
    fn check_head(&self, e: Entry, fx: &mut Effects) -> Option<Head> {
        if !self.is_quorum() {
            return Some(Head::Ready(e));
        }
        let Body::Resident(m) = &e.body else {
            // Paged: read back from the journal, so written.
            return Some(Head::Ready(e));
        };
        match m.commit() {
            Commit::Committed => Some(Head::Ready(e)),
            Commit::Awaiting => Some(Head::Awaiting(e)),
            Commit::Failed => {
                fx.removed.extend(e.stored.get());
                None
            }
        }
    }
}

/// For a publish of `msg` whose journal write reaches the quorum queues
/// among `targets`: marks it awaiting its write, and wraps the write's
/// completion `done` (if any) so that it first releases the message and
/// runs those queues' dispatch. `None` if no quorum queue stores it.
pub(crate) fn release_on_commit(
    targets: &[Arc<Queue>],
    msg: &Arc<Message>,
    done: Option<Done>,
) -> Option<Done> {
    let waiting: Vec<Weak<Queue>> = targets
        .iter()
        .filter(|q| q.is_quorum() && q.stores(msg))
        .map(Arc::downgrade)
        .collect();
    if waiting.is_empty() {
        return done;
    }
    msg.await_commit();
    let msg = Arc::clone(msg);
    Some(Box::new(move |r| {
        msg.committed(r.is_ok());
        drop(msg);
        let now = Instant::now();
        for q in waiting.iter().filter_map(Weak::upgrade) {
            q.kick(now);
        }
        if let Some(done) = done {
            done(r);
        }
    }))
}

/// The head of `s`'s ready messages, skipping those whose write failed.
pub(super) fn next_head(q: &Queue, s: &mut QueueState, fx: &mut Effects) -> Option<Head> {
    loop {
        let e = s.ready.pop_front()?;
        if let Some(h) = q.check_head(e, fx) {
            return Some(h);
        }
    }
}
