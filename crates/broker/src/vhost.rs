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
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use berth_protocol::{AMQPValue, FieldArray, FieldTable, LongString};
use parking_lot::{Mutex, RwLock};
use rand::Rng;

use crate::args::{as_string, check_equivalent, QueueArgs, QueueType};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Destination, Exchange, ExchangeKind};
use crate::message::Message;
use crate::queue::{DeadLetter, DeathReason, Queue};

/// Where a published message went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishResult {
    /// Queues that accepted it.
    pub queues: usize,
    /// Some queue refused it (`x-overflow = reject-publish`).
    pub rejected: bool,
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

/// A virtual host.
pub struct VHost {
    pub name: String,
    exchanges: RwLock<HashMap<String, Arc<Exchange>>>,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    pub timers: Arc<Timers>,
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
    pub fn new(name: &str, timers: Arc<Timers>) -> Arc<Self> {
        let v = Arc::new_cyclic(|me| Self {
            name: name.to_owned(),
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            timers,
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
        if name.starts_with("amq.") {
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
        if name.is_empty() || name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "operation not permitted on the {} exchange",
                if name.is_empty() {
                    "default".to_owned()
                } else {
                    format!("system exchange '{name}'")
                }
            )));
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
        if removed.is_some() {
            // Bindings where it was the destination go too.
            let dest = Destination::Exchange(name.to_owned());
            let sources: Vec<Arc<Exchange>> = self.exchanges.read().values().cloned().collect();
            for s in sources {
                if s.unbind_all(&dest) > 0 {
                    self.maybe_auto_delete_exchange(&s);
                }
            }
        }
        Ok(())
    }

    fn maybe_auto_delete_exchange(&self, e: &Arc<Exchange>) {
        if e.auto_delete && !e.has_bindings() {
            let mut ex = self.exchanges.write();
            if ex.get(&e.name).is_some_and(|x| Arc::ptr_eq(x, e)) && !e.has_bindings() {
                ex.remove(&e.name);
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
        e.bind(Destination::Queue(Arc::clone(&q)), routing_key, arguments);
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
        if e.unbind(&Destination::Queue(Arc::clone(&q)), routing_key, arguments) {
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
        s.bind(
            Destination::Exchange(destination.to_owned()),
            routing_key,
            arguments,
        );
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
        if s.unbind(
            &Destination::Exchange(destination.to_owned()),
            routing_key,
            arguments,
        ) {
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
        let mut queues = self.queues.write();
        if let Some(q) = queues.get(&name) {
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
            drop(queues);
            q.touch(now);
            let s = q.stats();
            return Ok((name, s.ready, s.consumers));
        }
        let q = Arc::new(Queue::new(
            name.clone(),
            self.me.clone(),
            self.name.clone(),
            d.durable,
            d.auto_delete,
            d.exclusive.then_some(connection),
            d.arguments.clone(),
            args,
            now,
        ));
        queues.insert(name.clone(), Arc::clone(&q));
        drop(queues);
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
                "queue '{name}' in vhost '{}' is not empty",
                self.name
            )));
        }
        Ok(self.remove_queue(name))
    }

    /// Deletes a queue: consumers are told, bindings removed. Returns the
    /// number of ready messages it held.
    pub(crate) fn remove_queue(&self, name: &str) -> usize {
        let Some(q) = self.queues.write().remove(name) else {
            return 0;
        };
        let (count, consumers) = q.mark_deleted();
        for c in consumers {
            c.channel.consumer_gone(&c.tag);
        }
        let bindings = std::mem::take(&mut *q.bound_from.lock());
        let dest = Destination::Queue(Arc::clone(&q));
        for (exchange, _, _) in bindings {
            if let Ok(e) = self.exchange(&exchange) {
                if e.unbind_all(&dest) > 0 {
                    self.maybe_auto_delete_exchange(&e);
                }
            }
        }
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
    pub fn publish(
        &self,
        exchange: &str,
        msg: &Arc<Message>,
        now: Instant,
    ) -> AmqpResult<PublishResult> {
        let start = self.check_publish_target(exchange)?;
        let targets = self.resolve(start, msg);
        Ok(self.deliver_to(&targets, msg, now))
    }

    fn deliver_to(
        &self,
        targets: &[Arc<Queue>],
        msg: &Arc<Message>,
        now: Instant,
    ) -> PublishResult {
        let mut r = PublishResult::default();
        for q in targets {
            if q.enqueue(Arc::clone(msg), now) {
                r.queues += 1;
            } else {
                r.rejected = true;
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
        self.deliver_to(&targets, &msg, now);
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
