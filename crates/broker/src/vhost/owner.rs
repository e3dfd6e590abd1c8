//! What a vhost is to the rest of the broker: the names routing resolves
//! and the owner its queues hand dead letters and deletions back to.

use std::sync::Arc;
use std::time::Instant;

use super::VHost;
use crate::dead_letter::DeadLetter;
use crate::durable::Done;
use crate::events::Origin;
use crate::exchange::Exchange;
use crate::queue::{Queue, QueueOwner};
use crate::routing::Names;

impl Names for VHost {
    fn exchange(&self, name: &str) -> Option<Arc<Exchange>> {
        self.exchanges.read().get(name).cloned()
    }

    fn queue(&self, name: &str) -> Option<Arc<Queue>> {
        self.find_queue(name)
    }
}

impl QueueOwner for VHost {
    /// Republishes dead letters through the queue's dead-letter exchange.
    /// Until its copy is stored somewhere, a stored message stays stored in
    /// `from`: its removal is deferred to that moment or, when no durable
    /// copy is made, journaled now.
    fn dead_letter(&self, from: &Queue, letters: Vec<DeadLetter>, now: Instant, origin: &Origin) {
        for mut d in letters {
            let Some((id, qid)) = d.stored.zip(from.store_id) else {
                self.republish(from, &d, now, None, origin);
                continue;
            };
            let done = d.done.take();
            let mut removal = Some(self.dur.defer_removal(qid, id, done));
            let mut make = || -> Done {
                removal
                    .take()
                    .expect("a message is journaled once per publish")
            };
            self.republish(from, &d, now, Some(&mut make), origin);
            if let Some(now_done) = removal.take() {
                // No durable copy was made: nothing to wait for.
                now_done(Ok(()));
            }
        }
        // One Remove per queue for every removal now due (this batch's and
        // earlier ones'), not one per letter: a mass expiry stays batched.
        self.dur.flush_removals();
    }

    fn delete_queue(&self, name: &str) {
        // Auto-delete and x-expires: no client waits, so the error is
        // logged, and the queue stays.
        if let Err(e) = self.remove_queue(name) {
            tracing::error!(vhost = %self.name, queue = name, error = %e, "could not delete a queue durably");
        }
    }
}
