//! A virtual host: its exchanges and queues, declaration rules, routing and
//! dead-lettering.
//!
//! Invariants:
//! - The exchange and queue maps are only written by declare/delete; the
//!   publish path takes them for reading only (no global write lock on
//!   publish).
//! - A deleted queue is first marked deleted under its own lock, then removed
//!   from the map and from every exchange's bindings.

use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use berth_protocol::{AMQPValue, FieldArray, FieldTable, LongString};
use parking_lot::{Mutex, RwLock};
use rand::Rng;

use crate::args::{as_string, check_equivalent, QueueArgs, QueueType};
use crate::durable::{self, Done, Journal};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Destination, Exchange, ExchangeKind};
use crate::message::Message;
use crate::queue::{DeadLetter, DeathReason, Queue};

/// Where a published message went.
#[derive(Clone, Default)]
pub struct PublishResult {
    /// Queues that accepted it.
    pub queues: usize,
    /// Some queue refused it (`x-overflow = reject-publish`).
    pub rejected: bool,
    /// It was journaled: the completion made for it runs once it is stored.
    pub durable: bool,
    /// It went to a queue whose consumers are busy but not keeping up: the
    /// publisher should wait until they catch up (flow control).
    pub backlogged: Option<Arc<Queue>>,
}

impl PublishResult {
    /// No queue at all matched (for `mandatory`).
    pub fn unroutable(&self) -> bool {
        self.queues == 0 && !self.rejected
    }
}

/// Deadlines of queues that need attention (TTL, `x-expires`).
#[derive(Default)]
pub struct Timers {
    heap: Mutex<BinaryHeap<TimerEntry>>,
}

struct TimerEntry {
    at: Instant,
    queue: Weak<Queue>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for TimerEntry {
    // Reversed: BinaryHeap is a max-heap, we want the earliest first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

impl Timers {
    pub fn schedule(&self, at: Instant, queue: Weak<Queue>) {
        self.heap.lock().push(TimerEntry { at, queue });
    }

    /// Runs every timer due at `now`.
    pub fn run_due(&self, now: Instant) {
        loop {
            let q = {
                let mut h = self.heap.lock();
                match h.peek() {
                    Some(e) if e.at <= now => h.pop().map(|e| e.queue),
                    _ => return,
                }
            };
            if let Some(q) = q.and_then(|w| w.upgrade()) {
                q.on_timer(now);
            }
        }
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.lock().peek().map(|e| e.at)
    }
}

/// The journal and the id counters every vhost shares.
pub struct Durability {
    pub journal: Arc<dyn Journal>,
    /// Next journal message id (never reused: restored from the journal).
    pub next_msg_id: AtomicU64,
    /// Next durable queue id.
    pub next_queue_id: AtomicU64,
    /// Ready messages per queue whose bodies stay in memory; beyond it,
    /// bodies already written to the journal are read back when needed.
    pub resident_messages_max: AtomicUsize,
}

/// Default of [`Durability::resident_messages_max`].
pub const RESIDENT_MESSAGES_MAX_DEFAULT: usize = 4096;

/// A virtual host.
pub struct VHost {
    pub name: String,
    exchanges: RwLock<HashMap<String, Arc<Exchange>>>,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    pub timers: Arc<Timers>,
    dur: Arc<Durability>,
    /// Serialises declare/delete of queues, so a definition is journaled
    /// (which waits for the disk) without holding the maps' write locks that
    /// publishers read.
    definitions: Mutex<()>,
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

/// Arguments of `exchange.declare` other than the name.
#[derive(Debug, Clone, Default)]
pub struct ExchangeDeclare {
    pub kind: String,
    pub passive: bool,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

impl VHost {
    pub fn new(name: &str, timers: Arc<Timers>, dur: Arc<Durability>) -> Arc<Self> {
        let v = Arc::new_cyclic(|me| Self {
            name: name.to_owned(),
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            timers,
            dur,
            definitions: Mutex::new(()),
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
        self.dur.journal.as_ref()
    }

    /// A fresh journal queue id for a queue's paging copies.
    pub(crate) fn new_paging_id(&self) -> u64 {
        self.dur.next_queue_id.fetch_add(1, Ordering::Relaxed) | durable::PAGING_BIT
    }

    /// A fresh journal message id.
    pub(crate) fn new_message_id(&self) -> u64 {
        self.dur.next_msg_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn resident_messages_max(&self) -> usize {
        self.dur.resident_messages_max.load(Ordering::Relaxed)
    }

    fn meta_put(&self, key: &[u8], value: &[u8]) -> AmqpResult<()> {
        self.journal().put_meta(key, value).map_err(|e| {
            AmqpError::internal(format!("could not store the definition durably: {e}"))
        })
    }

    fn meta_delete(&self, key: &[u8]) {
        if let Err(e) = self.journal().delete_meta(key) {
            tracing::error!(error = %e, "could not journal the removal of a definition");
        }
    }

    /// A binding is stored when both its ends are.
    fn binding_is_durable(&self, source: &Exchange, dest: &Destination) -> bool {
        source.durable
            && match dest {
                Destination::Queue(q) => q.store_id.is_some(),
                Destination::Exchange(name) => self.exchange(name).is_ok_and(|e| e.durable),
            }
    }

    fn binding_key(
        &self,
        source: &str,
        dest: &Destination,
        routing_key: &str,
        args: &FieldTable,
    ) -> Vec<u8> {
        match dest {
            Destination::Queue(q) => {
                durable::binding_key(&self.name, source, true, &q.name, routing_key, args)
            }
            Destination::Exchange(x) => {
                durable::binding_key(&self.name, source, false, x, routing_key, args)
            }
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

    /// Every queue, for the management view.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.queues.read().values().cloned().collect()
    }

    /// Every exchange, for the management view.
    pub fn exchanges(&self) -> Vec<Arc<Exchange>> {
        self.exchanges.read().values().cloned().collect()
    }

    pub fn queue_names(&self) -> Vec<String> {
        self.queues.read().keys().cloned().collect()
    }

    pub fn queue_count(&self) -> usize {
        self.queues.read().len()
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
        // Redeclaring an existing `amq.*` exchange with its own properties
        // is fine (clients do it); creating a new one is not.
        if name.starts_with("amq.") && !self.exchanges.read().contains_key(name) {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let kind = ExchangeKind::parse(&d.kind)?;
        if let Some(alt) = d.arguments.inner().get("alternate-exchange") {
            if as_string(alt).is_none() {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid arg 'alternate-exchange' for exchange '{name}' in vhost '{}': expected a string",
                    self.name
                )));
            }
        }
        let existing = self.exchanges.read().get(name).cloned();
        if existing.is_none() && d.durable {
            // Durable before it exists: a declare-ok survives a crash.
            self.meta_put(
                &durable::exchange_key(&self.name, name),
                &durable::exchange_value(kind.as_str(), d.auto_delete, d.internal, &d.arguments),
            )?;
        }
        let mut ex = self.exchanges.write();
        if let Some(e) = ex.get(name) {
            let mismatch = |arg: &str, got: String, cur: String| {
                Err(AmqpError::precondition_failed(format!(
                    "inequivalent arg '{arg}' for exchange '{name}' in vhost '{}': received '{got}' but current is '{cur}'",
                    self.name
                )))
            };
            if e.kind != kind {
                return mismatch("type", kind.as_str().into(), e.kind.as_str().into());
            }
            if e.durable != d.durable {
                return mismatch("durable", d.durable.to_string(), e.durable.to_string());
            }
            if e.auto_delete != d.auto_delete {
                return mismatch(
                    "auto_delete",
                    d.auto_delete.to_string(),
                    e.auto_delete.to_string(),
                );
            }
            if e.internal != d.internal {
                return mismatch("internal", d.internal.to_string(), e.internal.to_string());
            }
            return Ok(());
        }
        ex.insert(
            name.to_owned(),
            Arc::new(Exchange::new(
                name.to_owned(),
                kind,
                d.durable,
                d.auto_delete,
                d.internal,
                d.arguments.clone(),
            )),
        );
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
        let removed = {
            let mut ex = self.exchanges.write();
            match ex.get(name) {
                None => return Ok(()),
                Some(e) if if_unused && e.has_bindings() => {
                    return Err(AmqpError::precondition_failed(format!(
                        "exchange '{name}' in vhost '{}' in use",
                        self.name
                    )))
                }
                Some(_) => ex.remove(name),
            }
        };
        if let Some(gone) = removed {
            if gone.durable {
                for b in gone.bindings() {
                    if self.binding_is_durable(&gone, &b.destination) {
                        self.meta_delete(&self.binding_key(
                            name,
                            &b.destination,
                            &b.routing_key,
                            &b.arguments,
                        ));
                    }
                }
                self.meta_delete(&durable::exchange_key(&self.name, name));
            }
            // Bindings where it was the destination go too.
            self.unbind_everywhere(&Destination::Exchange(name.to_owned()), gone.durable);
        }
        Ok(())
    }

    /// Removes every binding to `dest` from every exchange (and their stored
    /// definitions), auto-deleting sources left without bindings.
    fn unbind_everywhere(&self, dest: &Destination, dest_durable: bool) {
        let sources: Vec<Arc<Exchange>> = self.exchanges.read().values().cloned().collect();
        for s in sources {
            let gone = s.unbind_all(dest);
            if gone.is_empty() {
                continue;
            }
            if s.durable && dest_durable {
                for b in &gone {
                    self.meta_delete(&self.binding_key(
                        &s.name,
                        dest,
                        &b.routing_key,
                        &b.arguments,
                    ));
                }
            }
            self.maybe_auto_delete_exchange(&s);
        }
    }

    fn maybe_auto_delete_exchange(&self, e: &Arc<Exchange>) {
        if e.auto_delete && !e.has_bindings() {
            let mut ex = self.exchanges.write();
            if ex.get(&e.name).is_some_and(|x| Arc::ptr_eq(x, e)) && !e.has_bindings() {
                ex.remove(&e.name);
                drop(ex);
                if e.durable {
                    self.meta_delete(&durable::exchange_key(&self.name, &e.name));
                }
            }
        }
    }

    fn check_bind_source(&self, name: &str) -> AmqpResult<Arc<Exchange>> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(format!(
                "operation not permitted on the default exchange in vhost '{}'",
                self.name
            )));
        }
        self.exchange(name)
    }

    /// `queue.bind`.
    pub fn bind_queue(
        &self,
        connection: u64,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<()> {
        let q = self.queue(connection, queue)?;
        let e = self.check_bind_source(exchange)?;
        let dest = Destination::Queue(Arc::clone(&q));
        if self.binding_is_durable(&e, &dest) {
            self.meta_put(
                &self.binding_key(exchange, &dest, routing_key, arguments),
                &durable::binding_value(arguments),
            )?;
        }
        e.bind(dest, routing_key, arguments);
        let mut b = q.bound_from.lock();
        let key = (
            exchange.to_owned(),
            routing_key.to_owned(),
            arguments.clone(),
        );
        if !b.contains(&key) {
            b.push(key);
        }
        Ok(())
    }

    /// `queue.unbind`. Unbinding what is not bound is not an error.
    pub fn unbind_queue(
        &self,
        connection: u64,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<()> {
        let q = self.queue(connection, queue)?;
        let e = self.check_bind_source(exchange)?;
        let dest = Destination::Queue(Arc::clone(&q));
        if e.unbind(&dest, routing_key, arguments) {
            if self.binding_is_durable(&e, &dest) {
                self.meta_delete(&self.binding_key(exchange, &dest, routing_key, arguments));
            }
            q.bound_from
                .lock()
                .retain(|(x, k, a)| !(x == exchange && k == routing_key && a == arguments));
            self.maybe_auto_delete_exchange(&e);
        }
        Ok(())
    }

    /// `exchange.bind`: messages from `source` also go through `destination`.
    pub fn bind_exchange(
        &self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<()> {
        let s = self.check_bind_source(source)?;
        if destination.is_empty() {
            return Err(self
                .check_bind_source(destination)
                .err()
                .expect("default exchange refused"));
        }
        self.exchange(destination)?;
        let dest = Destination::Exchange(destination.to_owned());
        if self.binding_is_durable(&s, &dest) {
            self.meta_put(
                &self.binding_key(source, &dest, routing_key, arguments),
                &durable::binding_value(arguments),
            )?;
        }
        s.bind(dest, routing_key, arguments);
        Ok(())
    }

    /// `exchange.unbind`.
    pub fn unbind_exchange(
        &self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<()> {
        let s = self.check_bind_source(source)?;
        self.exchange(destination)?;
        let dest = Destination::Exchange(destination.to_owned());
        if s.unbind(&dest, routing_key, arguments) {
            if self.binding_is_durable(&s, &dest) {
                self.meta_delete(&self.binding_key(source, &dest, routing_key, arguments));
            }
            self.maybe_auto_delete_exchange(&s);
        }
        Ok(())
    }

    /// `queue.declare`. Returns (name, ready messages, consumers).
    pub fn declare_queue(
        &self,
        connection: u64,
        name: &str,
        d: &QueueDeclare,
        now: Instant,
    ) -> AmqpResult<(String, usize, usize)> {
        if d.passive {
            let q = self.queue(connection, name)?;
            q.touch(now);
            let s = q.stats();
            return Ok((q.name.clone(), s.ready, s.consumers));
        }
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
        let args = QueueArgs::parse(&name, &self.name, &d.arguments)?;
        if args.queue_type == QueueType::Quorum && (d.exclusive || d.auto_delete || !d.durable) {
            return Err(AmqpError::precondition_failed(format!(
                "invalid property '{}' for queue '{name}' in vhost '{}': quorum queues must be durable, non-exclusive and non-auto-delete",
                if d.exclusive { "exclusive" } else if d.auto_delete { "auto-delete" } else { "non-durable" },
                self.name
            )));
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
        // Exclusive queues die with their connection, so they are never stored.
        let store_id = (d.durable && !d.exclusive)
            .then(|| self.dur.next_queue_id.fetch_add(1, Ordering::Relaxed));
        if let Some(id) = store_id {
            self.meta_put(
                &durable::queue_key(&self.name, &name),
                &durable::queue_value(id, d.auto_delete, &d.arguments),
            )?;
        }
        let q = Arc::new(Queue::new(
            name.clone(),
            self.me.clone(),
            self.name.clone(),
            d.durable,
            d.auto_delete,
            d.exclusive.then_some(connection),
            store_id,
            d.arguments.clone(),
            args,
            now,
        ));
        self.queues.write().insert(name.clone(), Arc::clone(&q));
        drop(guard);
        // Start the x-expires clock.
        q.touch(now);
        Ok((name, 0, 0))
    }

    /// `queue.purge`.
    pub fn purge_queue(&self, connection: u64, name: &str, now: Instant) -> AmqpResult<usize> {
        Ok(self.queue(connection, name)?.purge(now))
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
        Ok(self.remove_queue(name))
    }

    /// Deletes a queue: consumers are told, bindings removed. Returns the
    /// number of ready messages it held.
    pub(crate) fn remove_queue(&self, name: &str) -> usize {
        let guard = self.definitions.lock();
        let Some(q) = self.queues.write().remove(name) else {
            return 0;
        };
        let (count, consumers, paging_id) = q.mark_deleted();
        if let Some(id) = paging_id {
            self.journal().purge(id, None);
        }
        if let Some(id) = q.store_id {
            self.journal().purge(id, None);
            self.meta_delete(&durable::queue_key(&self.name, name));
        }
        drop(guard);
        for c in consumers {
            c.channel.consumer_gone(&c.tag);
        }
        q.bound_from.lock().clear();
        self.unbind_everywhere(&Destination::Queue(Arc::clone(&q)), q.store_id.is_some());
        count
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
            self.remove_queue(&n);
        }
    }

    /// Re-creates a stored exchange after a restart.
    pub fn restore_exchange(&self, name: &str, value: &[u8]) -> Result<(), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let get = |k: &str| t.inner().get(k);
        let kind = get("type").and_then(as_string).ok_or("no type")?;
        let kind = ExchangeKind::parse(&kind).map_err(|e| e.text)?;
        let flag = |k: &str| matches!(get(k), Some(AMQPValue::Boolean(true)));
        let arguments = match get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        self.exchanges.write().insert(
            name.to_owned(),
            Arc::new(Exchange::new(
                name.to_owned(),
                kind,
                true,
                flag("auto_delete"),
                flag("internal"),
                arguments,
            )),
        );
        Ok(())
    }

    /// Re-creates a stored queue after a restart; returns it and its id.
    pub fn restore_queue(
        &self,
        name: &str,
        value: &[u8],
        now: Instant,
    ) -> Result<(Arc<Queue>, u64), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let id = t
            .inner()
            .get("id")
            .and_then(crate::args::as_i128)
            .and_then(|i| u64::try_from(i).ok())
            .ok_or("no id")?;
        let auto_delete = matches!(t.inner().get("auto_delete"), Some(AMQPValue::Boolean(true)));
        let arguments = match t.inner().get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        let args = QueueArgs::parse(name, &self.name, &arguments).map_err(|e| e.text)?;
        let q = Arc::new(Queue::new(
            name.to_owned(),
            self.me.clone(),
            self.name.clone(),
            true,
            auto_delete,
            None,
            Some(id),
            arguments,
            args,
            now,
        ));
        self.queues.write().insert(name.to_owned(), Arc::clone(&q));
        Ok((q, id))
    }

    /// Re-creates a stored binding after a restart.
    pub fn restore_binding(
        &self,
        source: &str,
        to_queue: bool,
        destination: &str,
        routing_key: &str,
        value: &[u8],
    ) -> Result<(), String> {
        let t = durable::read_table(value).ok_or("definition does not parse")?;
        let arguments = match t.inner().get("arguments") {
            Some(AMQPValue::FieldTable(a)) => a.clone(),
            _ => FieldTable::default(),
        };
        let src = self.exchange(source).map_err(|e| e.text)?;
        if to_queue {
            let q = self
                .queues
                .read()
                .get(destination)
                .cloned()
                .ok_or_else(|| format!("no queue '{destination}'"))?;
            src.bind(Destination::Queue(Arc::clone(&q)), routing_key, &arguments);
            q.bound_from
                .lock()
                .push((source.to_owned(), routing_key.to_owned(), arguments));
        } else {
            self.exchange(destination).map_err(|e| e.text)?;
            src.bind(
                Destination::Exchange(destination.to_owned()),
                routing_key,
                &arguments,
            );
        }
        Ok(())
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

    /// Routes and enqueues a message.
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
        let start = self.check_publish_target(exchange)?;
        let targets = self.resolve(start, msg);
        Ok(self.deliver_to(&targets, msg, now, Some(durable)))
    }

    fn deliver_to(
        &self,
        targets: &[Arc<Queue>],
        msg: &Arc<Message>,
        now: Instant,
        durable: Option<&mut dyn FnMut() -> Done>,
    ) -> PublishResult {
        let mut r = PublishResult::default();
        let stored_in: Vec<u64> = if msg.persistent {
            targets.iter().filter_map(|q| q.store_id).collect()
        } else {
            Vec::new()
        };
        let stored = (!stored_in.is_empty()).then(|| {
            let id = self.new_message_id();
            let payload = durable::encode_message(
                &msg.exchange,
                &msg.routing_key,
                &msg.properties,
                &msg.body,
            );
            let done = durable.map(|f| f());
            r.durable = done.is_some();
            self.journal().publish(id, &stored_in, payload, done);
            id
        });
        for q in targets {
            let id = stored.filter(|_| q.store_id.is_some());
            if q.enqueue(Arc::clone(msg), id, now) {
                r.queues += 1;
            } else {
                r.rejected = true;
            }
            if r.backlogged.is_none() && q.is_backlogged() {
                r.backlogged = Some(Arc::clone(q));
            }
        }
        r
    }

    /// The distinct queues a message published to `start` (None = default
    /// exchange) reaches, following exchange-to-exchange bindings and
    /// alternate exchanges.
    fn resolve(&self, start: Option<Arc<Exchange>>, msg: &Message) -> Vec<Arc<Queue>> {
        let mut queues: Vec<Arc<Queue>> = Vec::new();
        let Some(start) = start else {
            if let Some(q) = self.queues.read().get(&msg.routing_key) {
                queues.push(Arc::clone(q));
            }
            return queues;
        };
        let mut seen: Vec<String> = vec![start.name.clone()];
        let mut todo = vec![start];
        let mut hops = Vec::new();
        while let Some(e) = todo.pop() {
            hops.clear();
            e.route(msg, &mut hops);
            let mut matched = false;
            for d in hops.drain(..) {
                matched = true;
                match d {
                    Destination::Queue(q) => {
                        if !queues.iter().any(|x| Arc::ptr_eq(x, &q)) && !q.is_deleted() {
                            queues.push(q);
                        }
                    }
                    Destination::Exchange(name) => {
                        if !seen.contains(&name) {
                            if let Ok(next) = self.exchange(&name) {
                                seen.push(name);
                                todo.push(next);
                            }
                        }
                    }
                }
            }
            if !matched {
                if let Some(alt) = e.alternate_exchange() {
                    if !seen.contains(&alt) {
                        if let Ok(next) = self.exchange(&alt) {
                            seen.push(alt);
                            todo.push(next);
                        }
                    }
                }
            }
        }
        queues
    }

    /// Republishes a dead letter through the queue's dead-letter exchange,
    /// with its `x-death` history updated as RabbitMQ does.
    pub(crate) fn dead_letter(&self, from: &Arc<Queue>, d: DeadLetter) {
        let Some(dlx) = from.args.dead_letter_exchange.clone() else {
            return;
        };
        let Ok(exchange) = (if dlx.is_empty() {
            Ok(None)
        } else {
            self.exchange(&dlx).map(Some)
        }) else {
            tracing::warn!(queue = %from.name, dlx = %dlx, "dead-letter exchange does not exist; message dropped");
            return;
        };
        let routing_key = from
            .args
            .dead_letter_routing_key
            .clone()
            .unwrap_or_else(|| d.msg.routing_key.clone());
        let original_expiration = d.msg.expiration_ms;
        let msg = match d.msg.rewritten(dlx.clone(), routing_key, |props| {
            let mut headers = props.headers().clone().unwrap_or_default();
            add_x_death(
                &mut headers,
                &from.name,
                d.reason,
                &d.msg,
                original_expiration,
            );
            *props = props.clone().with_headers(headers);
            if original_expiration.is_some() {
                clear_expiration(props);
            }
        }) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(queue = %from.name, error = %e, "could not dead-letter message; dropped");
                return;
            }
        };
        let mut targets = self.resolve(exchange, &msg);
        // A cycle with no rejection in it would loop forever: drop there.
        if d.reason != DeathReason::Rejected {
            targets.retain(|q| !died_in(&msg, &q.name) || any_rejection(&msg));
        }
        let now = Instant::now();
        self.deliver_to(&targets, &msg, now, None);
    }
}

fn clear_expiration(props: &mut berth_protocol::AMQPProperties) {
    // The generated type has no "unset"; rebuild without `expiration`.
    let mut p = berth_protocol::AMQPProperties::default();
    if let Some(v) = props.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = props.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = props.headers() {
        p = p.with_headers(v.clone());
    }
    if let Some(v) = props.delivery_mode() {
        p = p.with_delivery_mode(*v);
    }
    if let Some(v) = props.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = props.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = props.reply_to() {
        p = p.with_reply_to(v.clone());
    }
    if let Some(v) = props.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = props.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = props.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = props.user_id() {
        p = p.with_user_id(v.clone());
    }
    if let Some(v) = props.app_id() {
        p = p.with_app_id(v.clone());
    }
    if let Some(v) = props.cluster_id() {
        p = p.with_cluster_id(v.clone());
    }
    *props = p;
}

fn x_death_entries(msg: &Message) -> Vec<FieldTable> {
    match msg.headers.as_ref().and_then(|h| h.inner().get("x-death")) {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .filter_map(|v| match v {
                AMQPValue::FieldTable(t) => Some(t.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn died_in(msg: &Message, queue: &str) -> bool {
    x_death_entries(msg)
        .iter()
        .any(|t| t.inner().get("queue").and_then(as_string).as_deref() == Some(queue))
}

fn any_rejection(msg: &Message) -> bool {
    x_death_entries(msg)
        .iter()
        .any(|t| t.inner().get("reason").and_then(as_string).as_deref() == Some("rejected"))
}

fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// Adds or updates this death in `x-death` (most recent first) and sets the
/// `x-first-death-*` headers once.
fn add_x_death(
    headers: &mut FieldTable,
    queue: &str,
    reason: DeathReason,
    msg: &Message,
    original_expiration: Option<u64>,
) {
    let mut entries = x_death_entries(msg);
    let same = |t: &FieldTable| {
        t.inner().get("queue").and_then(as_string).as_deref() == Some(queue)
            && t.inner().get("reason").and_then(as_string).as_deref() == Some(reason.as_str())
    };
    let now_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let entry = if let Some(i) = entries.iter().position(same) {
        let mut t = entries.remove(i);
        let count = t
            .inner()
            .get("count")
            .and_then(crate::args::as_i128)
            .unwrap_or(0);
        t.insert(
            "count".into(),
            AMQPValue::LongLongInt(i64::try_from(count + 1).unwrap_or(i64::MAX)),
        );
        t.insert("time".into(), AMQPValue::Timestamp(now_s));
        t
    } else {
        let mut t = FieldTable::default();
        t.insert("count".into(), AMQPValue::LongLongInt(1));
        t.insert("reason".into(), long_str(reason.as_str()));
        t.insert("queue".into(), long_str(queue));
        t.insert("time".into(), AMQPValue::Timestamp(now_s));
        t.insert("exchange".into(), long_str(&msg.exchange));
        t.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![long_str(&msg.routing_key)])),
        );
        if let Some(ms) = original_expiration {
            t.insert("original-expiration".into(), long_str(&ms.to_string()));
        }
        t
    };
    entries.insert(0, entry);
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(
            entries
                .into_iter()
                .map(AMQPValue::FieldTable)
                .collect::<Vec<_>>(),
        )),
    );
    if !headers.contains_key("x-first-death-reason") {
        headers.insert("x-first-death-reason".into(), long_str(reason.as_str()));
        headers.insert("x-first-death-queue".into(), long_str(queue));
        headers.insert("x-first-death-exchange".into(), long_str(&msg.exchange));
    }
}

/// `amq.gen-` followed by 22 URL-safe base64 characters, as RabbitMQ names
/// server-named queues.
fn server_named() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::rng();
    let tail: String = (0..22)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("amq.gen-{tail}")
}
