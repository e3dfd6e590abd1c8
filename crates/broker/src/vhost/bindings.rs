//! A vhost's bindings: `queue.bind`/`unbind`, `exchange.bind`/`unbind`,
//! and the bindings that go when one of their ends does.
//!
//! Invariants:
//! - A binding whose both ends are durable is stored: it is written
//!   before it exists in memory, and its removal is written before the
//!   operation answers (a removal that cannot be written is undone and
//!   refused).
//! - An auto-delete exchange goes with its last binding, durably first.

use std::sync::Arc;

use berth_protocol::FieldTable;

use super::{not_stored, VHost};
use crate::durable::JournalError;
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Destination, Exchange};
use crate::meta::{BindingDef, MetaCommand};
use crate::name_rules::check_shortstr;
use crate::queue::Queue;

impl VHost {
    /// A binding is stored when both its ends are.
    pub(super) fn binding_is_durable(&self, source: &Exchange, dest: &Destination) -> bool {
        source.durable
            && match dest {
                Destination::Queue(q) => q.store_id.is_some(),
                Destination::Exchange(name) => self.exchange(name).is_ok_and(|e| e.durable),
            }
    }

    pub(super) fn binding_def(
        &self,
        source: &str,
        dest: &Destination,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> BindingDef {
        let (to_queue, destination) = match dest {
            Destination::Queue(q) => (true, q.name.clone()),
            Destination::Exchange(x) => (false, x.clone()),
        };
        BindingDef {
            vhost: self.name.clone(),
            source: source.to_owned(),
            to_queue,
            destination,
            routing_key: routing_key.to_owned(),
            arguments: arguments.clone(),
        }
    }

    /// Removes every binding to `dest` from every exchange (and their stored
    /// definitions), auto-deleting sources left without bindings.
    /// The first failed write is returned, after every binding left
    /// memory (the thing they pointed to is gone either way).
    pub(super) fn unbind_everywhere(
        &self,
        dest: &Destination,
        dest_durable: bool,
    ) -> Result<(), JournalError> {
        let sources: Vec<Arc<Exchange>> = self.exchanges.read().values().cloned().collect();
        let mut result = Ok(());
        for s in sources {
            let gone = s.unbind_all(dest);
            if gone.is_empty() {
                continue;
            }
            if s.durable && dest_durable {
                for b in &gone {
                    let def = self.binding_def(&s.name, dest, &b.routing_key, &b.arguments);
                    result = result.and_then(|()| self.record(&MetaCommand::DeleteBinding(def)));
                }
            }
            result = result.and_then(|()| self.maybe_auto_delete_exchange(&s));
        }
        result
    }

    /// An auto-delete exchange goes with its last binding (durably first:
    /// if that fails, it stays).
    pub(super) fn maybe_auto_delete_exchange(&self, e: &Arc<Exchange>) -> Result<(), JournalError> {
        if !e.auto_delete || e.has_bindings() {
            return Ok(());
        }
        let removed = {
            let mut ex = self.exchanges.write();
            let current = ex.get(&e.name).is_some_and(|x| Arc::ptr_eq(x, e));
            current && !e.has_bindings() && ex.remove(&e.name).is_some()
        };
        if removed && e.durable {
            if let Err(err) = self.record(&self.delete_exchange_cmd(&e.name)) {
                // Not durably gone: it stays, as a restart would bring it back.
                (self.exchanges.write())
                    .entry(e.name.clone())
                    .or_insert_with(|| Arc::clone(e));
                return Err(err);
            }
        }
        Ok(())
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

    /// The ends of a queue binding, checked for `queue.bind`/`unbind`.
    fn queue_binding(
        &self,
        connection: u64,
        queue: &str,
        exchange: &str,
    ) -> AmqpResult<(Arc<Queue>, Arc<Exchange>, Destination)> {
        let q = self.queue(connection, queue)?;
        let e = self.check_bind_source(exchange)?;
        let dest = Destination::Queue(Arc::clone(&q));
        Ok((q, e, dest))
    }

    /// Adds a binding: durably first when both its ends are durable.
    fn bind(
        &self,
        source: &Exchange,
        dest: Destination,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<()> {
        check_shortstr("routing key", routing_key)?;
        if self.binding_is_durable(source, &dest) {
            let def = self.binding_def(&source.name, &dest, routing_key, arguments);
            self.record(&MetaCommand::PutBinding(def))
                .map_err(not_stored)?;
        }
        source.bind(dest, routing_key, arguments);
        Ok(())
    }

    /// Removes a binding; false if there was none. If its removal cannot
    /// be made durable it is put back and the error returned (a restart
    /// would bring it back).
    fn unbind(
        &self,
        source: &Exchange,
        dest: &Destination,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> AmqpResult<bool> {
        if !source.unbind(dest, routing_key, arguments) {
            return Ok(false);
        }
        if self.binding_is_durable(source, dest) {
            let def = self.binding_def(&source.name, dest, routing_key, arguments);
            if let Err(e) = self.record(&MetaCommand::DeleteBinding(def)) {
                source.bind(dest.clone(), routing_key, arguments);
                return Err(not_stored(e));
            }
        }
        Ok(true)
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
        let (q, e, dest) = self.queue_binding(connection, queue, exchange)?;
        (self.counts.read()).check_new_binding(e.binding_count(), exchange, &self.name)?;
        self.bind(&e, dest, routing_key, arguments)?;
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
        let (q, e, dest) = self.queue_binding(connection, queue, exchange)?;
        if self.unbind(&e, &dest, routing_key, arguments)? {
            q.bound_from
                .lock()
                .retain(|(x, k, a)| !(x == exchange && k == routing_key && a == arguments));
            self.maybe_auto_delete_exchange(&e).map_err(not_stored)?;
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
        (self.counts.read()).check_new_binding(s.binding_count(), source, &self.name)?;
        self.bind(&s, dest, routing_key, arguments)
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
        if self.unbind(&s, &dest, routing_key, arguments)? {
            self.maybe_auto_delete_exchange(&s).map_err(not_stored)?;
        }
        Ok(())
    }
}
