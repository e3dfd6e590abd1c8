//! The whole broker: its vhosts (created and deleted at runtime), users
//! and permissions, the timer service and the journal they share, and the
//! clock every "now" comes from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::access::{Access, AccessError};
use crate::clock::{Clock, SystemClock};
use crate::durable::{Durability, Journal, NoJournal};
use crate::meta::MetaCommand;
use crate::timers::Timers;
use crate::vhost::VHost;

mod meta;
mod policies;

pub(crate) use meta::decode_stored;

/// The whole broker.
pub struct Broker {
    /// Written only when a vhost is added or deleted; connections read it.
    pub(crate) vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    /// Serialises vhost additions and deletions with their journal writes.
    vhost_changes: Mutex<()>,
    access: Access,
    timers: Arc<Timers>,
    dur: Arc<Durability>,
    clock: Arc<dyn Clock>,
    /// What clients may create in each vhost, applied to vhosts created
    /// later too.
    count_limits: RwLock<crate::limits::CountLimits>,
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
            vhosts: RwLock::new(vhosts),
            vhost_changes: Mutex::new(()),
            access: Access::new(Arc::clone(&dur.journal)),
            timers,
            dur,
            clock,
            count_limits: RwLock::new(crate::limits::CountLimits::default()),
        })
    }

    /// A new vhost with this broker's timers, journal, clock and limits.
    fn new_vhost(&self, name: &str) -> Arc<VHost> {
        let v = VHost::new(
            name,
            Arc::clone(&self.timers),
            Arc::clone(&self.dur),
            Arc::clone(&self.clock),
        );
        v.set_count_limits(*self.count_limits.read());
        v
    }

    pub(crate) fn journal(&self) -> &dyn Journal {
        self.dur.journal()
    }

    /// Whether the journal takes more writes without going over its bound
    /// (see [`Journal::poll_room`]).
    pub fn journal_has_room(&self) -> bool {
        self.dur.journal().has_room()
    }

    /// [`Journal::poll_room`]: what a connection awaits before it reads
    /// more work while the journal's queues are full.
    pub fn poll_journal_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.dur.journal().poll_room(cx)
    }

    /// Now, by the broker's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Ready messages per queue kept in memory; bodies of stored messages
    /// beyond it are read back from the journal when needed.
    /// Turns the lifecycle event log on (once, at startup).
    pub fn set_event_sink(&self, sink: Arc<dyn crate::durable::EventSink>) {
        self.dur.set_events(sink);
    }

    /// The event log, if on (connections hand it to their channels).
    pub fn event_sink(&self) -> Option<Arc<dyn crate::durable::EventSink>> {
        self.dur.event_sink()
    }

    pub fn set_resident_messages_max(&self, n: usize) {
        self.dur.set_resident_messages_max(n);
    }

    pub fn set_resident_bytes_max(&self, n: u64) {
        self.dur.set_resident_bytes_max(n);
    }

    /// How many queues, exchanges, bindings and consumers clients may make
    /// (every vhost).
    pub fn set_count_limits(&self, l: crate::limits::CountLimits) {
        *self.count_limits.write() = l;
        for v in self.vhosts.read().values() {
            v.set_count_limits(l);
        }
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.read().get(name).cloned()
    }

    /// Every vhost, by name.
    pub fn vhosts(&self) -> Vec<Arc<VHost>> {
        let mut v: Vec<Arc<VHost>> = self.vhosts.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Is `v` still this broker's vhost of its name (not deleted)?
    /// Connections ask on their tick and close with 320 when not.
    pub fn vhost_is_live(&self, v: &Arc<VHost>) -> bool {
        self.vhosts
            .read()
            .get(&v.name)
            .is_some_and(|cur| Arc::ptr_eq(cur, v))
    }

    /// Users and permissions.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Creates a vhost (durably) unless it exists; returns it either way.
    pub fn add_vhost(&self, name: &str) -> Result<Arc<VHost>, AccessError> {
        if name.is_empty() {
            return Err(AccessError::Invalid("a vhost name cannot be empty".into()));
        }
        let _g = self.vhost_changes.lock();
        self.commit(&MetaCommand::PutVhost {
            name: name.to_owned(),
        })?;
        Ok(self.vhost(name).expect("just applied"))
    }

    /// Restores stored vhosts, users and permissions (before
    /// [`Broker::restore`], which needs the vhosts). Returns what could not
    /// be used, and whether the defaults marker was found.
    pub fn restore_access(&self, meta: &[(Vec<u8>, Vec<u8>)]) -> (Vec<String>, bool) {
        let (cmds, mut skipped) = meta::decode_stored(meta, b"vduptyo");
        let defaults_done = cmds.iter().any(|(_, c)| *c == MetaCommand::DefaultsCreated);
        let now = self.now();
        for (parts, c) in &cmds {
            if let Err(why) = self.apply(c, now) {
                skipped.push(format!("{parts:?}: {why}"));
            }
        }
        (skipped, defaults_done)
    }

    /// Records that the defaults were created (see
    /// [`MetaCommand::DefaultsCreated`]).
    pub fn mark_defaults_created(&self) -> Result<(), AccessError> {
        self.commit(&MetaCommand::DefaultsCreated)
    }

    /// Deletes a vhost: it leaves the map at once (its connections see it
    /// on their next tick and are closed with 320), then its queues,
    /// exchanges and permissions are removed durably. The first write that
    /// fails stops it and is returned (what was not deleted durably comes
    /// back with a restart).
    pub fn delete_vhost(&self, name: &str) -> Result<(), AccessError> {
        let _g = self.vhost_changes.lock();
        let Some(v) = self.vhosts.write().remove(name) else {
            return Err(AccessError::NotFound(format!("no vhost '{name}'")));
        };
        for q in v.queues() {
            v.remove_queue(&q.name)?;
        }
        for e in v.exchanges() {
            if !e.name.is_empty() && !e.name.starts_with("amq.") {
                v.drop_exchange(&e.name)?;
            }
        }
        self.delete_vhost_policies(&v)?;
        self.access.vhost_deleted(name)?;
        self.commit(&MetaCommand::DeleteVhost {
            name: name.to_owned(),
        })
    }

    /// Installs what asks the server's timer task to run the timers at
    /// once ([`Timers::wake_now`]); false if one was installed already.
    pub fn set_timer_waker(&self, wake: Box<dyn Fn() + Send + Sync>) -> bool {
        self.timers.set_waker(wake)
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

    /// How many deadlines the timers hold and how many have fired.
    pub fn timer_counts(&self) -> crate::timers::TimerCounts {
        self.timers.counts()
    }
}
