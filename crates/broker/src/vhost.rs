//! A virtual host: its exchanges and queues, declaration rules, routing and
//! dead-lettering.
//!
//! Invariants:
//! - The exchange and queue maps are only written by declare/delete; the
//!   publish path takes them for reading only (no global write lock on
//!   publish).
//! - A deleted queue is first marked deleted under its own lock, then removed
//!   from the map and from every exchange's bindings.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Instant;

use berth_protocol::FieldTable;
use parking_lot::{Mutex, RwLock};

use crate::args::{as_string, check_equivalent, QueueArgs, QueueType};
use crate::clock::Clock;
use crate::dead_letter::{self, DeadLetter};
use crate::delayed_args::declared_kind;
use crate::durable::{Done, Durability, Journal, JournalError};
use crate::error::{AmqpError, AmqpResult};
use crate::events::Origin;
pub use crate::exchange::ExchangeDeclare;
use crate::exchange::{Destination, Exchange, ExchangeKind};
use crate::limits::CountLimits;
use crate::message::Message;
use crate::meta::{BindingDef, ExchangeDef, MetaCommand, QueueDef};
use crate::name_rules::check_shortstr;
use crate::queue::{Queue, QueueEnv, QueueOwner};
pub use crate::routing::PublishResult;
use crate::routing::{self, Names};
use crate::server_named::server_named;
use crate::timers::Timers;
use crate::totals::{QueueTotals, Totals};

mod apply;
mod bindings;
mod delayed;
mod owner;
mod policies;

/// A virtual host.
pub struct VHost {
    pub name: String,
    exchanges: RwLock<HashMap<String, Arc<Exchange>>>,
    /// In name order, so a page of the management list costs its own
    /// length (`queue_page`), not the number of queues.
    queues: RwLock<BTreeMap<String, Arc<Queue>>>,
    pub timers: Arc<Timers>,
    dur: Arc<Durability>,
    clock: Arc<dyn Clock>,
    /// Serialises declare/delete of queues, so a definition is journaled
    /// (which waits for the disk) without holding the maps' write locks that
    /// publishers read.
    definitions: Mutex<()>,
    /// How many queues, exchanges, bindings and consumers clients may make.
    counts: RwLock<CountLimits>,
    /// Policies and operator policies (see `vhost/policies.rs`).
    policies: RwLock<Arc<crate::policy::VhostPolicies>>,
    /// Totals over its queues, kept as they change (`totals.rs`).
    totals: Arc<QueueTotals>,
    me: Weak<VHost>,
}

/// Exchanges every vhost has.
const STANDARD_EXCHANGES: &[(&str, ExchangeKind)] = &[
    ("amq.direct", ExchangeKind::Direct),
    ("amq.fanout", ExchangeKind::Fanout),
    ("amq.topic", ExchangeKind::Topic),
    ("amq.headers", ExchangeKind::Headers),
    ("amq.match", ExchangeKind::Headers),
];

/// Arguments of `queue.declare` other than the name.
#[derive(Debug, Clone, Default)]
pub struct QueueDeclare {
    pub passive: bool,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
}

impl VHost {
    pub fn new(
        name: &str,
        timers: Arc<Timers>,
        dur: Arc<Durability>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let v = Arc::new_cyclic(|me| Self {
            name: name.to_owned(),
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(BTreeMap::new()),
            timers,
            dur,
            clock,
            definitions: Mutex::new(()),
            counts: RwLock::new(CountLimits::default()),
            policies: RwLock::default(),
            totals: Arc::default(),
            me: me.clone(),
        });
        {
            let mut ex = v.exchanges.write();
            for (n, k) in STANDARD_EXCHANGES {
                ex.insert(
                    (*n).to_owned(),
                    Arc::new(Exchange::new(
                        (*n).to_owned(),
                        *k,
                        true,
                        false,
                        false,
                        FieldTable::default(),
                    )),
                );
            }
        }
        v
    }

    pub(crate) fn journal(&self) -> &dyn Journal {
        self.dur.journal()
    }

    /// Wall-clock Unix time in milliseconds (stream timestamps).
    pub fn unix_time_ms(&self) -> u64 {
        self.clock.unix_time_us() / 1000
    }

    /// What a queue of this vhost gets of its surroundings.
    pub(crate) fn queue_env(&self) -> QueueEnv {
        let owner: Weak<dyn QueueOwner> = self.me.clone() as Weak<dyn QueueOwner>;
        QueueEnv {
            dur: Arc::clone(&self.dur),
            timers: Arc::clone(&self.timers),
            owner,
            clock: Arc::clone(&self.clock),
            totals: Arc::clone(&self.totals),
        }
    }

    /// Adds an exchange as it is (restore after a restart).
    pub(crate) fn insert_exchange(&self, e: Arc<Exchange>) {
        self.apply_policies_to_exchange(&e);
        self.exchanges.write().insert(e.name.clone(), e);
    }

    /// Adds a queue as it is (restore after a restart).
    pub(crate) fn insert_queue(&self, q: Arc<Queue>) {
        self.apply_policies_to_queue(&q, self.clock.now());
        let replaced = self.queues.write().insert(q.name.clone(), Arc::clone(&q));
        if let Some(old) = replaced {
            self.unplaced(&old);
        }
        self.placed(&q);
        q.report_totals();
    }

    /// A stored queue joined this vhost: its log group counts it (see
    /// [`crate::durable::Placement`]).
    pub(crate) fn placed(&self, q: &Queue) {
        if let Some(id) = q.store_id {
            self.dur.queue_added(id);
        }
    }

    /// A stored queue left this vhost.
    pub(crate) fn unplaced(&self, q: &Queue) {
        if let Some(id) = q.store_id {
            self.dur.queue_removed(id);
        }
    }

    /// A queue by name, whoever owns it.
    pub fn find_queue(&self, name: &str) -> Option<Arc<Queue>> {
        self.queues.read().get(name).cloned()
    }

    /// Makes a definition change durable; the caller changes memory only
    /// after it succeeded, and answers with the error otherwise.
    fn record(&self, cmd: &MetaCommand) -> Result<(), JournalError> {
        self.journal().record(cmd)
    }

    fn delete_exchange_cmd(&self, name: &str) -> MetaCommand {
        MetaCommand::DeleteExchange {
            vhost: self.name.clone(),
            name: name.to_owned(),
        }
    }

    fn no_exchange(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no exchange '{name}' in vhost '{}'", self.name))
    }

    fn no_queue(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no queue '{name}' in vhost '{}'", self.name))
    }

    pub fn exchange(&self, name: &str) -> AmqpResult<Arc<Exchange>> {
        self.exchanges
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_exchange(name))
    }

    /// Looks a queue up for an operation by `connection`, enforcing
    /// exclusivity (405).
    pub fn queue(&self, connection: u64, name: &str) -> AmqpResult<Arc<Queue>> {
        let q = self
            .queues
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_queue(name))?;
        if q.exclusive_owner.is_some_and(|owner| owner != connection) {
            return Err(self.locked(name));
        }
        Ok(q)
    }

    fn locked(&self, name: &str) -> AmqpError {
        AmqpError::resource_locked(format!(
            "cannot obtain exclusive access to locked queue '{name}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
            self.name
        ))
    }

    /// Every queue, in name order, for the management view.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.queues.read().values().cloned().collect()
    }

    /// At most `take` queues in name order, after the first `skip`: one
    /// page of the management list, at the cost of `skip + take` steps.
    pub fn queue_page(&self, skip: usize, take: usize) -> Vec<Arc<Queue>> {
        (self.queues.read().values().skip(skip).take(take))
            .cloned()
            .collect()
    }

    /// Every exchange, for the management view.
    pub fn exchanges(&self) -> Vec<Arc<Exchange>> {
        self.exchanges.read().values().cloned().collect()
    }

    pub fn queue_names(&self) -> Vec<String> {
        self.queues.read().keys().cloned().collect()
    }

    /// Sets how many queues, exchanges, bindings and consumers clients may make.
    pub fn set_count_limits(&self, l: CountLimits) {
        *self.counts.write() = l;
    }

    pub fn count_limits(&self) -> CountLimits {
        *self.counts.read()
    }

    pub fn queue_count(&self) -> usize {
        self.queues.read().len()
    }

    pub fn exchange_count(&self) -> usize {
        self.exchanges.read().len()
    }

    /// Totals over its queues, read without visiting any (`totals.rs`).
    pub fn totals(&self) -> Totals {
        self.totals.get()
    }

    /// Takes a sample of the totals' rates (the rate sampler's tick).
    pub fn sample_rates(&self, now: Instant) {
        self.totals.sample(now);
    }

    /// `exchange.declare`.
    pub fn declare_exchange(&self, name: &str, d: &ExchangeDeclare) -> AmqpResult<()> {
        let _definitions = self.definitions.lock();
        if d.passive {
            if name.is_empty() {
                return Ok(());
            }
            return self.exchange(name).map(|_| ());
        }
        if name.is_empty() {
            return Err(AmqpError::access_refused(format!(
                "operation not permitted on the default exchange in vhost '{}'",
                self.name
            )));
        }
        check_shortstr("exchange name", name)?;
        // Redeclaring an existing `amq.*` exchange with its own properties
        // is fine (clients do it); creating a new one is not.
        if name.starts_with("amq.") && !self.exchanges.read().contains_key(name) {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let (kind, delayed) = declared_kind(name, &self.name, &d.kind, &d.arguments)?;
        if let Some(alt) = d.arguments.inner().get("alternate-exchange") {
            if as_string(alt).is_none() {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid arg 'alternate-exchange' for exchange '{name}' in vhost '{}': expected a string",
                    self.name
                )));
            }
        }
        let existing = self.exchanges.read().get(name).cloned();
        if existing.is_none() {
            let n = self.exchanges.read().len();
            self.counts.read().check_new_exchange(n, name, &self.name)?;
        }
        // A durable delayed exchange stores its pending messages under an
        // id of its own, as a durable queue does.
        let delayed_id =
            (existing.is_none() && delayed && d.durable).then(|| self.dur.new_queue_id());
        if existing.is_none() && d.durable {
            // Durable before it exists: a declare-ok survives a crash.
            self.record(&MetaCommand::PutExchange(ExchangeDef {
                vhost: self.name.clone(),
                name: name.to_owned(),
                kind: d.kind.clone(),
                auto_delete: d.auto_delete,
                internal: d.internal,
                arguments: d.arguments.clone(),
                delayed_id,
            }))
            .map_err(not_stored)?;
        }
        let mut ex = self.exchanges.write();
        if let Some(e) = ex.get(name) {
            return e.check_equivalent(kind, d, &self.name);
        }
        let e = Exchange::new(
            name.to_owned(),
            kind,
            d.durable,
            d.auto_delete,
            d.internal,
            d.arguments.clone(),
        );
        let e = if delayed {
            self.delayed_exchange(e, delayed_id)
        } else {
            Arc::new(e)
        };
        self.apply_policies_to_exchange(&e);
        ex.insert(name.to_owned(), e);
        Ok(())
    }

    /// `exchange.delete`. Deleting a missing exchange is not an error.
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> AmqpResult<()> {
        let _definitions = self.definitions.lock();
        if name.is_empty() || name.starts_with("amq.") {
            return Err(AmqpError::access_refused(if name.is_empty() {
                format!(
                    "operation not permitted on the default exchange in vhost '{}'",
                    self.name
                )
            } else {
                format!(
                    "deletion of system exchange '{name}' in vhost '{}' not allowed",
                    self.name
                )
            }));
        }
        match self.exchanges.read().get(name) {
            None => return Ok(()),
            Some(e) if if_unused && e.has_bindings() => {
                return Err(AmqpError::precondition_failed(format!(
                    "exchange '{name}' in vhost '{}' in use",
                    self.name
                )))
            }
            Some(_) => {}
        }
        self.drop_exchange_locked(name).map_err(not_stored)
    }

    /// [`VHost::delete_exchange`] without its checks (a vhost's deletion).
    pub(crate) fn drop_exchange(&self, name: &str) -> Result<(), JournalError> {
        let _definitions = self.definitions.lock();
        self.drop_exchange_locked(name)
    }

    /// Deletes an exchange, its bindings and the bindings to it: durably
    /// first (the exchange's own definition is the commit point: if that
    /// write fails nothing changed), then from memory.
    fn drop_exchange_locked(&self, name: &str) -> Result<(), JournalError> {
        let Some(gone) = self.exchanges.read().get(name).cloned() else {
            return Ok(());
        };
        // Chosen while the exchange is still in the map: a binding to
        // itself is stored, and must leave the store with it.
        let stored: Vec<BindingDef> = (gone.bindings().iter())
            .filter(|b| self.binding_is_durable(&gone, &b.destination))
            .map(|b| self.binding_def(name, &b.destination, &b.routing_key, &b.arguments))
            .collect();
        if gone.durable {
            self.record(&self.delete_exchange_cmd(name))?;
        }
        self.exchanges.write().remove(name);
        self.discard_delayed(&gone);
        for def in stored {
            self.record(&MetaCommand::DeleteBinding(def))?;
        }
        // Bindings where it was the destination go too.
        self.unbind_everywhere(&Destination::Exchange(name.to_owned()), gone.durable)
    }

    /// `queue.declare`. Returns (name, ready messages, consumers).
    pub fn declare_queue(
        &self,
        connection: u64,
        name: &str,
        d: &QueueDeclare,
        now: Instant,
    ) -> AmqpResult<(String, usize, usize)> {
        self.declare_queue_authorised(connection, name, d, now, &|_| Ok(()))
    }

    /// `queue.declare`, with `authorise` asked about the final name (a
    /// server-named queue's too) before a non-passive declare changes
    /// anything: the permission check.
    pub fn declare_queue_authorised(
        &self,
        connection: u64,
        name: &str,
        d: &QueueDeclare,
        now: Instant,
        authorise: &dyn Fn(&str) -> AmqpResult<()>,
    ) -> AmqpResult<(String, usize, usize)> {
        if d.passive {
            let q = self.queue(connection, name)?;
            q.touch(now);
            let s = q.stats();
            return Ok((q.name.clone(), s.ready, s.consumers));
        }
        check_shortstr("queue name", name)?;
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "queue name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let name = if name.is_empty() {
            server_named()
        } else {
            name.to_owned()
        };
        authorise(&name)?;
        let args = QueueArgs::parse(&name, &self.name, &d.arguments)?;
        args.check_names(&name, &self.name)?;
        if args.queue_type == QueueType::Stream {
            crate::stream::declare::check_properties(
                &name,
                &self.name,
                d.durable,
                d.exclusive,
                d.auto_delete,
            )?;
        }
        if args.queue_type == QueueType::Quorum && (d.exclusive || d.auto_delete || !d.durable) {
            return Err(AmqpError::precondition_failed(format!(
                "invalid property '{}' for queue '{name}' in vhost '{}': quorum queues must be durable, non-exclusive and non-auto-delete",
                if d.exclusive { "exclusive" } else if d.auto_delete { "auto-delete" } else { "non-durable" },
                self.name
            )));
        }
        if args.queue_type == QueueType::Quorum {
            crate::quorum_args::check(&name, &self.name, &d.arguments, self.journal().copies())?;
        }
        let guard = self.definitions.lock();
        let existing = self.queues.read().get(&name).cloned();
        if let Some(q) = existing.as_ref() {
            if q.exclusive_owner.is_some_and(|o| o != connection)
                || (q.exclusive_owner.is_none() && d.exclusive)
            {
                return Err(self.locked(&name));
            }
            let mismatch = |arg: &str, got: bool, cur: bool| {
                Err(AmqpError::precondition_failed(format!(
                    "inequivalent arg '{arg}' for queue '{name}' in vhost '{}': received '{got}' but current is '{cur}'",
                    self.name
                )))
            };
            if q.durable != d.durable {
                return mismatch("durable", d.durable, q.durable);
            }
            if q.auto_delete != d.auto_delete {
                return mismatch("auto_delete", d.auto_delete, q.auto_delete);
            }
            check_equivalent(&name, &self.name, &q.arguments, &d.arguments)?;
            let q = Arc::clone(q);
            drop(guard);
            q.touch(now);
            let s = q.stats();
            return Ok((name, s.ready, s.consumers));
        }
        let n = self.queues.read().len();
        self.counts.read().check_new_queue(n, &name, &self.name)?;
        // Exclusive queues die with their connection, so they are never stored.
        let store_id = (d.durable && !d.exclusive).then(|| self.dur.new_queue_id());
        if let Some(id) = store_id {
            self.record(&MetaCommand::PutQueue(QueueDef {
                vhost: self.name.clone(),
                name: name.clone(),
                id,
                auto_delete: d.auto_delete,
                arguments: d.arguments.clone(),
            }))
            .map_err(not_stored)?;
        }
        let q = Arc::new(Queue::new(
            name.clone(),
            self.queue_env(),
            self.name.clone(),
            d.durable,
            d.auto_delete,
            d.exclusive.then_some(connection),
            store_id,
            d.arguments.clone(),
            args,
            now,
        ));
        self.apply_policies_to_queue(&q, now);
        self.queues.write().insert(name.clone(), Arc::clone(&q));
        self.placed(&q);
        q.report_totals();
        // Again, now that it is in the map: a policy change that ran
        // meanwhile did not see it (see `vhost/policies.rs`).
        self.apply_policies_to_queue(&q, now);
        drop(guard);
        // Start the x-expires clock.
        q.touch(now);
        Ok((name, 0, 0))
    }

    /// `queue.purge`.
    pub fn purge_queue(&self, connection: u64, name: &str, now: Instant) -> AmqpResult<usize> {
        let q = self.queue(connection, name)?;
        if q.is_stream() {
            // RabbitMQ: a stream's purge is `{error, not_supported}`.
            return Err(AmqpError::not_implemented(format!(
                "purge not supported by queue '{name}' in vhost '{}'",
                self.name
            )));
        }
        Ok(q.purge(now))
    }

    /// `queue.delete`. Deleting a missing queue is not an error (returns 0).
    pub fn delete_queue(
        &self,
        connection: u64,
        name: &str,
        if_unused: bool,
        if_empty: bool,
    ) -> AmqpResult<usize> {
        let q = match self.queue(connection, name) {
            Err(e) if e.reply_code == berth_protocol::reply::NOT_FOUND => return Ok(0),
            other => other?,
        };
        let s = q.stats();
        // RabbitMQ's streams ignore if-unused and if-empty
        // (`rabbit_stream_queue:delete`): a stream is never "empty".
        let (if_unused, if_empty) = if q.is_stream() {
            (false, false)
        } else {
            (if_unused, if_empty)
        };
        if if_unused && s.consumers > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "queue '{name}' in vhost '{}' in use",
                self.name
            )));
        }
        if if_empty && s.ready > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "queue '{name}' in vhost '{}' not empty",
                self.name
            )));
        }
        self.remove_queue(name).map_err(not_stored)
    }

    /// Deletes a queue: consumers are told, bindings removed. Returns the
    /// number of ready messages it held. A stored queue's definition is
    /// deleted durably first: if that fails, the queue stays as it was.
    pub(crate) fn remove_queue(&self, name: &str) -> Result<usize, JournalError> {
        let guard = self.definitions.lock();
        let Some(q) = self.find_queue(name) else {
            return Ok(0);
        };
        if q.store_id.is_some() {
            self.record(&MetaCommand::DeleteQueue {
                vhost: self.name.clone(),
                name: name.to_owned(),
            })?;
        }
        if self.queues.write().remove(name).is_some() {
            self.unplaced(&q);
        }
        let (count, consumers, paging_id) = q.mark_deleted();
        // After the definition: a purge without it would empty a queue
        // that a restart brings back. Messages left by a crash in between
        // belong to no queue and are reported at startup.
        let marks = (q.store_id)
            .filter(|_| q.has_retry_marks())
            .map(crate::durable::retry_id);
        for id in paging_id.into_iter().chain(q.store_id).chain(marks) {
            self.journal().purge(id, None);
        }
        drop(guard);
        for c in consumers {
            c.channel.consumer_gone(&c.tag);
        }
        q.bound_from.lock().clear();
        self.unbind_everywhere(&Destination::Queue(Arc::clone(&q)), q.store_id.is_some())?;
        Ok(count)
    }

    /// A connection closed: its exclusive queues go.
    pub fn connection_closed(&self, connection: u64) {
        let mine: Vec<String> = self
            .queues
            .read()
            .values()
            .filter(|q| q.exclusive_owner == Some(connection))
            .map(|q| q.name.clone())
            .collect();
        for n in mine {
            // No client waits for this: the error is logged.
            if let Err(e) = self.remove_queue(&n) {
                tracing::error!(vhost = %self.name, queue = %n, error = %e, "could not delete an exclusive queue durably");
            }
        }
    }

    /// Checks that a publish to `exchange` is allowed (exists, not internal).
    pub fn check_publish_target(&self, exchange: &str) -> AmqpResult<Option<Arc<Exchange>>> {
        if exchange.is_empty() {
            return Ok(None);
        }
        let e = self.exchange(exchange)?;
        if e.internal {
            return Err(AmqpError::access_refused(format!(
                "cannot publish to internal exchange '{exchange}' in vhost '{}'",
                self.name
            )));
        }
        Ok(Some(e))
    }

    /// Routes and enqueues a message. A persistent message reaching durable
    /// queues is journaled first; `durable` then makes the completion that
    /// runs once it is stored (and `PublishResult::durable` says so).
    pub fn publish(
        &self,
        exchange: &str,
        msg: &Arc<Message>,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
    ) -> AmqpResult<PublishResult> {
        self.publish_from(exchange, msg, now, durable, &Origin::default())
    }

    /// [`VHost::publish`] by `origin` (whom the events it causes name).
    pub fn publish_from(
        &self,
        exchange: &str,
        msg: &Arc<Message>,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
        origin: &Origin,
    ) -> AmqpResult<PublishResult> {
        let start = self.check_publish_target(exchange)?;
        let routed = routing::resolve(self, start, msg, true);
        self.check_delayed_room(&routed, msg)?;
        Ok(self.deliver_routed(routed, msg, now, Some(durable), origin))
    }

    /// Republishes one dead letter through `from`'s dead-letter exchange,
    /// with its `x-death` history updated as RabbitMQ does. `durable` is
    /// called if a durable copy is journaled.
    fn republish(
        &self,
        from: &Queue,
        d: &DeadLetter,
        now: Instant,
        durable: Option<&mut dyn FnMut() -> Done>,
        origin: &Origin,
    ) {
        let (dlx, msg) = match dead_letter::rewrite(
            &from.name,
            &from.args(),
            d,
            self.clock.unix_time_s(),
        ) {
            None => return,
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                tracing::warn!(queue = %from.name, error = %e, "could not dead-letter message; dropped");
                return;
            }
        };
        let exchange = if dlx.is_empty() {
            None
        } else {
            match Names::exchange(self, &dlx) {
                Some(e) => Some(e),
                None => {
                    tracing::warn!(queue = %from.name, dlx = %dlx, "dead-letter exchange does not exist; message dropped");
                    return;
                }
            }
        };
        let mut routed = routing::resolve(self, exchange, &msg, true);
        routed
            .queues
            .retain(|q| dead_letter::may_reach(&msg, &q.name, d.reason));
        self.deliver_routed(routed, &msg, now, durable, origin);
    }
}

/// A definition change that could not be made durable, as the client sees
/// it (the cause in the text: AMQP carries no more).
fn not_stored(e: JournalError) -> AmqpError {
    AmqpError::internal(format!("could not store the definition durably: {e}"))
}
