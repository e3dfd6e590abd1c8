//! A vhost's part of [`crate::Broker::apply`]: stored exchanges, queues
//! and bindings put into memory, or taken out of it, exactly as the
//! command says — no journal writes, no checks beyond what makes the
//! command usable (a restart or a replica replays what was already
//! decided).
//!
//! Invariants:
//! - Nothing here writes to the journal: replaying a command stream never
//!   adds to it.
//! - A delete of something that is not there does nothing, so replaying
//!   a stream twice, or from a snapshot, ends in the same state.

use std::sync::Arc;
use std::time::Instant;

use crate::args::QueueArgs;
use crate::delayed_args::declared_kind;
use crate::exchange::{Destination, Exchange};
use crate::meta::{BindingDef, ExchangeDef, QueueDef};
use crate::queue::Queue;

use super::VHost;

impl VHost {
    /// A stored exchange, as it was declared.
    pub(crate) fn apply_exchange(&self, x: &ExchangeDef) -> Result<(), String> {
        let (kind, delayed) =
            declared_kind(&x.name, &self.name, &x.kind, &x.arguments).map_err(|e| e.text)?;
        let e = Exchange::new(
            x.name.clone(),
            kind,
            true,
            x.auto_delete,
            x.internal,
            x.arguments.clone(),
        );
        self.insert_exchange(if delayed {
            self.delayed_exchange(e, x.delayed_id)
        } else {
            Arc::new(e)
        });
        Ok(())
    }

    /// An exchange and every binding to it leave memory.
    pub(crate) fn forget_exchange(&self, name: &str) {
        let Some(gone) = self.exchanges.write().remove(name) else {
            return;
        };
        if let Some(d) = gone.delayed.as_ref() {
            d.discard_all();
        }
        let dest = Destination::Exchange(name.to_owned());
        for e in self.exchanges() {
            e.unbind_all(&dest);
        }
    }

    /// A stored queue, empty (restore adds its messages).
    pub(crate) fn apply_queue(&self, d: &QueueDef, now: Instant) -> Result<Arc<Queue>, String> {
        let args = QueueArgs::parse(&d.name, &self.name, &d.arguments).map_err(|e| e.text)?;
        let q = Arc::new(Queue::new(
            d.name.clone(),
            self.queue_env(),
            self.name.clone(),
            true,
            d.auto_delete,
            None,
            Some(d.id),
            d.arguments.clone(),
            args,
            now,
        ));
        self.insert_queue(Arc::clone(&q));
        Ok(q)
    }

    /// A queue leaves memory: its consumers are told, its bindings go.
    pub(crate) fn forget_queue(&self, name: &str) {
        let Some(q) = self.queues.write().remove(name) else {
            return;
        };
        self.unplaced(&q);
        let (_, consumers, _) = q.mark_deleted();
        for c in consumers {
            c.channel.consumer_gone(&c.tag);
        }
        q.bound_from.lock().clear();
        let dest = Destination::Queue(q);
        for e in self.exchanges() {
            e.unbind_all(&dest);
        }
    }

    /// A stored binding; both its ends must exist.
    pub(crate) fn apply_binding(&self, b: &BindingDef) -> Result<(), String> {
        let src = self.exchange(&b.source).map_err(|e| e.text)?;
        if b.to_queue {
            let q = self
                .find_queue(&b.destination)
                .ok_or_else(|| format!("no queue '{}'", b.destination))?;
            src.bind(
                Destination::Queue(Arc::clone(&q)),
                &b.routing_key,
                &b.arguments,
            );
            q.bound_from.lock().push((
                b.source.clone(),
                b.routing_key.clone(),
                b.arguments.clone(),
            ));
        } else {
            self.exchange(&b.destination).map_err(|e| e.text)?;
            src.bind(
                Destination::Exchange(b.destination.clone()),
                &b.routing_key,
                &b.arguments,
            );
        }
        Ok(())
    }

    /// A binding leaves memory (if both ends are still there).
    pub(crate) fn forget_binding(&self, b: &BindingDef) {
        let Ok(src) = self.exchange(&b.source) else {
            return;
        };
        let dest = if b.to_queue {
            let Some(q) = self.find_queue(&b.destination) else {
                return;
            };
            q.bound_from
                .lock()
                .retain(|(x, k, a)| !(*x == b.source && *k == b.routing_key && *a == b.arguments));
            Destination::Queue(q)
        } else {
            Destination::Exchange(b.destination.clone())
        };
        src.unbind(&dest, &b.routing_key, &b.arguments);
    }
}
