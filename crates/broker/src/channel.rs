//! The broker side of an AMQP channel: its consumers, the deliveries it has
//! not had acked yet, its prefetch limits and its transaction buffer.
//!
//! Invariants:
//! - Delivery tags on a channel are assigned and written to the connection
//!   under the channel lock, so a client sees them in increasing order.
//! - A message delivered with manual ack is in exactly one place: this
//!   channel's `unacked` map, until it is acked, rejected or requeued.
//! - The channel lock is never held while calling into a queue (lock order
//!   is queue → channel).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::{smallvec, SmallVec};

use crate::durable::{Done, EventSink};
use crate::error::{AmqpError, AmqpResult};
use crate::events::{self, Event, EventKind, Origin};
use crate::message::Message;
use crate::queue::{Consumer, ConsumerChannel, Queue, QueuedMessage, Settle};
use crate::routing::PublishResult;
use crate::vhost::VHost;

/// Where a connection's outgoing deliveries go. Implemented by the server;
/// every call appends whole frames to the connection's output.
pub trait Outlet: Send + Sync {
    /// `basic.deliver` + content.
    fn deliver(
        &self,
        channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
    );
    /// `basic.get-ok` + content.
    fn get_ok(
        &self,
        channel: u16,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
        message_count: u32,
    );
    /// A server-initiated `basic.cancel` (the queue went away).
    fn consumer_cancelled(&self, channel: u16, consumer_tag: &str);
    /// True while the connection's output buffer is over its limit; queues
    /// then hold messages back instead of piling them up in memory.
    fn is_congested(&self) -> bool;
}

/// What a connection shares with its channels.
pub struct Session {
    /// Unique per connection, for exclusive queues.
    pub connection_id: u64,
    pub vhost: Arc<VHost>,
    pub outlet: Arc<dyn Outlet>,
    /// The client asked for `consumer_cancel_notify`.
    pub cancel_notify: bool,
    /// Server-wide consumer acknowledgement timeout.
    pub consumer_timeout_ms: Option<u64>,
    /// The authenticated user, for lifecycle events.
    pub user: Arc<str>,
    /// The event log, if `event_log.enabled`.
    pub events: Option<Arc<dyn EventSink>>,
}

struct Unacked {
    queue: Arc<Queue>,
    msg: QueuedMessage,
    /// The consumer it went to (None for `basic.get`), to return its credit.
    consumer: Option<Arc<Consumer>>,
    /// Consumer timeout deadline and the timeout it came from.
    deadline: Option<(Instant, u64)>,
}

/// Deliveries taken out of `unacked`, in tag order. An ack of one
/// delivery (how PerfTest and most clients ack) takes one, kept inline:
/// settling it allocates nothing here.
type Taken = SmallVec<[(u64, Unacked); 1]>;

/// One queue's share of settled deliveries (inline for one).
type Settled = SmallVec<[QueuedMessage; 1]>;

/// A buffered transactional operation.
enum TxOp {
    Publish {
        exchange: String,
        msg: Arc<Message>,
        mandatory: bool,
    },
    /// Deliveries acked, rejected or nacked inside the transaction: out of
    /// `unacked` at once (a second ack of the same tag is refused, as in
    /// RabbitMQ), settled at commit, put back at rollback, requeued if the
    /// channel closes first. Their prefetch credit returns at commit.
    Settle { taken: Taken, how: Settle },
}

/// The outcome of a publish, for confirms and `basic.return`.
pub struct Published {
    pub msg: Arc<Message>,
    pub mandatory: bool,
    pub result: PublishResult,
}

#[derive(Default)]
struct ChannelState {
    closed: bool,
    next_delivery_tag: u64,
    unacked: BTreeMap<u64, Unacked>,
    /// `basic.qos global=false`: limit for consumers created afterwards.
    consumer_prefetch: u16,
    /// `basic.qos global=true`: limit shared by all consumers of the channel.
    channel_prefetch: u16,
    channel_in_flight: u32,
    consumers: HashMap<String, Arc<Consumer>>,
    /// `Some` once `tx.select` was sent.
    tx: Option<Vec<TxOp>>,
    next_consumer_tag: u64,
}

/// A channel.
pub struct Channel {
    pub id: u16,
    pub session: Arc<Session>,
    state: Mutex<ChannelState>,
}

impl Channel {
    pub fn new(id: u16, session: Arc<Session>) -> Arc<Self> {
        Arc::new(Self {
            id,
            session,
            state: Mutex::new(ChannelState {
                next_delivery_tag: 1,
                ..ChannelState::default()
            }),
        })
    }

    /// `basic.qos`.
    pub fn qos(&self, prefetch_count: u16, global: bool, now: Instant) {
        let queues = {
            let mut st = self.state.lock();
            if global {
                st.channel_prefetch = prefetch_count;
            } else {
                // RabbitMQ 3.10 (rabbit_limiter:unlimit_prefetch): a
                // per-consumer qos also lifts the channel-wide limit.
                st.consumer_prefetch = prefetch_count;
                st.channel_prefetch = 0;
            }
            consumer_queues(&st)
        };
        for q in queues {
            q.kick(now);
        }
    }

    /// `basic.consume`. Returns the consumer tag (generated if empty).
    pub fn consume(
        self: &Arc<Self>,
        queue: Arc<Queue>,
        tag: &str,
        no_ack: bool,
        exclusive: bool,
        now: Instant,
        on_added: impl FnOnce(&str),
    ) -> AmqpResult<String> {
        let none = berth_protocol::FieldTable::default();
        self.consume_with(queue, tag, no_ack, exclusive, &none, now, on_added)
    }

    /// [`Channel::consume`] with the consume arguments (`x-stream-offset`
    /// on a stream).
    #[allow(clippy::too_many_arguments)] // basic.consume's fields
    pub fn consume_with(
        self: &Arc<Self>,
        queue: Arc<Queue>,
        tag: &str,
        no_ack: bool,
        exclusive: bool,
        arguments: &berth_protocol::FieldTable,
        now: Instant,
        on_added: impl FnOnce(&str),
    ) -> AmqpResult<String> {
        let consumer = {
            let mut st = self.state.lock();
            let stream_offset = if queue.is_stream() {
                let (prefetch, global) = (st.consumer_prefetch, st.channel_prefetch);
                Some(crate::stream::consume::check(
                    &queue.name,
                    &queue.vhost_name,
                    no_ack,
                    prefetch,
                    global,
                    arguments,
                    self.session.vhost.unix_time_ms(),
                )?)
            } else {
                None
            };
            let tag = if tag.is_empty() {
                st.next_consumer_tag += 1;
                format!("amq.ctag-berth-{}-{}", self.id, st.next_consumer_tag)
            } else {
                tag.to_owned()
            };
            if st.consumers.contains_key(&tag) {
                return Err(AmqpError::not_allowed(format!(
                    "attempt to reuse consumer tag '{tag}'"
                )));
            }
            (self.session.vhost.count_limits()).check_new_consumer(st.consumers.len())?;
            let c = Arc::new(Consumer {
                tag: tag.clone(),
                channel: Arc::clone(self) as Arc<dyn ConsumerChannel>,
                queue: Arc::clone(&queue),
                no_ack,
                exclusive,
                prefetch: st.consumer_prefetch,
                in_flight: AtomicU32::new(0),
                stream_offset,
            });
            st.consumers.insert(tag, Arc::clone(&c));
            c
        };
        if let Err(text) = queue.add_consumer(Arc::clone(&consumer), now, on_added) {
            self.state.lock().consumers.remove(&consumer.tag);
            return Err(if text.starts_with("no queue") {
                AmqpError::not_found(text)
            } else {
                AmqpError::access_refused(text)
            });
        }
        Ok(consumer.tag.clone())
    }

    /// `basic.cancel` from the client. Unknown tags are not an error (AMQP).
    pub fn cancel(self: &Arc<Self>, tag: &str, now: Instant) {
        let c = self.state.lock().consumers.remove(tag);
        if let Some(c) = c {
            c.queue.remove_consumer(&c, now);
        }
    }

    /// `basic.get`. Writes `get-ok` itself; returns false for `get-empty`.
    pub fn get(&self, queue: &Arc<Queue>, no_ack: bool, now: Instant) -> bool {
        let Some((msg, remaining)) = queue.get(no_ack, now) else {
            return false;
        };
        let mut st = self.state.lock();
        if st.closed {
            drop(st);
            if no_ack {
                return false;
            }
            queue.requeue(vec![msg], now, None);
            return false;
        }
        let tag = st.next_delivery_tag;
        st.next_delivery_tag += 1;
        let count = u32::try_from(remaining).unwrap_or(u32::MAX);
        self.session
            .outlet
            .get_ok(self.id, tag, msg.redelivered, &msg.msg, count);
        if self.session.events.is_some() {
            let one = std::slice::from_ref(&msg);
            self.note(EventKind::Delivered, queue, one, "basic.get");
            if no_ack {
                self.note(EventKind::Acked, queue, one, "no_ack");
            }
        }
        if !no_ack {
            st.unacked.insert(
                tag,
                Unacked {
                    queue: Arc::clone(queue),
                    msg,
                    consumer: None,
                    deadline: None,
                },
            );
        }
        true
    }

    /// `tx.select`.
    pub fn tx_select(&self) {
        let mut st = self.state.lock();
        if st.tx.is_none() {
            st.tx = Some(Vec::new());
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.state.lock().tx.is_some()
    }

    /// `basic.publish`: routes now, or buffers it in a transaction (then
    /// returns `None`). `durable` makes the completion that runs once the
    /// message is stored; it is called only if the message is journaled.
    pub fn publish(
        &self,
        exchange: &str,
        msg: Arc<Message>,
        mandatory: bool,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
    ) -> AmqpResult<Option<Published>> {
        {
            let mut st = self.state.lock();
            if let Some(tx) = st.tx.as_mut() {
                // Check the exchange now so the error points at the publish.
                self.session.vhost.check_publish_target(exchange)?;
                check_tx_room(tx)?;
                tx.push(TxOp::Publish {
                    exchange: exchange.to_owned(),
                    msg,
                    mandatory,
                });
                return Ok(None);
            }
        }
        let result = self.route(exchange, &msg, now, durable)?;
        Ok(Some(Published {
            msg,
            mandatory,
            result,
        }))
    }

    /// Routes a publish; with the event log on, the events it causes name
    /// this connection and user.
    fn route(
        &self,
        exchange: &str,
        msg: &Arc<Message>,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
    ) -> AmqpResult<crate::routing::PublishResult> {
        let origin = self.origin();
        (self.session.vhost).publish_from(exchange, msg, now, durable, &origin)
    }

    /// This channel's client as the origin of the events its operations
    /// cause; with the event log off no one asks, and nothing is cloned.
    fn origin(&self) -> Origin {
        match self.session.events {
            None => Origin::default(),
            Some(_) => Origin::client(self.session.connection_id, &self.session.user),
        }
    }

    /// Reports `kind` for `msgs` of `queue` (if the event log is on).
    fn note(&self, kind: EventKind, queue: &Queue, msgs: &[QueuedMessage], detail: &str) {
        let Some(sink) = self.session.events.as_deref() else {
            return;
        };
        for m in msgs {
            let ev = Event {
                kind,
                reason: None,
                vhost: &queue.vhost_name,
                queue: &queue.name,
                queue_store_id: queue.store_id,
                msg: m.msg.id,
                size: m.msg.body_bytes(),
                connection: self.session.connection_id,
                user: &self.session.user,
                detail,
            };
            events::emit(sink, &ev);
        }
    }

    /// `basic.ack`.
    pub fn ack(&self, tag: u64, multiple: bool, now: Instant) -> AmqpResult<()> {
        self.settle_or_buffer(tag, multiple, Settle::Ack, now)
    }

    /// `basic.nack` / `basic.reject`.
    pub fn nack(&self, tag: u64, multiple: bool, requeue: bool, now: Instant) -> AmqpResult<()> {
        let how = if requeue {
            Settle::Requeue
        } else {
            Settle::Reject
        };
        self.settle_or_buffer(tag, multiple, how, now)
    }

    /// Settles the deliveries `tag`/`multiple` name now, or moves them into
    /// the open transaction.
    fn settle_or_buffer(
        &self,
        tag: u64,
        multiple: bool,
        how: Settle,
        now: Instant,
    ) -> AmqpResult<()> {
        let (taken, kick) = {
            let mut st = self.state.lock();
            check_tag(&st, tag, multiple)?;
            if how != Settle::Ack {
                refuse_stream_nack(&st, tag, multiple)?;
            }
            if let Some(tx) = st.tx.as_ref() {
                check_tx_room(tx)?;
                let taken = remove_unacked(&mut st, tag, multiple);
                if let Some(tx) = st.tx.as_mut() {
                    tx.push(TxOp::Settle { taken, how });
                }
                return Ok(());
            }
            let taken = remove_unacked(&mut st, tag, multiple);
            release_credit(&mut st, &taken);
            (taken, prefetch_waiters(&st))
        };
        self.settle(taken, how, "", now, kick, None);
        Ok(())
    }

    /// Hands settled deliveries to their queues, then lets the queues in
    /// `kick` (waiting on the channel's prefetch) deliver again.
    fn settle(
        &self,
        taken: Taken,
        how: Settle,
        detail: &str,
        now: Instant,
        mut kick: Vec<Arc<Queue>>,
        mut durable: Option<&mut dyn FnMut() -> Done>,
    ) {
        for (queue, msgs) in group_by_queue(taken.into_iter().map(|(_, u)| u)) {
            kick.retain(|q| !Arc::ptr_eq(q, &queue));
            let done = durable.as_mut().map(|f| f());
            let kind = match how {
                Settle::Ack => EventKind::Acked,
                Settle::Requeue => EventKind::Requeued,
                Settle::Reject => EventKind::Rejected,
            };
            self.note(kind, &queue, &msgs, detail);
            // Dead letters and drops that a nack causes name its client.
            let origin = self.origin();
            queue.settle_as(how, msgs, now, done, &origin);
        }
        for q in kick {
            q.kick(now);
        }
    }

    /// `tx.commit`: applies buffered publishes and acks, in order. Returns the
    /// publishes' outcomes (for `basic.return`). `durable` makes one
    /// completion per journal write the commit depends on; `commit-ok` is due
    /// once all have run.
    pub fn tx_commit(
        &self,
        now: Instant,
        durable: &mut dyn FnMut() -> Done,
    ) -> AmqpResult<Vec<Published>> {
        let ops = {
            let mut st = self.state.lock();
            match st.tx.as_mut() {
                None => {
                    return Err(AmqpError::precondition_failed(
                        "channel is not transactional",
                    ))
                }
                Some(tx) => std::mem::take(tx),
            }
        };
        let mut published = Vec::new();
        for op in ops {
            match op {
                TxOp::Publish {
                    exchange,
                    msg,
                    mandatory,
                } => {
                    let result = self.route(&exchange, &msg, now, durable)?;
                    published.push(Published {
                        msg,
                        mandatory,
                        result,
                    });
                }
                TxOp::Settle { taken, how } => {
                    let kick = {
                        let mut st = self.state.lock();
                        release_credit(&mut st, &taken);
                        prefetch_waiters(&st)
                    };
                    self.settle(taken, how, "", now, kick, Some(durable));
                }
            }
        }
        Ok(published)
    }

    /// `tx.rollback`: drops buffered publishes; deliveries acked in the
    /// transaction are unacknowledged again, under their tags.
    pub fn tx_rollback(&self) -> AmqpResult<()> {
        let mut st = self.state.lock();
        let Some(tx) = st.tx.as_mut() else {
            return Err(AmqpError::precondition_failed(
                "channel is not transactional",
            ));
        };
        for op in std::mem::take(tx) {
            if let TxOp::Settle { taken, .. } = op {
                st.unacked.extend(taken);
            }
        }
        Ok(())
    }

    /// `basic.recover requeue=true`: every unacked delivery goes back.
    pub fn recover(&self, now: Instant) {
        let taken = {
            let mut st = self.state.lock();
            let all = remove_unacked(&mut st, 0, true);
            release_credit(&mut st, &all);
            all
        };
        self.settle(
            taken,
            Settle::Requeue,
            "basic.recover",
            now,
            Vec::new(),
            None,
        );
    }

    /// The consumer timeout that expired first, if any delivery is overdue.
    pub fn overdue_delivery(&self, now: Instant) -> Option<u64> {
        let st = self.state.lock();
        st.unacked
            .values()
            .filter_map(|u| u.deadline)
            .find(|(at, _)| *at <= now)
            .map(|(_, ms)| ms)
    }

    /// The connection's output drained: let queues deliver again.
    pub fn resume(&self, now: Instant) {
        let queues = consumer_queues(&self.state.lock());
        for q in queues {
            q.kick(now);
        }
    }

    pub fn consumer_count(&self) -> usize {
        self.state.lock().consumers.len()
    }

    pub fn unacked_count(&self) -> usize {
        self.state.lock().unacked.len()
    }

    /// Channel closed (by either side, or the connection went away):
    /// consumers are cancelled and unacked deliveries requeued.
    pub fn close(self: &Arc<Self>, now: Instant) {
        let (consumers, unacked) = {
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            let mut unacked: Vec<Unacked> = std::mem::take(&mut st.unacked).into_values().collect();
            for op in st.tx.take().unwrap_or_default() {
                if let TxOp::Settle { taken, .. } = op {
                    unacked.extend(taken.into_iter().map(|(_, u)| u));
                }
            }
            (std::mem::take(&mut st.consumers), unacked)
        };
        for c in consumers.into_values() {
            c.queue.remove_consumer(&c, now);
        }
        for (queue, msgs) in group_by_queue(unacked) {
            self.note(EventKind::Requeued, &queue, &msgs, "channel closed");
            queue.requeue(msgs, now, None);
        }
    }
}

impl ConsumerChannel for Channel {
    fn try_deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        msg: QueuedMessage,
        now: Instant,
    ) -> Result<(), QueuedMessage> {
        let mut st = self.state.lock();
        if st.closed || self.session.outlet.is_congested() {
            return Err(msg);
        }
        if !consumer.no_ack {
            if !consumer.below_prefetch() {
                return Err(msg);
            }
            if st.channel_prefetch > 0 && st.channel_in_flight >= u32::from(st.channel_prefetch) {
                return Err(msg);
            }
        }
        let tag = st.next_delivery_tag;
        st.next_delivery_tag += 1;
        self.session
            .outlet
            .deliver(self.id, &consumer.tag, tag, msg.redelivered, &msg.msg);
        if self.session.events.is_some() {
            let one = std::slice::from_ref(&msg);
            self.note(EventKind::Delivered, queue, one, &consumer.tag);
            if consumer.no_ack {
                self.note(EventKind::Acked, queue, one, "no_ack");
            }
        }
        if !consumer.no_ack {
            consumer.in_flight.fetch_add(1, Ordering::Relaxed);
            st.channel_in_flight += 1;
            let timeout = queue
                .args()
                .consumer_timeout_ms
                .or(self.session.consumer_timeout_ms);
            st.unacked.insert(
                tag,
                Unacked {
                    queue: Arc::clone(queue),
                    msg,
                    consumer: Some(Arc::clone(consumer)),
                    deadline: timeout.map(|ms| (now + Duration::from_millis(ms), ms)),
                },
            );
        }
        Ok(())
    }

    fn consumer_gone(&self, tag: &str) {
        let removed = self.state.lock().consumers.remove(tag).is_some();
        if removed && self.session.cancel_notify {
            self.session.outlet.consumer_cancelled(self.id, tag);
        }
    }
}

/// An open transaction takes one more operation only below
/// [`crate::limits::TX_OPERATIONS_MAX`] (its messages count toward the
/// memory alarm already; this bounds the bookkeeping around them).
fn check_tx_room(tx: &[TxOp]) -> AmqpResult<()> {
    if tx.len() >= crate::limits::TX_OPERATIONS_MAX {
        return Err(AmqpError::precondition_failed(format!(
            "the transaction holds {} publishes and acks, the maximum (TX_OPERATIONS_MAX); commit or roll back first",
            tx.len()
        )));
    }
    Ok(())
}

/// Takes the deliveries `tag`/`multiple` name out of `unacked` (multiple
/// with tag 0: all of them), leaving their prefetch credit taken.
fn remove_unacked(st: &mut ChannelState, tag: u64, multiple: bool) -> Taken {
    if !multiple {
        return st.unacked.remove_entry(&tag).into_iter().collect();
    }
    let rest = if tag == 0 {
        BTreeMap::new()
    } else {
        st.unacked.split_off(&(tag + 1))
    };
    std::mem::replace(&mut st.unacked, rest)
        .into_iter()
        .collect()
}

/// Returns the prefetch credit of settled deliveries to their consumers
/// and to the channel.
fn release_credit(st: &mut ChannelState, settled: &Taken) {
    for (_, u) in settled {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::Relaxed);
            st.channel_in_flight = st.channel_in_flight.saturating_sub(1);
        }
    }
}

/// The queues to kick after credit returned: with a channel-wide prefetch,
/// every queue this channel consumes from may be waiting on it.
fn prefetch_waiters(st: &ChannelState) -> Vec<Arc<Queue>> {
    if st.channel_prefetch > 0 {
        consumer_queues(st)
    } else {
        Vec::new()
    }
}

/// RabbitMQ refuses `basic.nack` and `basic.reject` of a stream's
/// deliveries with 540: a stream has nothing to requeue or drop.
fn refuse_stream_nack(st: &ChannelState, tag: u64, multiple: bool) -> AmqpResult<()> {
    let named = |t: &u64| {
        if multiple {
            tag == 0 || *t <= tag
        } else {
            *t == tag
        }
    };
    match st
        .unacked
        .iter()
        .find(|(t, u)| named(t) && u.queue.is_stream())
    {
        Some((_, u)) => Err(AmqpError::not_implemented(format!(
            "basic.nack and basic.reject not supported by stream queues queue '{}' in vhost '{}'",
            u.queue.name, u.queue.vhost_name
        ))),
        None => Ok(()),
    }
}

fn check_tag(st: &ChannelState, tag: u64, multiple: bool) -> AmqpResult<()> {
    let known = if multiple {
        tag == 0 || st.unacked.contains_key(&tag) || st.unacked.range(..=tag).next().is_some()
    } else {
        st.unacked.contains_key(&tag)
    };
    if known {
        Ok(())
    } else {
        Err(AmqpError::precondition_failed(format!(
            "unknown delivery tag {tag}"
        )))
    }
}

fn consumer_queues(st: &ChannelState) -> Vec<Arc<Queue>> {
    let mut out: Vec<Arc<Queue>> = Vec::new();
    for c in st.consumers.values() {
        if !out.iter().any(|q| Arc::ptr_eq(q, &c.queue)) {
            out.push(Arc::clone(&c.queue));
        }
    }
    out
}

fn group_by_queue(
    taken: impl IntoIterator<Item = Unacked>,
) -> SmallVec<[(Arc<Queue>, Settled); 1]> {
    let mut out: SmallVec<[(Arc<Queue>, Settled); 1]> = SmallVec::new();
    for u in taken {
        match out.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &u.queue)) {
            Some((_, v)) => v.push(u.msg),
            None => out.push((u.queue, smallvec![u.msg])),
        }
    }
    out
}
