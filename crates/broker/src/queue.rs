//! A queue: ready messages in order, the consumers they go to, and the rules
//! (TTL, length limits, dead-lettering, delivery limit, expiry) applied to them.
//!
//! Invariants:
//! - Each queue's state has one owner: its mutex. Nothing else holds a queue's
//!   messages, except channels holding the ones delivered and not yet acked
//!   (counted in `unacked`).
//! - Lock order is queue → channel, never the reverse: a channel releases its
//!   own lock before it calls into a queue.
//! - Within a priority level, ready messages are in publish order (`seq`
//!   ascending); a requeued message goes back to its original place.
//! - Dead letters and deletions are *collected* under the lock and carried out
//!   after it is released, so a queue never holds its lock while publishing to
//!   another queue.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use berth_protocol::FieldTable;
use parking_lot::{Mutex, RwLock};

use crate::args::{Overflow, QueueArgs};

mod effects;
mod leaving;
mod quorum;
mod resident;
mod retry;
mod settings;
mod stream;
mod tally;
mod times;
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::durable::{Done, Durability};
use crate::events::{self, Origin};
use crate::limits::{FLOW_ACTIVE_MS, FLOW_READY_MAX, PAGE_SCAN_EVERY_MESSAGES};
use crate::message::Message;
use crate::paging::Pager;
pub use crate::ready::QueuedMessage;
use crate::ready::{Body, Deadline, Entry, Ready, Restored, StoredId};
use crate::timers::{TimerTarget, Timers};
use effects::Effects;
pub(crate) use quorum::release_on_commit;
pub use retry::{backoff_ms, delivery_limit, with_count, DELIVERY_COUNT_HEADER};
pub use stream::{StoredEntry, OFFSET_HEADER};

/// See [`view_reads`].
static VIEW_READS: AtomicU64 = AtomicU64::new(0);

/// How many times a queue's state was read for a view (`Queue::stats`)
/// since the process started: what a management
/// request costs in queues visited. Tests pin that status requests
/// (`/api/overview`, `/metrics`) visit none.
pub fn view_reads() -> u64 {
    VIEW_READS.load(Ordering::Relaxed)
}

/// Delivered messages handed back to their queue: a `Vec`, or a channel's
/// inline list of one (an ack of a single delivery then allocates no
/// list), anything that yields them and says how many.
pub trait Messages: IntoIterator<Item = QueuedMessage, IntoIter: ExactSizeIterator> {}

impl<T> Messages for T
where
    T: IntoIterator<Item = QueuedMessage>,
    T::IntoIter: ExactSizeIterator,
{
}

/// Counters for the management view and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub ready: usize,
    pub ready_bytes: u64,
    /// Ready messages whose bodies are only on disk.
    pub paged_out: usize,
    pub unacked: usize,
    pub consumers: usize,
    /// Returned messages waiting for their delayed retry: counted, not
    /// deliverable.
    pub retrying: usize,
}

/// How delivered messages come back to their queue: acked, requeued
/// (nack or reject with requeue, a closed channel), or rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Requeue,
    Reject,
}

/// Where a queue's consumer gets its deliveries: implemented by the
/// channel the consumer was created on.
pub trait ConsumerChannel: Send + Sync {
    /// Called by a queue (holding its own lock) to hand a message to one of
    /// this channel's consumers. Gives the message back if the consumer or
    /// channel has no credit or the connection is congested.
    fn try_deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        msg: QueuedMessage,
        now: Instant,
    ) -> Result<(), QueuedMessage>;
    /// The queue went away: the consumer is cancelled (tell the client if
    /// it listens for that).
    fn consumer_gone(&self, tag: &str);
}

/// What a queue hands back to the vhost that holds it.
pub trait QueueOwner: Send + Sync {
    /// Republishes messages that left `from` with a reason, through its
    /// dead-letter exchange; the events they cause name `origin`.
    fn dead_letter(&self, from: &Queue, letters: Vec<DeadLetter>, now: Instant, origin: &Origin);
    /// The queue deleted itself (auto-delete, `x-expires`): remove it.
    fn delete_queue(&self, name: &str);
}

/// A queue's surroundings: all it needs of the broker around it.
#[derive(Clone)]
pub struct QueueEnv {
    /// The journal and its id counters.
    pub dur: Arc<Durability>,
    /// Where the queue registers its deadlines.
    pub timers: Arc<Timers>,
    /// The vhost, for dead letters and deletion.
    pub owner: Weak<dyn QueueOwner>,
    /// Wall-clock time, for stream timestamps and retention by age.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// The vhost's totals, to which the queue reports its changes.
    pub totals: Arc<crate::totals::QueueTotals>,
}

/// A consumer attached to a queue.
pub struct Consumer {
    pub tag: String,
    pub channel: Arc<dyn ConsumerChannel>,
    pub queue: Arc<Queue>,
    pub no_ack: bool,
    pub exclusive: bool,
    /// Per-consumer prefetch (0 = unlimited).
    pub prefetch: u16,
    /// Deliveries not yet acked, checked against `prefetch` under the
    /// channel lock.
    pub in_flight: AtomicU32,
    /// On a stream: where it starts reading (`x-stream-offset`).
    pub stream_offset: Option<crate::stream::offset::OffsetSpec>,
}

impl Consumer {
    /// Can it take one more delivery as far as its own prefetch goes?
    /// (The channel's prefetch and output are checked by the channel.)
    pub fn below_prefetch(&self) -> bool {
        self.prefetch == 0 || self.in_flight.load(Ordering::Relaxed) < u32::from(self.prefetch)
    }
}

struct QueueState {
    ready: Ready,
    /// Delivered, not yet acked.
    unacked: usize,
    consumers: Vec<Arc<Consumer>>,
    /// Round-robin position in `consumers`.
    next_consumer: usize,
    next_seq: u64,
    deleted: bool,
    /// Auto-delete applies only once a queue has had a consumer.
    had_consumer: bool,
    /// Last declare/consume/get/cancel, for `x-expires`.
    last_used: Instant,
    /// Deadline already registered with the timer service.
    timer_at: Option<Instant>,
    /// Paging bookkeeping (scan mark, paging id, restore time).
    pager: Pager,
    /// Last delivery to a consumer (flow control: are consumers busy?).
    last_delivery: Option<Instant>,
    /// A stream's log and readers (`queue/stream.rs`); `None` for other
    /// queues.
    stream: Option<Box<stream::StreamState>>,
    /// Returned messages waiting for their delayed retry.
    retrying: retry::Retrying,
    /// What it last reported to its vhost's totals (`queue/tally.rs`).
    reported: crate::totals::Tally,
}

/// A queue.
pub struct Queue {
    pub name: String,
    env: QueueEnv,
    pub vhost_name: String,
    pub durable: bool,
    pub auto_delete: bool,
    /// Connection that owns an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// Its id in the journal if it is durable (persistent messages to it
    /// are stored).
    pub store_id: Option<u64>,
    /// Arguments as declared, for equivalence checks.
    pub arguments: FieldTable,
    /// `arguments` parsed; [`Queue::args`] is what is in force.
    pub declared_args: QueueArgs,
    /// Declared arguments combined with the policies in force.
    effective: RwLock<settings::Effective>,
    state: Mutex<QueueState>,
    /// See [`FLOW_READY_MAX`]; updated after every operation, read without
    /// the lock on publish.
    backlogged: AtomicBool,
    /// Bindings where this queue is the destination: (exchange, key, args),
    /// so deleting the queue can remove them.
    pub(crate) bound_from: Mutex<Vec<(String, String, FieldTable)>>,
    /// Published / delivered / acked, for the management API.
    pub counters: crate::counters::QueueCounters,
}

impl Queue {
    /// Whether `exchange` routes to this queue with `routing_key` (any
    /// arguments): what an MQTT UNSUBSCRIBE asks before it unbinds.
    pub fn is_bound_from(&self, exchange: &str, routing_key: &str) -> bool {
        self.bound_from
            .lock()
            .iter()
            .any(|(x, k, _)| x == exchange && k == routing_key)
    }

    #[allow(clippy::too_many_arguments)] // one per part of a queue's identity
    pub(crate) fn new(
        name: String,
        env: QueueEnv,
        vhost_name: String,
        durable: bool,
        auto_delete: bool,
        exclusive_owner: Option<u64>,
        store_id: Option<u64>,
        arguments: FieldTable,
        args: QueueArgs,
        now: Instant,
    ) -> Self {
        Self {
            state: Mutex::new(QueueState {
                ready: Ready::new(args.max_priority),
                unacked: 0,
                consumers: Vec::new(),
                next_consumer: 0,
                next_seq: 0,
                deleted: false,
                had_consumer: false,
                last_used: now,
                timer_at: None,
                retrying: retry::Retrying::default(),
                reported: crate::totals::Tally::default(),
                pager: Pager::default(),
                last_delivery: None,
                stream: (args.queue_type == crate::args::QueueType::Stream).then(Box::default),
            }),
            name,
            env,
            vhost_name,
            durable,
            auto_delete,
            exclusive_owner,
            store_id,
            arguments,
            effective: RwLock::new(settings::Effective::declared(&args)),
            declared_args: args,
            bound_from: Mutex::new(Vec::new()),
            counters: crate::counters::QueueCounters::default(),
            backlogged: AtomicBool::new(false),
        }
    }

    /// Its consumers are busy but not keeping up: publishers should wait.
    pub fn is_backlogged(&self) -> bool {
        self.backlogged.load(Ordering::Relaxed)
    }

    /// Publishers may go on: the backlog is down to half of
    /// [`FLOW_READY_MAX`] (so flow control does not flap), or the queue has
    /// no busy consumers any more.
    pub fn caught_up(&self, now: Instant) -> bool {
        let s = self.state.lock();
        s.deleted || s.ready.len <= FLOW_READY_MAX / 2 || !Self::busy(&s, now)
    }

    fn busy(s: &QueueState, now: Instant) -> bool {
        !s.consumers.is_empty()
            && s.last_delivery.is_some_and(|t| {
                now.saturating_duration_since(t) < Duration::from_millis(FLOW_ACTIVE_MS)
            })
    }

    pub fn stats(&self) -> QueueStats {
        VIEW_READS.fetch_add(1, Ordering::Relaxed);
        let s = self.state.lock();
        if let Some(st) = s.stream.as_ref() {
            let l = st.stats();
            return QueueStats {
                ready: usize::try_from(l.messages).unwrap_or(usize::MAX),
                ready_bytes: l.bytes,
                paged_out: 0,
                unacked: s.unacked,
                consumers: s.consumers.len(),
                retrying: 0,
            };
        }
        QueueStats {
            ready: s.ready.len,
            ready_bytes: s.ready.bytes,
            paged_out: s.ready.len - s.ready.resident,
            unacked: s.unacked,
            consumers: s.consumers.len(),
            retrying: s.retrying.len(),
        }
    }

    /// Its consumers, for the management API.
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.state.lock().consumers.clone()
    }

    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }

    /// The next moment this queue needs attention, if newer than what is
    /// already registered.
    fn schedule(&self, s: &mut QueueState, now: Instant) -> Option<Instant> {
        self.settle_head_times(s, now);
        let ttl = s
            .ready
            .front()
            .and_then(|m| m.expires_at.get())
            .or_else(|| self.stream_next_check(s, now));
        let expiry = self
            .args()
            .expires_ms
            .filter(|_| s.consumers.is_empty())
            .map(|ms| s.last_used + Duration::from_millis(ms));
        let next = [ttl, expiry, s.retrying.next_due()]
            .into_iter()
            .flatten()
            .min()?;
        let next = next.max(now);
        match s.timer_at {
            Some(t) if t <= next && t > now => None,
            _ => {
                s.timer_at = Some(next);
                Some(next)
            }
        }
    }

    /// A deadline came: expire messages at the head, delete an unused
    /// queue with `x-expires`.
    fn run_timer(self: &Arc<Self>, now: Instant) {
        self.with_state(now, |q, s, fx| {
            if s.timer_at.is_some_and(|t| t <= now) {
                s.timer_at = None;
            }
            let due = s.retrying.take_due(now);
            let released = !due.is_empty();
            for e in due {
                s.ready.insert_by_seq(e);
            }
            q.expire_head(s, now, fx);
            if s.stream.is_some() && !s.deleted {
                q.stream_retention(s, q.env.clock.unix_time_us() / 1000, fx);
                q.stream_dispatch(s, now, fx);
            } else if released && !s.deleted {
                q.dispatch(s, now, fx);
            }
            if let Some(ms) = q.args().expires_ms {
                if s.consumers.is_empty()
                    && now >= s.last_used + Duration::from_millis(ms)
                    && !s.deleted
                {
                    s.deleted = true;
                    fx.delete = true;
                }
            }
        });
    }

    fn event_name(&self) -> events::QueueName<'_> {
        (&self.vhost_name, &self.name, self.store_id)
    }

    /// Enqueues a published message (`stored`: its journal id, already
    /// journaled for this queue). Returns `false` if the queue refused it
    /// (`x-overflow = reject-publish`).
    pub fn enqueue(self: &Arc<Self>, msg: Arc<Message>, stored: Option<u64>, now: Instant) -> bool {
        self.enqueue_from(msg, stored, now, &Origin::default())
    }

    /// [`Queue::enqueue`] of a publish by `origin` (whom the events it
    /// causes name).
    pub fn enqueue_from(
        self: &Arc<Self>,
        msg: Arc<Message>,
        stored: Option<u64>,
        now: Instant,
        origin: &Origin,
    ) -> bool {
        if self.is_stream() {
            return self.stream_append(&msg, now, None, origin);
        }
        self.counters.add_published();
        self.with_state(now, |q, s, fx| {
            fx.origin = origin.clone();
            if s.deleted {
                return true;
            }
            if q.args().overflow != Overflow::DropHead && q.would_overflow(s, &msg) {
                let reason = (q.args().overflow == Overflow::RejectPublishDlx)
                    .then_some(DeathReason::MaxLen);
                let refused = QueuedMessage {
                    msg,
                    seq: 0,
                    returns: 0,
                    redelivered: false,
                    expires_at: None,
                    stored,
                };
                q.drop_message(refused, reason, fx);
                return false;
            }
            let seq = q.push_new(s, msg, stored, false, now);
            q.dispatch(s, now, fx);
            // A TTL of 0 means "deliver now or never".
            q.drop_expired(s, now, true, fx);
            q.trim_to_limits(s, now, fx);
            // Every so many messages, or at once when large ones pile up.
            let heavy = s.ready.resident_bytes > 2 * q.env.dur.resident_bytes_max();
            if seq % PAGE_SCAN_EVERY_MESSAGES == 0 || heavy {
                q.page_out(s);
            }
            true
        })
    }

    /// Hands ready messages to consumers with credit, round-robin.
    fn dispatch(self: &Arc<Self>, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        if s.stream.is_some() {
            self.stream_dispatch(s, now, fx);
            return;
        }
        if s.consumers.is_empty() {
            return;
        }
        loop {
            self.expire_head(s, now, fx);
            let first = match quorum::next_head(self, s, fx) {
                None => return,
                Some(quorum::Head::Ready(e)) => e,
                Some(quorum::Head::Awaiting(e)) => {
                    // Delivered once durable (quorum.rs).
                    s.ready.push_front(e);
                    return;
                }
            };
            let Some(first) = self.load(s, first, now, fx) else {
                continue;
            };
            let mut m = Some(first);
            let n = s.consumers.len();
            for i in 0..n {
                let idx = (s.next_consumer + i) % n;
                let c = Arc::clone(&s.consumers[idx]);
                let candidate = m.take().expect("message present until delivered");
                let (stored, returns) = (candidate.stored, candidate.returns);
                match c.channel.try_deliver(&c, self, candidate, now) {
                    Ok(()) => {
                        s.next_consumer = (idx + 1) % n;
                        s.last_delivery = Some(now);
                        self.counters.add_delivered();
                        if c.no_ack {
                            // Delivered without ack: it is gone for good.
                            fx.removed.extend(stored);
                        } else {
                            s.unacked += 1;
                            self.mark_delivery(s, stored, returns, fx);
                        }
                        break;
                    }
                    Err(back) => m = Some(back),
                }
            }
            if let Some(back) = m {
                // Every consumer refused: keep it at the head and stop.
                s.ready.push_front(Entry::resident(back));
                return;
            }
        }
    }

    /// Re-runs dispatch (credit was freed, a consumer unblocked).
    pub fn kick(self: &Arc<Self>, now: Instant) {
        self.with_state(now, |q, s, fx| {
            if !s.deleted {
                q.dispatch(s, now, fx);
            }
        });
    }

    /// `basic.get`: the next ready message and how many remain.
    pub fn get(self: &Arc<Self>, no_ack: bool, now: Instant) -> Option<(QueuedMessage, usize)> {
        if self.is_stream() {
            // The server refuses basic.get on a stream (540) before this.
            return None;
        }
        self.with_state(now, |q, s, fx| {
            s.last_used = now;
            q.expire_head(s, now, fx);
            let m = loop {
                let e = match quorum::next_head(q, s, fx)? {
                    quorum::Head::Ready(e) => e,
                    quorum::Head::Awaiting(e) => {
                        s.ready.push_front(e);
                        return None; // get-empty until it is durable
                    }
                };
                if let Some(m) = q.load(s, e, now, fx) {
                    break m;
                }
            };
            if no_ack {
                fx.removed.extend(m.stored);
            } else {
                s.unacked += 1;
                q.mark_delivery(s, m.stored, m.returns, fx);
            }
            q.counters.add_delivered();
            Some((m, s.ready.len))
        })
    }

    /// Acked messages leave for good; frees their credit. `done` runs once
    /// their removal is durable.
    pub fn settle(self: &Arc<Self>, msgs: impl Messages, now: Instant, done: Option<Done>) {
        self.settle_as(Settle::Ack, msgs, now, done, &Origin::default());
    }

    /// Messages that came back unacked (nack/reject with requeue, channel
    /// closed): back to their place, flagged redelivered, unless they hit
    /// the delivery limit.
    pub fn requeue(self: &Arc<Self>, msgs: impl Messages, now: Instant, done: Option<Done>) {
        self.settle_as(Settle::Requeue, msgs, now, done, &Origin::default());
    }

    /// Messages rejected without requeue: dead-lettered or dropped.
    pub fn reject(self: &Arc<Self>, msgs: impl Messages, now: Instant, done: Option<Done>) {
        self.settle_as(Settle::Reject, msgs, now, done, &Origin::default());
    }

    /// Delivered messages come back as `how` says ([`Queue::settle`],
    /// [`Queue::requeue`], [`Queue::reject`]), by `origin`'s ack, nack or
    /// reject (whom the events it causes name).
    pub fn settle_as(
        self: &Arc<Self>,
        how: Settle,
        msgs: impl Messages,
        now: Instant,
        done: Option<Done>,
        origin: &Origin,
    ) {
        let msgs = msgs.into_iter();
        if how == Settle::Ack {
            self.counters.add_acked(msgs.len());
        }
        self.with_state(now, |q, s, fx| {
            fx.origin = origin.clone();
            s.unacked = s.unacked.saturating_sub(msgs.len());
            fx.done = done;
            if s.stream.is_some() {
                // An ack on a stream is credit: nothing leaves it.
                if !s.deleted {
                    q.dispatch(s, now, fx);
                }
                return;
            }
            if how == Settle::Requeue && s.deleted {
                return;
            }
            for mut m in msgs {
                let reason = match how {
                    Settle::Ack => None,
                    Settle::Reject => Some(DeathReason::Rejected),
                    Settle::Requeue => {
                        m.returns += 1;
                        m.redelivered = true;
                        let args = q.args();
                        if delivery_limit(&args).is_none_or(|l| u64::from(m.returns) <= l) {
                            // With delayed retry it waits its backoff first.
                            match retry::due_at(&args.delayed_retry, m.returns, now) {
                                Some(due) => q.start_wait(s, m, due, now, fx),
                                None => q.requeue_counted(s, Entry::resident(m), fx),
                            }
                            continue;
                        }
                        Some(DeathReason::DeliveryLimit)
                    }
                };
                q.drop_message(m, reason, fx);
            }
            if !s.deleted {
                q.dispatch(s, now, fx);
            }
        });
    }

    /// Adds a consumer. Fails (403) if the queue is in exclusive use, or if
    /// an exclusive consumer is asked for while others exist.
    /// `on_added` runs under the queue lock before the first delivery, so a
    /// `consume-ok` written there precedes every `deliver`.
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        now: Instant,
        on_added: impl FnOnce(&str),
    ) -> Result<(), String> {
        self.with_state(now, |q, s, fx| {
            if s.deleted {
                return Err(format!("no queue '{}' in vhost '{}'", q.name, q.vhost_name));
            }
            if s.consumers.iter().any(|x| x.exclusive) || (c.exclusive && !s.consumers.is_empty()) {
                return Err(format!(
                    "queue '{}' in vhost '{}' in exclusive use",
                    q.name, q.vhost_name
                ));
            }
            on_added(&c.tag);
            if let Some(spec) = c.stream_offset {
                q.stream_attach(s, Arc::clone(&c), spec);
            }
            s.consumers.push(c);
            s.had_consumer = true;
            s.last_used = now;
            q.dispatch(s, now, fx);
            Ok(())
        })
    }

    /// Removes a consumer (cancel, channel close). Auto-deletes the queue
    /// when its last consumer goes.
    pub fn remove_consumer(self: &Arc<Self>, consumer: &Arc<Consumer>, now: Instant) {
        self.with_state(now, |q, s, fx| {
            s.consumers.retain(|c| !Arc::ptr_eq(c, consumer));
            q.stream_detach(s, consumer);
            s.last_used = now;
            if s.next_consumer >= s.consumers.len() {
                s.next_consumer = 0;
            }
            if q.auto_delete && s.had_consumer && s.consumers.is_empty() && !s.deleted {
                s.deleted = true;
                fx.delete = true;
            }
        });
    }

    /// Records use for `x-expires` (redeclare).
    pub fn touch(self: &Arc<Self>, now: Instant) {
        self.with_state(now, |_, s, _| s.last_used = now);
    }

    /// Drops every ready message; returns how many.
    pub fn purge(self: &Arc<Self>, now: Instant) -> usize {
        self.with_state(now, |q, s, fx| {
            let mut all = s.ready.drain();
            all.extend(s.retrying.drain());
            let n = all.len();
            for e in all {
                q.drop_entry(s, e, None, now, fx);
            }
            n
        })
    }

    /// Puts back a message recovered from the journal without reading it:
    /// its body stays on disk until it is delivered, and its deadline is
    /// the queue's TTL from `now` until its stored times are read at the
    /// head (`queue/times.rs`). `bytes` is its stored
    /// size; `priority` matters only with `x-max-priority`.
    pub fn restore_paged(self: &Arc<Self>, stored: u64, bytes: u32, priority: u8, now: Instant) {
        self.restore_paged_many(&[(stored, bytes)], priority, now);
    }

    /// [`Self::restore_paged`] of each of `msgs` (stored id, payload
    /// bytes), in order, under one lock: a restart puts millions back,
    /// and the queue is scheduled and its totals reported once per call,
    /// not once per message.
    pub fn restore_paged_many(self: &Arc<Self>, msgs: &[(u64, u32)], priority: u8, now: Instant) {
        if msgs.is_empty() {
            return;
        }
        self.with_state(now, |q, s, _fx| {
            s.pager.restored_at.get_or_insert(now);
            let expires_at = Deadline::new(
                q.args()
                    .message_ttl_ms
                    .map(|ms| now + Duration::from_millis(ms)),
            );
            s.ready.reserve(usize::from(priority), msgs.len());
            for &(stored, bytes) in msgs {
                let seq = s.next_seq;
                s.next_seq += 1;
                s.pager.page_mark = seq;
                s.ready.push_back(Entry {
                    body: Body::Paged {
                        bytes,
                        priority,
                        restored: Restored::Unread,
                    },
                    seq,
                    returns: 0,
                    redelivered: true,
                    expires_at,
                    stored: StoredId::new(Some(stored)),
                });
            }
        });
    }

    /// Marks the queue deleted; returns its ready count and its consumers
    /// (to be told of the cancellation).
    pub(crate) fn mark_deleted(&self) -> (usize, Vec<Arc<Consumer>>, Option<u64>) {
        let mut s = self.state.lock();
        s.deleted = true;
        let n = s.ready.drain().len()
            + s.retrying.drain().len()
            + s.stream.take().map_or(0, |st| st.stats().messages as usize);
        self.report_locked(&mut s);
        (n, std::mem::take(&mut s.consumers), s.pager.paging_id)
    }
}

impl TimerTarget for Queue {
    fn on_timer(self: Arc<Self>, now: Instant) {
        self.run_timer(now);
    }
}
