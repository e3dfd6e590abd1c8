//! The whole broker: its vhosts, the timer service and the journal they
//! share, and the clock every "now" comes from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::durable::{Durability, Journal, NoJournal};
use crate::timers::Timers;
use crate::vhost::VHost;

/// The whole broker.
pub struct Broker {
    pub(crate) vhosts: HashMap<String, Arc<VHost>>,
    timers: Arc<Timers>,
    dur: Arc<Durability>,
    clock: Arc<dyn Clock>,
}

impl Broker {
    /// A broker with the given vhosts (at least `/` in the default setup)
    /// that keeps everything in memory.
    pub fn new<'a>(vhosts: impl IntoIterator<Item = &'a str>) -> Arc<Self> {
        Self::with_journal(vhosts, Arc::new(NoJournal), 1, 1)
    }

    /// A broker whose durable entities and persistent messages go to
    /// `journal`; ids continue from the given values (one past the largest
    /// recovered).
    pub fn with_journal<'a>(
        vhosts: impl IntoIterator<Item = &'a str>,
        journal: Arc<dyn Journal>,
        next_msg_id: u64,
        next_queue_id: u64,
    ) -> Arc<Self> {
        let dur = Durability::new(journal, next_msg_id, next_queue_id);
        Self::with_parts(vhosts, dur, Arc::new(SystemClock))
    }

    /// A broker over the given journal and clock (tests inject a
    /// [`crate::clock::ManualClock`]).
    pub fn with_parts<'a>(
        vhosts: impl IntoIterator<Item = &'a str>,
        dur: Durability,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let timers = Arc::new(Timers::default());
        let dur = Arc::new(dur);
        let vhosts = vhosts
            .into_iter()
            .map(|n| {
                let v = VHost::new(n, Arc::clone(&timers), Arc::clone(&dur), Arc::clone(&clock));
                (n.to_owned(), v)
            })
            .collect();
        Arc::new(Self {
            vhosts,
            timers,
            dur,
            clock,
        })
    }

    /// Now, by the broker's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Ready messages per queue kept in memory; bodies of stored messages
    /// beyond it are read back from the journal when needed.
    pub fn set_resident_messages_max(&self, n: usize) {
        self.dur.set_resident_messages_max(n);
    }

    /// How many queues, exchanges, bindings and consumers clients may make
    /// (every vhost).
    pub fn set_count_limits(&self, l: crate::limits::CountLimits) {
        for v in self.vhosts.values() {
            v.set_count_limits(l);
        }
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.get(name).cloned()
    }

    pub fn vhosts(&self) -> impl Iterator<Item = &Arc<VHost>> {
        self.vhosts.values()
    }

    /// Runs due timers (TTL expiry, `x-expires`); the server calls this
    /// periodically.
    pub fn run_timers(&self, now: Instant) {
        self.dur.flush_removals();
        self.timers.run_due(now);
    }

    /// Journals removals that were waiting for other writes to be durable
    /// (dead-lettered messages whose copies are now stored). The server
    /// calls this before it closes the journal at shutdown; the timers do
    /// it on every tick.
    pub fn flush_removals(&self) {
        self.dur.flush_removals();
    }

    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }
}
