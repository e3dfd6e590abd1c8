//! Routing: the queues a message published to an exchange reaches
//! (following exchange-to-exchange bindings and alternate exchanges), and
//! handing it to them, journaled first when it must survive a crash.
//!
//! Invariants:
//! - Each queue receives a message at most once per publish, however many
//!   bindings or exchange paths lead to it; exchange loops end.
//! - A persistent message reaching durable queues (any message reaching a
//!   quorum queue) is given to the journal (one record for all of them)
//!   before any queue holds it, so its removal can never be journaled
//!   before it.

use std::sync::Arc;
use std::time::Instant;

use smallvec::{smallvec, SmallVec};

use crate::args::Overflow;
use crate::dead_letter::DeathReason;
use crate::delayed_args::delay_ms;
use crate::durable::{
    split_done, Done, Durability, EventSink, JournalError, MessageHead, MessageParts, StoredTimes,
};
use crate::events::{self, Event, EventKind, Origin};
use crate::exchange::{Destination, Exchange, Hops};
use crate::message::Message;
use crate::queue::Queue;

/// Where a published message went.
#[derive(Clone, Default)]
pub struct PublishResult {
    /// Queues that accepted it.
    pub queues: usize,
    /// Some queue refused it (`x-overflow = reject-publish`).
    pub rejected: bool,
    /// A delayed exchange holds it until it is due (it is routed then, so
    /// it is never returned as unroutable: docs/DELAYED.md).
    pub delayed: bool,
    /// It was journaled: the completion made for it runs once it is stored.
    pub durable: bool,
    /// It went to a queue whose consumers are busy but not keeping up: the
    /// publisher should wait until they catch up (flow control).
    pub backlogged: Option<Arc<Queue>>,
}

impl PublishResult {
    /// No queue at all matched (for `mandatory`).
    pub fn unroutable(&self) -> bool {
        self.queues == 0 && !self.rejected && !self.delayed
    }

    /// It reached a queue now (the HTTP publish's `routed`): one a delayed
    /// exchange holds has not, yet, whatever comes of it when due.
    pub fn routed_now(&self) -> bool {
        self.queues > 0 || self.rejected
    }
}

/// Looks exchanges and queues of one vhost up by name.
pub(crate) trait Names {
    fn exchange(&self, name: &str) -> Option<Arc<Exchange>>;
    /// The queue the default exchange routes `routing_key` to.
    fn queue(&self, name: &str) -> Option<Arc<Queue>>;
}

/// The queues a message reaches: inline up to two (a publish to one
/// queue, the common case, allocates no list).
pub(crate) type Reached = SmallVec<[Arc<Queue>; 2]>;

/// Where a message goes: the queues it reaches now, and the delayed
/// exchanges on the way that hold it (docs/DELAYED.md) with its delay.
#[derive(Default)]
pub(crate) struct Routed {
    pub queues: Reached,
    pub holds: Vec<(Arc<Exchange>, u64)>,
}

/// The distinct queues a message published to `start` (None = default
/// exchange) reaches, following exchange-to-exchange bindings and
/// alternate exchanges, and the delayed exchanges that hold it: a
/// message with an `x-delay` that reaches a delayed exchange stops there
/// until it is due (`start` too, with `hold_at_start`; not when `start`
/// is the delayed exchange routing it once due).
pub(crate) fn resolve(
    names: &dyn Names,
    start: Option<Arc<Exchange>>,
    msg: &Message,
    hold_at_start: bool,
) -> Routed {
    let mut routed = Routed::default();
    let queues = &mut routed.queues;
    let Some(start) = start else {
        queues.extend(names.queue(&msg.routing_key));
        return routed;
    };
    // Read once, and only if a delayed exchange is met.
    let mut delay: Option<Option<u64>> = None;
    // The exchanges met besides `start`, so that loops end. `start` is
    // compared in place: a publish that meets only it (the common case)
    // copies no name and allocates no list.
    let first = Arc::clone(&start);
    let mut seen: Vec<String> = Vec::new();
    let mut todo: SmallVec<[Arc<Exchange>; 2]> = smallvec![start];
    let mut hops = Hops::new();
    let follow = |name: String, seen: &mut Vec<String>, todo: &mut SmallVec<[Arc<Exchange>; 2]>| {
        if name != first.name && !seen.contains(&name) {
            if let Some(next) = names.exchange(&name) {
                seen.push(name);
                todo.push(next);
            }
        }
    };
    while let Some(e) = todo.pop() {
        if e.delayed.is_some() && (hold_at_start || e.name != first.name) {
            let ms = *delay.get_or_insert_with(|| delay_ms(msg.headers().as_ref()));
            if let Some(ms) = ms {
                routed.holds.push((e, ms));
                continue;
            }
        }
        hops.clear();
        e.route(msg, &mut hops);
        let matched = !hops.is_empty();
        for d in hops.drain(..) {
            match d {
                Destination::Queue(q) => {
                    if !queues.iter().any(|x| Arc::ptr_eq(x, &q)) && !q.is_deleted() {
                        queues.push(q);
                    }
                }
                Destination::Exchange(name) => follow(name, &mut seen, &mut todo),
            }
        }
        if !matched {
            if let Some(alt) = e.alternate_exchange() {
                follow(alt, &mut seen, &mut todo);
            }
        }
    }
    routed
}

/// Hands `msg` to `targets`. A persistent message reaching durable queues
/// (any message, for a quorum queue) is journaled first; `durable` then makes the completion that runs once
/// it is stored (and [`PublishResult::durable`] says so).
pub(crate) fn deliver_to(
    dur: &Durability,
    targets: &[Arc<Queue>],
    msg: &Arc<Message>,
    now: Instant,
    durable: Option<&mut dyn FnMut() -> Done>,
    origin: &Origin,
) -> PublishResult {
    let mut r = PublishResult::default();
    // A stream stores every message, persistent or not, as its own entry
    // (`queue/stream.rs`); the others share one record. A publish to one
    // queue (the common case) names it without a list on the heap: every
    // allocation here is freed on the store's writer thread, where malloc
    // is slowest (issue 20 goal 2).
    let streams = targets.iter().filter(|q| q.is_stream()).count();
    let stored_one: u64;
    let stored_many: Vec<u64>;
    let stored_in: &[u64] = match targets {
        [q] => match q.store_id.filter(|_| q.stores(msg)) {
            Some(id) => {
                stored_one = id;
                std::slice::from_ref(&stored_one)
            }
            None => &[],
        },
        _ => {
            stored_many = targets
                .iter()
                .filter(|q| q.stores(msg))
                .filter_map(|q| q.store_id)
                .collect();
            &stored_many
        }
    };
    let writes = usize::from(!stored_in.is_empty()) + streams;
    // The record's completion, and one per stream entry; one write takes
    // the publisher's completion as it is.
    let (record_done, mut stream_dones): (Option<Done>, Vec<Done>) = match (writes, durable) {
        (0, _) | (_, None) => (None, Vec::new()),
        (1, Some(f)) if !stored_in.is_empty() => {
            r.durable = true;
            (Some(f()), Vec::new())
        }
        (n, Some(f)) => {
            r.durable = true;
            let mut dones = split_done(f(), n);
            let record = if stored_in.is_empty() {
                None
            } else {
                dones.pop()
            };
            (record, dones)
        }
    };
    let stored = if stored_in.is_empty() {
        None
    } else {
        // A quorum queue delivers it once this write is durable.
        let done = crate::queue::release_on_commit(targets, msg, record_done);
        // The times go with the record, so its TTL counts from now after
        // a restart, or on another member after a failover (issue 42).
        let times = targets.first().map(|q| StoredTimes {
            enqueued_unix_ms: q.unix_time_ms(),
            expiration_ms: msg.expiration_ms,
        });
        // In parts: the journal copies the body once, into its batch.
        match MessageHead::timed(times, &msg.exchange, &msg.routing_key, msg.properties.len()) {
            Ok(head) => {
                let id = dur.new_message_id();
                let payload = MessageParts {
                    head: head.as_bytes(),
                    properties: &msg.properties,
                    body: &msg.body,
                };
                dur.journal().publish_message(id, stored_in, payload, done);
                Some(id)
            }
            // Entrances refuse such names (`name_rules.rs`); should one get
            // through, the publisher is told it is not stored (a nack),
            // and the message lives in memory only.
            Err(e) => {
                if let Some(done) = done {
                    done(Err(JournalError::new(e.to_string())));
                }
                None
            }
        }
    };
    for q in targets {
        let accepted = if q.is_stream() {
            q.stream_append(msg, now, stream_dones.pop(), origin)
        } else {
            let id = stored.filter(|_| q.stores(msg));
            q.enqueue_from(Arc::clone(msg), id, now, origin)
        };
        if accepted {
            r.queues += 1;
        } else {
            r.rejected = true;
        }
        if let Some(sink) = dur.events() {
            published_event(sink, q, msg, accepted, origin);
        }
        if r.backlogged.is_none() && q.is_backlogged() {
            r.backlogged = Some(Arc::clone(q));
        }
    }
    if let Some(id) = stored {
        forget_in_deleted(dur, targets, id);
    }
    r
}

/// A queue deleted between routing and the journal write above may have
/// journaled its purge before that write: the record would stay live with
/// no queue to remove it (issue 16 item 4). So each deleted target's copy
/// is removed again, after the write (same queue, same group, later
/// position). A queue still live now is deleted later, and its purge,
/// journaled after this check, comes after the write.
fn forget_in_deleted(dur: &Durability, targets: &[Arc<Queue>], id: u64) {
    for q in targets {
        if let (Some(sid), true) = (q.store_id, q.is_deleted()) {
            dur.journal().remove(sid, &[id], None);
        }
    }
}

/// A message reached queue `q` (or was refused by its `x-overflow =
/// reject-publish`: dropped, reason `maxlen`; with `reject-publish-dlx`
/// the queue reports it dead-lettered instead).
fn published_event(
    sink: &dyn EventSink,
    q: &Queue,
    msg: &Message,
    accepted: bool,
    origin: &Origin,
) {
    if !accepted && q.args().overflow == Overflow::RejectPublishDlx {
        return;
    }
    let (kind, reason) = if accepted {
        (EventKind::Published, None)
    } else {
        (EventKind::Dropped, Some(DeathReason::MaxLen))
    };
    let detail = format!("{}/{}", msg.exchange, msg.routing_key);
    events::emit(
        sink,
        &Event {
            kind,
            reason,
            vhost: &q.vhost_name,
            queue: &q.name,
            queue_store_id: q.store_id,
            msg: msg.id,
            size: msg.body_bytes(),
            connection: origin.connection,
            user: origin.user(),
            detail: &detail,
        },
    );
}
