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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use berth_protocol::FieldTable;
use parking_lot::Mutex;

use crate::args::{Overflow, QueueArgs};
use crate::channel::Channel;
use crate::durable::{Done, PAGING_BIT};
use crate::message::Message;
use crate::vhost::VHost;

/// Why a message was dead-lettered (the `reason` of `x-death`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathReason {
    Rejected,
    Expired,
    MaxLen,
    DeliveryLimit,
}

impl DeathReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::MaxLen => "maxlen",
            Self::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A message in a queue: the shared message plus this queue's bookkeeping.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub msg: Arc<Message>,
    /// Position in publish order, for requeueing to the original place.
    pub seq: u64,
    /// Times it came back unacknowledged (nack/reject with requeue, channel
    /// closed); drives `redelivered` and `x-delivery-limit`.
    pub returns: u32,
    /// Delivered at least once before.
    pub redelivered: bool,
    /// When it expires (queue TTL or per-message expiration).
    pub expires_at: Option<Instant>,
    /// Its id in the journal, if it is stored there (persistent message in
    /// a durable queue); its removal must then be journaled too.
    pub stored: Option<u64>,
}

/// What a ready entry holds of its message.
#[derive(Debug, Clone)]
enum Body {
    Resident(Arc<Message>),
    /// Only in the journal (under the entry's `stored` id): read back when
    /// it is delivered, fetched or dead-lettered.
    Paged {
        /// Body bytes (for restored messages: the stored payload's length).
        bytes: u32,
        priority: u8,
        /// Restored at startup without being read: its `expiration` is
        /// checked when it is read, counted from the restart.
        restored: bool,
    },
}

/// A ready message: its body (in memory or only in the journal) and this
/// queue's bookkeeping. Kept small: a deep queue holds millions of these.
#[derive(Debug, Clone)]
struct Entry {
    body: Body,
    seq: u64,
    returns: u32,
    redelivered: bool,
    expires_at: Option<Instant>,
    stored: Option<u64>,
}

impl Entry {
    fn resident(m: QueuedMessage) -> Self {
        Self {
            body: Body::Resident(m.msg),
            seq: m.seq,
            returns: m.returns,
            redelivered: m.redelivered,
            expires_at: m.expires_at,
            stored: m.stored,
        }
    }

    fn priority(&self) -> u8 {
        match &self.body {
            Body::Resident(m) => m.priority,
            Body::Paged { priority, .. } => *priority,
        }
    }

    fn bytes(&self) -> u64 {
        match &self.body {
            Body::Resident(m) => m.body_bytes(),
            Body::Paged { bytes, .. } => u64::from(*bytes),
        }
    }

    fn with_message(self, msg: Arc<Message>) -> QueuedMessage {
        QueuedMessage {
            msg,
            seq: self.seq,
            returns: self.returns,
            redelivered: self.redelivered,
            expires_at: self.expires_at,
            stored: self.stored,
        }
    }
}

/// Enqueues between two paging scans of a queue past its resident window.
const PAGE_SCAN_EVERY: u64 = 64;

/// Ready messages above which a queue whose consumers are busy counts as
/// backlogged: they are not keeping up, and publishers to it are slowed
/// down (flow control) so the backlog, and the latency it adds, stays
/// bounded. A queue whose consumers deliver nothing (all stuck at their
/// prefetch limit) is not backlogged: it grows, as in RabbitMQ.
pub const FLOW_READY_MAX: usize = 256;

/// A queue whose last delivery is older than this has no busy consumers.
const FLOW_ACTIVE: Duration = Duration::from_millis(100);

/// Paged-out messages read back together when a queue needs one.
const READ_AHEAD: usize = 64;

/// A restored message's expiry: its `expiration` counts from the restart
/// (the earlier of that and `current`, the queue TTL's deadline).
fn restored_expiry(
    current: Option<Instant>,
    msg: &Message,
    restored_at: Option<Instant>,
) -> Option<Instant> {
    let own = msg
        .expiration_ms
        .zip(restored_at)
        .map(|(ms, at)| at + Duration::from_millis(ms));
    match (current, own) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A consumer attached to a queue.
pub struct Consumer {
    pub tag: String,
    pub channel: Arc<Channel>,
    pub queue: Arc<Queue>,
    pub no_ack: bool,
    pub exclusive: bool,
    /// Per-consumer prefetch (0 = unlimited).
    pub prefetch: u16,
    /// Deliveries not yet acked, checked against `prefetch` under the
    /// channel lock.
    pub in_flight: AtomicU32,
}

/// A dead letter to be republished once the queue lock is released.
pub struct DeadLetter {
    pub msg: Arc<Message>,
    pub reason: DeathReason,
}

/// Work a queue operation leaves for after its lock is released.
#[derive(Default)]
pub struct Effects {
    pub dead: Vec<DeadLetter>,
    /// Stored messages that left the queue: journal their removal.
    pub removed: Vec<u64>,
    /// Completion to run once the removals are durable (transactions).
    pub done: Option<Done>,
    /// The queue should be deleted (auto-delete or x-expires).
    pub delete: bool,
    /// The queue's paging id, for removals of paging copies.
    pub paging_id: Option<u64>,
    pub timer_at: Option<Instant>,
}

/// Ready messages, one FIFO per priority level (one level without
/// `x-max-priority`).
struct Ready {
    levels: Vec<VecDeque<Entry>>,
    len: usize,
    bytes: u64,
    /// Entries whose body is in memory.
    resident: usize,
}

impl Ready {
    fn new(max_priority: Option<u8>) -> Self {
        let n = max_priority.map_or(1, |p| usize::from(p) + 1);
        Self {
            levels: (0..n).map(|_| VecDeque::new()).collect(),
            len: 0,
            bytes: 0,
            resident: 0,
        }
    }

    fn level_of(&self, e: &Entry) -> usize {
        usize::from(e.priority()).min(self.levels.len() - 1)
    }

    fn count_in(&mut self, e: &Entry) {
        self.len += 1;
        self.bytes += e.bytes();
        if matches!(e.body, Body::Resident(_)) {
            self.resident += 1;
        }
    }

    fn count_out(&mut self, e: &Entry) {
        self.len -= 1;
        self.bytes -= e.bytes();
        if matches!(e.body, Body::Resident(_)) {
            self.resident -= 1;
        }
    }

    fn push_back(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        self.levels[l].push_back(e);
    }

    /// Puts a message back at its publish-order position.
    fn insert_by_seq(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        let q = &mut self.levels[l];
        let at = q.partition_point(|x| x.seq < e.seq);
        q.insert(at, e);
    }

    fn push_front(&mut self, e: Entry) {
        let l = self.level_of(&e);
        self.count_in(&e);
        self.levels[l].push_front(e);
    }

    fn front(&self) -> Option<&Entry> {
        self.levels.iter().rev().find_map(|q| q.front())
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let e = self.levels.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.count_out(&e);
        Some(e)
    }

    fn drain(&mut self) -> Vec<Entry> {
        self.len = 0;
        self.bytes = 0;
        self.resident = 0;
        self.levels.iter_mut().flat_map(|q| q.drain(..)).collect()
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
    /// Entries with `seq` up to this were already considered for paging.
    page_mark: u64,
    /// Journal queue id (with [`PAGING_BIT`]) under which paging copies of
    /// this queue's messages are written; allocated on first use.
    paging_id: Option<u64>,
    /// Last delivery to a consumer (flow control: are consumers busy?).
    last_delivery: Option<Instant>,
    /// When messages were restored from the journal (their per-message
    /// `expiration` counts from here).
    restored_at: Option<Instant>,
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
}

/// A queue.
pub struct Queue {
    pub name: String,
    pub vhost: Weak<VHost>,
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
    pub args: QueueArgs,
    state: Mutex<QueueState>,
    /// See [`FLOW_READY_MAX`]; updated after every operation, read without
    /// the lock on publish.
    backlogged: AtomicBool,
    /// Bindings where this queue is the destination: (exchange, key, args),
    /// so deleting the queue can remove them.
    pub(crate) bound_from: Mutex<Vec<(String, String, FieldTable)>>,
}

impl Queue {
    #[allow(clippy::too_many_arguments)] // one per part of a queue's identity
    pub(crate) fn new(
        name: String,
        vhost: Weak<VHost>,
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
                page_mark: 0,
                paging_id: None,
                last_delivery: None,
                restored_at: None,
            }),
            name,
            vhost,
            vhost_name,
            durable,
            auto_delete,
            exclusive_owner,
            store_id,
            arguments,
            args,
            bound_from: Mutex::new(Vec::new()),
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
            && s.last_delivery
                .is_some_and(|t| now.saturating_duration_since(t) < FLOW_ACTIVE)
    }

    pub fn stats(&self) -> QueueStats {
        let s = self.state.lock();
        QueueStats {
            ready: s.ready.len,
            ready_bytes: s.ready.bytes,
            paged_out: s.ready.len - s.ready.resident,
            unacked: s.unacked,
            consumers: s.consumers.len(),
        }
    }

    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }

    /// Runs `f` under the lock, then carries out the effects it collected.
    fn with_state<R>(
        self: &Arc<Self>,
        now: Instant,
        f: impl FnOnce(&Arc<Self>, &mut QueueState, &mut Effects) -> R,
    ) -> R {
        let mut fx = Effects::default();
        let r = {
            let mut s = self.state.lock();
            let r = f(self, &mut s, &mut fx);
            if !s.deleted {
                fx.timer_at = self.schedule(&mut s, now);
            }
            fx.paging_id = s.paging_id;
            let backlogged = s.ready.len > FLOW_READY_MAX && Self::busy(&s, now);
            if backlogged != self.backlogged.load(Ordering::Relaxed) {
                self.backlogged.store(backlogged, Ordering::Relaxed);
            }
            r
        };
        self.apply(fx);
        r
    }

    fn apply(self: &Arc<Self>, fx: Effects) {
        let Some(vhost) = self.vhost.upgrade() else {
            return;
        };
        if let Some(at) = fx.timer_at {
            vhost.timers.schedule(at, Arc::downgrade(self));
        }
        // Paging copies (PAGING_BIT) go to the queue's paging id; their
        // removal is never waited for.
        let (paging, removed): (Vec<u64>, Vec<u64>) =
            fx.removed.iter().partition(|id| *id & PAGING_BIT != 0);
        if let (Some(pid), false) = (fx.paging_id, paging.is_empty()) {
            let ids: Vec<u64> = paging.iter().map(|id| id & !PAGING_BIT).collect();
            vhost.journal().remove(pid, &ids, None);
        }
        match (self.store_id, removed.is_empty()) {
            (Some(qid), false) => vhost.journal().remove(qid, &removed, fx.done),
            _ => {
                if let Some(d) = fx.done {
                    d(Ok(()));
                }
            }
        }
        for d in fx.dead {
            vhost.dead_letter(self, d);
        }
        if fx.delete {
            vhost.remove_queue(&self.name);
        }
    }

    /// The next moment this queue needs attention, if newer than what is
    /// already registered.
    fn schedule(&self, s: &mut QueueState, now: Instant) -> Option<Instant> {
        let ttl = s.ready.front().and_then(|m| m.expires_at);
        let expiry = self
            .args
            .expires_ms
            .filter(|_| s.consumers.is_empty())
            .map(|ms| s.last_used + Duration::from_millis(ms));
        let next = match (ttl, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        let next = next.max(now);
        match s.timer_at {
            Some(t) if t <= next && t > now => None,
            _ => {
                s.timer_at = Some(next);
                Some(next)
            }
        }
    }

    /// Called by the timer service.
    pub fn on_timer(self: &Arc<Self>, now: Instant) {
        self.with_state(now, |q, s, fx| {
            if s.timer_at.is_some_and(|t| t <= now) {
                s.timer_at = None;
            }
            q.expire_head(s, now, fx);
            if let Some(ms) = q.args.expires_ms {
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

    /// Drops expired messages at the head, dead-lettering them.
    fn expire_head(&self, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        self.drop_expired(s, now, false, fx);
    }

    /// Drops messages at the head that expired before `now` (or at it, with
    /// `including_now`: a TTL of 0 means "deliver now or never").
    fn drop_expired(
        &self,
        s: &mut QueueState,
        now: Instant,
        including_now: bool,
        fx: &mut Effects,
    ) {
        while let Some(m) = s.ready.front() {
            match m.expires_at {
                Some(t) if t < now || (including_now && t == now) => {
                    let e = s.ready.pop_front().expect("front exists");
                    self.drop_entry(s, e, Some(DeathReason::Expired), now, fx);
                }
                _ => break,
            }
        }
    }

    /// A message leaves the queue for good: its removal is journaled if it
    /// was stored, and it is dead-lettered if a reason is given and the
    /// queue has a dead-letter exchange.
    fn drop_message(&self, m: QueuedMessage, reason: Option<DeathReason>, fx: &mut Effects) {
        if let Some(id) = m.stored {
            fx.removed.push(id);
        }
        if let Some(reason) = reason {
            if self.args.dead_letter_exchange.is_some() {
                fx.dead.push(DeadLetter { msg: m.msg, reason });
            }
        }
    }

    /// [`Queue::drop_message`] for a ready entry: its body is read back
    /// only if it is to be dead-lettered.
    fn drop_entry(
        &self,
        s: &mut QueueState,
        e: Entry,
        reason: Option<DeathReason>,
        now: Instant,
        fx: &mut Effects,
    ) {
        let dead_letter = reason.is_some() && self.args.dead_letter_exchange.is_some();
        if dead_letter || matches!(e.body, Body::Resident(_)) {
            if let Some(m) = self.load(s, e, now, fx) {
                self.drop_message(m, reason, fx);
            }
        } else if let Some(id) = e.stored {
            fx.removed.push(id);
        }
    }

    /// The entry with its message in memory, read back from the journal if
    /// it was paged out (with read-ahead: the paged entries right behind it
    /// are read in the same call and become resident). `None` if it expired
    /// meanwhile (then it was dropped) or cannot be read (then it stays in
    /// the journal, and is logged: a restart brings it back).
    fn load(
        &self,
        s: &mut QueueState,
        e: Entry,
        now: Instant,
        fx: &mut Effects,
    ) -> Option<QueuedMessage> {
        let restored = match e.body {
            Body::Resident(ref m) => {
                let m = Arc::clone(m);
                return Some(e.with_message(m));
            }
            Body::Paged { restored, .. } => restored,
        };
        // A paging copy is read from the queue's paging id, a stored
        // message from its durable id; read-ahead takes neighbours of the
        // same kind.
        let kind = e.stored.map(|id| id & PAGING_BIT);
        let qid = match kind {
            Some(0) => self.store_id,
            _ => s.paging_id,
        };
        let (Some(qid), Some(id), Some(vhost)) = (qid, e.stored, self.vhost.upgrade()) else {
            tracing::error!(queue = %self.name, "a paged-out message has no journal id; dropped from memory");
            return None;
        };
        let level = s.ready.level_of(&e);
        let ahead = s.ready.levels[level]
            .iter()
            .take(READ_AHEAD - 1)
            .map_while(|x| match (&x.body, x.stored) {
                (Body::Paged { .. }, Some(id)) if Some(id & PAGING_BIT) == kind => Some(id),
                _ => None,
            });
        let ids: Vec<u64> = std::iter::once(id)
            .chain(ahead)
            .map(|id| id & !PAGING_BIT)
            .collect();
        let mut read = vhost.journal().read_many(qid, &ids).into_iter();
        let decode = |r: Option<Result<bytes::Bytes, crate::durable::JournalError>>| {
            r.unwrap_or_else(|| Err(crate::durable::JournalError("no result".into())))
                .map_err(|err| err.to_string())
                .and_then(|p| Message::from_stored(&p))
        };
        let first = decode(read.next());
        // The read-ahead entries become resident; one that fails stays
        // paged and reports its error when its turn comes.
        for (x, r) in s.ready.levels[level].iter_mut().zip(read) {
            let Ok(msg) = decode(Some(r)) else {
                continue;
            };
            if let Body::Paged { restored: true, .. } = x.body {
                x.expires_at = restored_expiry(x.expires_at, &msg, s.restored_at);
            }
            x.body = Body::Resident(msg);
            s.ready.resident += 1;
        }
        let msg = match first {
            Ok(m) => m,
            Err(why) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost_name, msg = id, "stored message cannot be read back ({why}); it stays in the journal and returns after a restart");
                return None;
            }
        };
        let m = e.with_message(msg);
        if restored {
            if let Some(t) = restored_expiry(None, &m.msg, s.restored_at) {
                if t <= now {
                    self.drop_message(m, Some(DeathReason::Expired), fx);
                    return None;
                }
            }
        }
        Some(m)
    }

    /// Moves bodies beyond the resident window out of memory; they are read
    /// back when needed. A stored message (persistent, durable queue)
    /// leaves once the journal has written it. Any other message is first
    /// written as a paging copy (under the queue's paging id, not waited
    /// for, never recovered) and leaves on a later scan, once written.
    /// Scans only entries newer than the last scan (plus those not yet
    /// written then), so its cost is proportional to what was published.
    fn page_out(&self, s: &mut QueueState) {
        let Some(vhost) = self.vhost.upgrade() else {
            return;
        };
        let window = vhost.resident_messages_max();
        if s.ready.resident <= window || !vhost.journal().pages() {
            return;
        }
        let mark = s.page_mark;
        // (level, index, journal id); a paging copy's id carries PAGING_BIT.
        let mut candidates: Vec<(usize, usize, u64)> = Vec::new();
        let mut to_copy: Vec<(usize, usize)> = Vec::new();
        let mut newest = mark;
        for (l, level) in s.ready.levels.iter().enumerate() {
            for (i, e) in level.iter().enumerate().rev() {
                if i < window || e.seq <= mark {
                    break;
                }
                newest = newest.max(e.seq);
                match (&e.body, e.stored) {
                    (Body::Resident(_), Some(id)) => candidates.push((l, i, id)),
                    (Body::Resident(_), None) => to_copy.push((l, i)),
                    (Body::Paged { .. }, _) => {}
                }
            }
        }
        if !to_copy.is_empty() {
            let pid = *s.paging_id.get_or_insert_with(|| vhost.new_paging_id());
            for (l, i) in to_copy {
                let e = &mut s.ready.levels[l][i];
                let Body::Resident(m) = &e.body else {
                    continue;
                };
                let id = vhost.new_message_id();
                let payload = crate::durable::encode_message(
                    &m.exchange,
                    &m.routing_key,
                    &m.properties,
                    &m.body,
                );
                vhost.journal().publish(id, &[pid], payload, None);
                e.stored = Some(id | PAGING_BIT);
                candidates.push((l, i, id | PAGING_BIT));
            }
        }
        if candidates.is_empty() {
            s.page_mark = newest;
            return;
        }
        let mut written = vec![false; candidates.len()];
        for (qid, bit) in [(self.store_id, 0), (s.paging_id, PAGING_BIT)] {
            let Some(qid) = qid else {
                continue;
            };
            let (at, ids): (Vec<usize>, Vec<u64>) = candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.2 & PAGING_BIT == bit)
                .map(|(k, c)| (k, c.2 & !PAGING_BIT))
                .unzip();
            if ids.is_empty() {
                continue;
            }
            for (k, ok) in at.into_iter().zip(vhost.journal().written(qid, &ids)) {
                written[k] = ok;
            }
        }
        let mut oldest_unwritten: Option<u64> = None;
        for ((l, i, _), ok) in candidates.into_iter().zip(written) {
            let e = &mut s.ready.levels[l][i];
            if !ok {
                oldest_unwritten = Some(oldest_unwritten.map_or(e.seq, |o| o.min(e.seq)));
                continue;
            }
            let Body::Resident(m) = &e.body else {
                continue;
            };
            e.body = Body::Paged {
                bytes: u32::try_from(m.body_bytes()).unwrap_or(u32::MAX),
                priority: m.priority,
                restored: false,
            };
            s.ready.resident -= 1;
        }
        s.page_mark = match oldest_unwritten {
            Some(seq) => seq.saturating_sub(1).max(mark),
            None => newest,
        };
    }

    /// Enqueues a published message (`stored`: its journal id, already
    /// journaled for this queue). Returns `false` if the queue refused it
    /// (`x-overflow = reject-publish`).
    pub fn enqueue(self: &Arc<Self>, msg: Arc<Message>, stored: Option<u64>, now: Instant) -> bool {
        self.with_state(now, |q, s, fx| {
            if s.deleted {
                return true;
            }
            if q.args.overflow != Overflow::DropHead && q.would_overflow(s, &msg) {
                let reason =
                    (q.args.overflow == Overflow::RejectPublishDlx).then_some(DeathReason::MaxLen);
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
            let ttl = match (q.args.message_ttl_ms, msg.expiration_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let seq = s.next_seq;
            s.next_seq += 1;
            s.ready.push_back(Entry {
                body: Body::Resident(msg),
                seq,
                returns: 0,
                redelivered: false,
                expires_at: ttl.map(|ms| now + Duration::from_millis(ms)),
                stored,
            });
            q.dispatch(s, now, fx);
            // A TTL of 0 means "deliver now or never".
            q.drop_expired(s, now, true, fx);
            q.trim_to_limits(s, now, fx);
            if seq % PAGE_SCAN_EVERY == 0 {
                q.page_out(s);
            }
            true
        })
    }

    fn would_overflow(&self, s: &QueueState, msg: &Message) -> bool {
        self.args
            .max_length
            .is_some_and(|max| s.ready.len as u64 >= max)
            || self
                .args
                .max_length_bytes
                .is_some_and(|max| s.ready.bytes + msg.body_bytes() > max)
    }

    fn trim_to_limits(&self, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        loop {
            let over = self
                .args
                .max_length
                .is_some_and(|max| s.ready.len as u64 > max)
                || self
                    .args
                    .max_length_bytes
                    .is_some_and(|max| s.ready.bytes > max);
            if !over {
                break;
            }
            match s.ready.pop_front() {
                Some(e) => self.drop_entry(s, e, Some(DeathReason::MaxLen), now, fx),
                None => break,
            }
        }
    }

    /// Hands ready messages to consumers with credit, round-robin.
    fn dispatch(self: &Arc<Self>, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        if s.consumers.is_empty() {
            return;
        }
        loop {
            self.expire_head(s, now, fx);
            let Some(first) = s.ready.pop_front() else {
                return;
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
                let stored = candidate.stored;
                match c.channel.try_deliver(&c, self, candidate, now) {
                    Ok(()) => {
                        s.next_consumer = (idx + 1) % n;
                        s.last_delivery = Some(now);
                        if c.no_ack {
                            // Delivered without ack: it is gone for good.
                            fx.removed.extend(stored);
                        } else {
                            s.unacked += 1;
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
        self.with_state(now, |q, s, fx| {
            s.last_used = now;
            q.expire_head(s, now, fx);
            let m = loop {
                let e = s.ready.pop_front()?;
                if let Some(m) = q.load(s, e, now, fx) {
                    break m;
                }
            };
            if no_ack {
                fx.removed.extend(m.stored);
            } else {
                s.unacked += 1;
            }
            Some((m, s.ready.len))
        })
    }

    /// Acked messages leave for good; frees their credit. `done` runs once
    /// their removal is durable.
    pub fn settle(self: &Arc<Self>, msgs: Vec<QueuedMessage>, now: Instant, done: Option<Done>) {
        self.with_state(now, |q, s, fx| {
            s.unacked = s.unacked.saturating_sub(msgs.len());
            fx.done = done;
            for m in msgs {
                q.drop_message(m, None, fx);
            }
            if !s.deleted {
                q.dispatch(s, now, fx);
            }
        });
    }

    /// Messages that came back unacked (nack/reject with requeue, channel
    /// closed): back to their place, flagged redelivered, unless they hit
    /// the delivery limit.
    pub fn requeue(self: &Arc<Self>, msgs: Vec<QueuedMessage>, now: Instant, done: Option<Done>) {
        self.with_state(now, |q, s, fx| {
            s.unacked = s.unacked.saturating_sub(msgs.len());
            fx.done = done;
            if s.deleted {
                return;
            }
            for mut m in msgs {
                m.returns += 1;
                m.redelivered = true;
                if q.args
                    .delivery_limit
                    .is_some_and(|l| u64::from(m.returns) > l)
                {
                    q.drop_message(m, Some(DeathReason::DeliveryLimit), fx);
                } else {
                    s.ready.insert_by_seq(Entry::resident(m));
                }
            }
            q.dispatch(s, now, fx);
        });
    }

    /// Messages rejected without requeue: dead-lettered or dropped.
    pub fn reject(self: &Arc<Self>, msgs: Vec<QueuedMessage>, now: Instant, done: Option<Done>) {
        self.with_state(now, |q, s, fx| {
            s.unacked = s.unacked.saturating_sub(msgs.len());
            fx.done = done;
            for m in msgs {
                q.drop_message(m, Some(DeathReason::Rejected), fx);
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
            s.consumers.push(c);
            s.had_consumer = true;
            s.last_used = now;
            q.dispatch(s, now, fx);
            Ok(())
        })
    }

    /// Removes a consumer (cancel, channel close). Auto-deletes the queue
    /// when its last consumer goes.
    pub fn remove_consumer(self: &Arc<Self>, channel: &Arc<Channel>, tag: &str, now: Instant) {
        self.with_state(now, |q, s, fx| {
            s.consumers
                .retain(|c| !(c.tag == tag && Arc::ptr_eq(&c.channel, channel)));
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
            let all = s.ready.drain();
            let n = all.len();
            for e in all {
                q.drop_entry(s, e, None, now, fx);
            }
            n
        })
    }

    /// Puts back a message recovered from the journal (flagged redelivered:
    /// it may have been delivered before the restart).
    pub fn restore(self: &Arc<Self>, msg: Arc<Message>, stored: u64, now: Instant) {
        self.with_state(now, |q, s, _fx| {
            let ttl = q.args.message_ttl_ms.or(msg.expiration_ms);
            let seq = s.next_seq;
            s.next_seq += 1;
            s.ready.push_back(Entry {
                body: Body::Resident(msg),
                seq,
                returns: 0,
                redelivered: true,
                expires_at: ttl.map(|ms| now + Duration::from_millis(ms)),
                stored: Some(stored),
            });
            q.page_out(s);
        });
    }

    /// Puts back a message recovered from the journal without reading it:
    /// its body stays on disk until it is delivered. `bytes` is its stored
    /// size; `priority` matters only with `x-max-priority`.
    pub fn restore_paged(self: &Arc<Self>, stored: u64, bytes: u32, priority: u8, now: Instant) {
        self.with_state(now, |q, s, _fx| {
            s.restored_at.get_or_insert(now);
            let seq = s.next_seq;
            s.next_seq += 1;
            s.page_mark = seq;
            s.ready.push_back(Entry {
                body: Body::Paged {
                    bytes,
                    priority,
                    restored: true,
                },
                seq,
                returns: 0,
                redelivered: true,
                expires_at: q
                    .args
                    .message_ttl_ms
                    .map(|ms| now + Duration::from_millis(ms)),
                stored: Some(stored),
            });
        });
    }

    /// Marks the queue deleted; returns its ready count and its consumers
    /// (to be told of the cancellation).
    pub(crate) fn mark_deleted(&self) -> (usize, Vec<Arc<Consumer>>, Option<u64>) {
        let mut s = self.state.lock();
        s.deleted = true;
        let n = s.ready.drain().len();
        (n, std::mem::take(&mut s.consumers), s.paging_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_entry_stays_compact() {
        // A deep queue holds millions of these: keep them within 64 bytes.
        assert!(
            std::mem::size_of::<Entry>() <= 64,
            "Entry is {} bytes",
            std::mem::size_of::<Entry>()
        );
    }
}
