//! The kill -9 loop: cycle after cycle, the real binary runs under load and
//! is SIGKILLed at a random moment, then restarted on the same data; a
//! ledger of what every client was told checks the two promises of
//! docs/DURABILITY.md across all the cycles:
//!
//! 1. no confirmed persistent message is lost: at the end each one is still
//!    in a queue, or was consumed (an ack whose `tx.commit-ok` came, or an
//!    ack the broker may have applied before dying);
//! 2. no message is delivered from a queue after its removal from that
//!    queue was made durable (an ack or reject answered by `tx.commit-ok`).
//!
//! The load: work queues spread over every log group (two data
//! directories, small segments so they roll, seal, checkpoint and get
//! reclaimed), publishers with hundreds of unconfirmed publishes in flight
//! (the broker answers with `basic.ack multiple`), transactional consumers
//! that reject some messages (dead-lettered) and ack the rest with
//! `multiple`, plain consumers acking with `multiple`, queues with
//! `x-message-ttl` whose messages expire into a dead-letter queue, a few
//! transient and a few multi-frame messages. Besides the two promises every
//! delivery is checked: its body is intact, it comes from a queue its
//! message can be in, a message recovered from disk is flagged
//! `redelivered`, a transient message never survives a restart, and the
//! broker logs no `ERROR` (damage, loss, a poisoned group).
//!
//! Dead-lettering is at-least-once (DURABILITY.md): a crash between the
//! copy's Publish and the source's Remove duplicates the message. So the
//! expiry dead-letter queue may deliver a message again after its ack, and
//! the reject dead-letter queue may do so for a message whose rejecting
//! transaction got no answer; everywhere else the check is strict.
//!
//! Seeded: the seed is printed, and `BERTH_TEST_SEED=N` replays the choices
//! (not the thread interleavings). Bounded: cycles run until
//! `BERTH_KILL9_BUDGET_S` (default 75 s) is spent, then a last restart
//! drains every queue. It prints the cycles and messages it checked and
//! fails if the load did not reach every log group, a checkpoint in each,
//! durable acks, rejects, expiries and recovered deliveries.
//!
//! Ignored by a plain `cargo test` for its length; `scripts/test.sh` runs it
//! as the `kill9` suite:
//! `cargo test --release -p berth-cli --test kill9_loop -- --ignored --nocapture`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::message::{Delivery, DeliveryResult};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, ConsumerDelegate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

mod common;
use common::{bounded, connect, Broker};

const BUDGET_ENV: &str = "BERTH_KILL9_BUDGET_S";
const BUDGET_S_DEFAULT: u64 = 75;
/// Fewer cycles than this proves too little: the test fails.
const CYCLES_MIN: u32 = 3;
const LOG_GROUPS: usize = 4;
const WORK_QUEUES: usize = 24;
const PUBLISHERS: u64 = 3;
/// Load time of one cycle before the kill, in ms.
const LOAD_MS_MIN: u64 = 300;
const LOAD_MS_MAX: u64 = 1500;
/// Broker flags: small segments roll, seal and get compacted or deleted;
/// a small checkpoint threshold makes checkpoints run, so recovery replays
/// only tails; a small resident window pages bodies out to the store.
const FLAGS: &[&str] = &[
    "--log-groups",
    "4",
    "--segment-size-bytes",
    "262144",
    "--checkpoint-journal-bytes",
    "1048576",
    "--queue-resident-messages-max",
    "32",
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// No arguments.
    Plain,
    /// `x-message-ttl`, dead-lettering into [`EXPIRED`].
    Ttl,
    /// Dead-lettering into [`REJECTED`]; consumers reject some messages.
    RejectDlx,
    /// The dead-letter queue of the `Ttl` queues.
    DeadExpired,
    /// The dead-letter queue of the `RejectDlx` queues.
    DeadRejected,
}

const EXPIRED: usize = WORK_QUEUES;
const REJECTED: usize = WORK_QUEUES + 1;
const QUEUES: usize = WORK_QUEUES + 2;

fn kind(q: usize) -> Kind {
    match q {
        EXPIRED => Kind::DeadExpired,
        REJECTED => Kind::DeadRejected,
        q if q % 3 == 0 => Kind::Ttl,
        q if q % 3 == 1 => Kind::RejectDlx,
        _ => Kind::Plain,
    }
}

fn name(q: usize) -> String {
    match kind(q) {
        Kind::DeadExpired => "k9-dead-expired".into(),
        Kind::DeadRejected => "k9-dead-rejected".into(),
        _ => format!("k9-work-{q}"),
    }
}

fn arguments(q: usize) -> FieldTable {
    let mut t = FieldTable::default();
    let dead_letter_to = |t: &mut FieldTable, to: usize| {
        t.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        t.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(name(to).as_str().into()),
        );
    };
    match kind(q) {
        Kind::Ttl => {
            let ttl_ms = 200 + 100 * (q as i64 % 8);
            t.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl_ms));
            dead_letter_to(&mut t, EXPIRED);
        }
        Kind::RejectDlx => dead_letter_to(&mut t, REJECTED),
        _ => {}
    }
    t
}

/// A message body: its id, whether it is persistent, its padding length,
/// then padding derived from the id, so every delivery proves its bytes.
fn encode(id: u64, persistent: bool, padding: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(13 + padding);
    b.extend_from_slice(&id.to_le_bytes());
    b.push(u8::from(persistent));
    b.extend_from_slice(&u32::try_from(padding).expect("small").to_le_bytes());
    b.extend((0..padding).map(|i| pad_byte(id, i)));
    b
}

fn pad_byte(id: u64, i: usize) -> u8 {
    (id.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8
}

fn decode(body: &[u8]) -> Result<u64, String> {
    let (Some(id), Some(len)) = (body.get(..8), body.get(9..13)) else {
        return Err(format!("body of {} bytes is too short", body.len()));
    };
    let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    if body.len() != 13 + len {
        return Err(format!(
            "message {id:#x}: body of {} bytes, expected {}",
            body.len(),
            13 + len
        ));
    }
    if let Some(i) = (0..len).find(|&i| body[13 + i] != pad_byte(id, i)) {
        return Err(format!("message {id:#x}: body byte {} differs", 13 + i));
    }
    Ok(id)
}

/// Message ids say who published them when: cycle, publisher, sequence.
fn message_id(cycle: u32, publisher: u64, seq: u64) -> u64 {
    (u64::from(cycle) << 40) | (publisher << 32) | seq
}

#[derive(Default, Debug)]
struct Stats {
    published: u64,
    confirmed: u64,
    nacked: u64,
    in_flight_max: usize,
    deliveries: u64,
    recovered_deliveries: u64,
    durable_acks: u64,
    durable_rejects: u64,
    in_doubt_commits: u64,
    plain_acks: u64,
    expired_deliveries: u64,
    rejected_deliveries: u64,
    final_drained: u64,
}

/// What every client was told, and the checks against it.
#[derive(Default)]
struct Ledger {
    /// Every message sent: its work queue, cycle and persistence.
    published: HashMap<u64, (usize, u32, bool)>,
    /// Persistent messages whose publisher got `basic.ack`.
    confirmed: HashSet<u64>,
    /// (queue, message) removals answered by `tx.commit-ok`: that queue
    /// must never deliver that message again.
    removed_durably: HashSet<(usize, u64)>,
    /// Messages acked in a transaction that got `tx.commit-ok`.
    consumed: HashSet<u64>,
    /// Messages that may be gone: acked outside a transaction, or in one
    /// whose commit got no answer.
    maybe_consumed: HashSet<u64>,
    /// Messages rejected (so dead-lettered) in a transaction, committed or
    /// not answered: the only way into the reject dead-letter queue.
    rejected: HashSet<u64>,
    /// Rejected in a transaction whose commit got no answer: a copy may be
    /// in the dead-letter queue and the original back in its queue.
    rejected_in_doubt: HashSet<u64>,
    /// Delivered during the final drain.
    drained: HashSet<u64>,
    /// Every delivery of every message: (queue, cycle), for failure reports.
    seen: HashMap<u64, Vec<(usize, u32)>>,
    violations: Vec<String>,
    stats: Stats,
}

impl Ledger {
    fn published(&mut self, id: u64, queue: usize, cycle: u32, persistent: bool) {
        self.published.insert(id, (queue, cycle, persistent));
        self.stats.published += 1;
    }

    fn delivered(&mut self, queue: usize, d: &Delivery, cycle: u32) {
        self.check_delivery(queue, &d.data, d.redelivered, cycle);
    }

    fn check_delivery(&mut self, queue: usize, body: &[u8], redelivered: bool, cycle: u32) {
        self.stats.deliveries += 1;
        let id = match decode(body) {
            Ok(id) => id,
            Err(e) => return self.violations.push(format!("{}: {e}", name(queue))),
        };
        let Some(&(origin, published_in, persistent)) = self.published.get(&id) else {
            return self.violations.push(format!(
                "{} delivered message {id:#x}, which nobody published",
                name(queue)
            ));
        };
        self.seen.entry(id).or_default().push((queue, cycle));
        let from_before = published_in < cycle;
        let at = || format!("{} delivered message {id:#x} (cycle {cycle})", name(queue));
        let possible = match kind(queue) {
            Kind::DeadExpired => kind(origin) == Kind::Ttl,
            Kind::DeadRejected => self.rejected.contains(&id),
            _ => queue == origin,
        };
        if !possible {
            let origin = name(origin);
            self.violations.push(format!(
                "{}, published to {origin}: it cannot be there",
                at()
            ));
        }
        if !persistent && from_before {
            self.violations.push(format!(
                "{}: a transient message of cycle {published_in} survived a restart",
                at()
            ));
        }
        let duplicate_allowed = match kind(queue) {
            Kind::DeadExpired => true,
            Kind::DeadRejected => self.rejected_in_doubt.contains(&id),
            _ => false,
        };
        if !duplicate_allowed && self.removed_durably.contains(&(queue, id)) {
            self.violations
                .push(format!("{} after its removal got tx.commit-ok", at()));
        }
        if queue == origin && from_before {
            self.stats.recovered_deliveries += 1;
            if !redelivered {
                self.violations.push(format!(
                    "{}: recovered from disk (published in cycle {published_in}) but not flagged redelivered",
                    at()
                ));
            }
        }
        match kind(queue) {
            Kind::DeadExpired => self.stats.expired_deliveries += 1,
            Kind::DeadRejected => self.stats.rejected_deliveries += 1,
            _ => {}
        }
    }

    fn committing(&mut self, rejected: &[(usize, u64)]) {
        self.rejected.extend(rejected.iter().map(|(_, id)| *id));
    }

    fn committed(&mut self, acked: &[(usize, u64)], rejected: &[(usize, u64)]) {
        for &(q, id) in acked {
            self.removed_durably.insert((q, id));
            self.consumed.insert(id);
        }
        for &(q, id) in rejected {
            self.removed_durably.insert((q, id));
        }
        self.stats.durable_acks += acked.len() as u64;
        self.stats.durable_rejects += rejected.len() as u64;
    }

    fn commit_in_doubt(&mut self, acked: &[(usize, u64)], rejected: &[(usize, u64)]) {
        self.maybe_consumed.extend(acked.iter().map(|(_, id)| *id));
        self.rejected_in_doubt
            .extend(rejected.iter().map(|(_, id)| *id));
        self.stats.in_doubt_commits += 1;
    }

    /// Confirmed persistent messages that are neither queued nor consumed.
    fn lost(&self) -> Vec<u64> {
        let mut lost: Vec<u64> = self
            .confirmed
            .iter()
            .filter(|id| {
                !self.drained.contains(id)
                    && !self.consumed.contains(id)
                    && !self.maybe_consumed.contains(id)
            })
            .copied()
            .collect();
        lost.sort_unstable();
        lost
    }

    /// What the ledger knows of message `id`, for a failure report.
    fn history(&self, id: u64) -> String {
        let (origin, cycle, _) = self.published[&id];
        let seen: Vec<String> = self
            .seen
            .get(&id)
            .map(|v| {
                v.iter()
                    .map(|(q, c)| format!("{} in cycle {c}", name(*q)))
                    .collect()
            })
            .unwrap_or_default();
        format!(
            "{id:#x}: published in cycle {cycle} to {} ({:?}); rejected: {}; delivered: [{}]",
            name(origin),
            kind(origin),
            self.rejected.contains(&id),
            seen.join(", ")
        )
    }
}

type Shared = Arc<Mutex<Ledger>>;

/// Forwards a consumer's deliveries, tagged with its queue, to a task.
struct Forward(usize, mpsc::UnboundedSender<(usize, Delivery)>);

impl ConsumerDelegate for Forward {
    fn on_new_delivery(
        &self,
        delivery: DeliveryResult,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        if let Ok(Some(d)) = delivery {
            let _task_may_have_ended = self.1.send((self.0, d));
        }
        Box::pin(std::future::ready(()))
    }
}

async fn consume_all(
    ch: &Channel,
    queues: &[usize],
    no_ack: bool,
) -> Option<mpsc::UnboundedReceiver<(usize, Delivery)>> {
    let (tx, rx) = mpsc::unbounded_channel();
    for &q in queues {
        let options = BasicConsumeOptions {
            no_ack,
            ..Default::default()
        };
        let consumer = bounded(ch.basic_consume(
            name(q).as_str().into(),
            ShortString::from(""),
            options,
            FieldTable::default(),
        ))
        .await?;
        consumer.set_delegate(Forward(q, tx.clone()));
    }
    Some(rx)
}

/// Publishes persistent (and a few transient) messages to random work
/// queues, keeping up to `window` unconfirmed publishes in flight.
async fn publisher(
    uri: String,
    p: u64,
    cycle: u32,
    seed: u64,
    ledger: Shared,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let window = rng.random_range(32..512usize);
    let Some(conn) = bounded(lapin::Connection::connect(&uri, Default::default())).await else {
        return;
    };
    let Some(ch) = bounded(conn.create_channel()).await else {
        return;
    };
    if bounded(ch.confirm_select(ConfirmSelectOptions::default()))
        .await
        .is_none()
    {
        return;
    }
    let mut pending = std::collections::VecDeque::new();
    let settle = |id: u64, persistent: bool, outcome: Option<Confirmation>, ledger: &Shared| {
        let mut l = ledger.lock().unwrap();
        match outcome {
            Some(Confirmation::Ack(None)) => {
                if persistent {
                    l.confirmed.insert(id);
                    l.stats.confirmed += 1;
                }
            }
            Some(Confirmation::Ack(Some(_))) => l
                .violations
                .push(format!("message {id:#x} was returned: its queue is gone")),
            Some(Confirmation::Nack(_)) => l.stats.nacked += 1,
            Some(Confirmation::NotRequested) | None => {}
        }
    };
    for seq in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let id = message_id(cycle, p, seq);
        let queue = rng.random_range(0..WORK_QUEUES);
        let persistent = rng.random_ratio(19, 20);
        let padding = if rng.random_ratio(1, 100) {
            rng.random_range(100_000..300_000)
        } else {
            rng.random_range(0..2000)
        };
        ledger
            .lock()
            .unwrap()
            .published(id, queue, cycle, persistent);
        let props = BasicProperties::default().with_delivery_mode(if persistent { 2 } else { 1 });
        let Some(confirm) = bounded(ch.basic_publish(
            "".into(),
            name(queue).as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &encode(id, persistent, padding),
            props,
        ))
        .await
        else {
            break;
        };
        pending.push_back((id, persistent, confirm));
        {
            let mut l = ledger.lock().unwrap();
            l.stats.in_flight_max = l.stats.in_flight_max.max(pending.len());
        }
        while pending.len() >= window {
            let (id, persistent, confirm) = pending.pop_front().expect("not empty");
            let outcome = bounded(confirm).await;
            let failed = outcome.is_none();
            settle(id, persistent, outcome, &ledger);
            if failed {
                break;
            }
        }
    }
    // Confirms that arrived before the broker died count as confirmed.
    for (id, persistent, confirm) in pending {
        let outcome = tokio::time::timeout(Duration::from_millis(200), confirm)
            .await
            .ok()
            .and_then(Result::ok);
        settle(id, persistent, outcome, &ledger);
    }
}

/// Deliveries of one channel, released in delivery-tag order: lapin may
/// hand deliveries of different consumers over out of order, and an ack
/// with `multiple` must cover only deliveries the ledger has seen.
#[derive(Default)]
struct Inbox {
    /// Received, not yet settled: tag → (queue, message id if it decoded).
    unsettled: BTreeMap<u64, (usize, Option<u64>)>,
    /// Every tag up to this one has been received.
    received_upto: u64,
    /// Received tags above `received_upto + 1`.
    ahead: BTreeSet<u64>,
}

impl Inbox {
    fn receive(&mut self, q: usize, d: &Delivery) {
        self.unsettled
            .insert(d.delivery_tag, (q, decode(&d.data).ok()));
        self.ahead.insert(d.delivery_tag);
        while self.ahead.remove(&(self.received_upto + 1)) {
            self.received_upto += 1;
        }
    }

    /// Deliveries that can be settled now (every lower tag was received).
    fn ready(&self) -> usize {
        self.unsettled.range(..=self.received_upto).count()
    }

    /// Takes the deliveries that can be settled now, in tag order.
    fn take_ready(&mut self) -> Vec<(u64, usize, Option<u64>)> {
        let rest = self.unsettled.split_off(&(self.received_upto + 1));
        std::mem::replace(&mut self.unsettled, rest)
            .into_iter()
            .map(|(tag, (q, id))| (tag, q, id))
            .collect()
    }
}

/// Consumes `queues` in a transaction: per batch, rejects some messages of
/// dead-lettering queues, acks the rest with `multiple`, and commits.
async fn transactional_consumer(
    uri: String,
    queues: Vec<usize>,
    cycle: u32,
    seed: u64,
    ledger: Shared,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let batch_max = rng.random_range(1..40usize);
    let Some(conn) = bounded(lapin::Connection::connect(&uri, Default::default())).await else {
        return;
    };
    let Some(ch) = bounded(conn.create_channel()).await else {
        return;
    };
    if bounded(ch.basic_qos(64, BasicQosOptions::default()))
        .await
        .is_none()
        || bounded(ch.tx_select()).await.is_none()
    {
        return;
    }
    let Some(mut rx) = consume_all(&ch, &queues, false).await else {
        return;
    };
    let mut inbox = Inbox::default();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_millis(20), rx.recv()).await {
            Ok(Some((q, d))) => {
                ledger.lock().unwrap().delivered(q, &d, cycle);
                inbox.receive(q, &d);
                if inbox.ready() < batch_max {
                    continue;
                }
            }
            Ok(None) => return,
            Err(_) if inbox.ready() == 0 => continue,
            Err(_) => {}
        }
        let (mut acked, mut rejected) = (Vec::new(), Vec::new());
        let mut ack_upto = None;
        for (tag, q, id) in inbox.take_ready() {
            let id = id.unwrap_or(u64::MAX); // a corrupt body is already a violation
            if kind(q) == Kind::RejectDlx && rng.random_ratio(1, 4) {
                rejected.push((q, id));
                let requeue = BasicRejectOptions { requeue: false };
                if bounded(ch.basic_reject(tag, requeue)).await.is_none() {
                    return;
                }
            } else {
                acked.push((q, id));
                ack_upto = Some(tag);
            }
        }
        if let Some(tag) = ack_upto {
            if bounded(ch.basic_ack(tag, BasicAckOptions { multiple: true }))
                .await
                .is_none()
            {
                return;
            }
        }
        // Recorded before the commit: the dead-lettered copies can be
        // delivered before `commit-ok` arrives.
        ledger.lock().unwrap().committing(&rejected);
        match bounded(ch.tx_commit()).await {
            Some(()) => ledger.lock().unwrap().committed(&acked, &rejected),
            None => {
                ledger.lock().unwrap().commit_in_doubt(&acked, &rejected);
                return;
            }
        }
    }
}

/// Consumes `queues` with plain acks (`multiple` every few deliveries):
/// the broker may apply them or not before it dies.
async fn plain_consumer(
    uri: String,
    queues: Vec<usize>,
    cycle: u32,
    seed: u64,
    ledger: Shared,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let every = rng.random_range(1..50usize);
    let Some(conn) = bounded(lapin::Connection::connect(&uri, Default::default())).await else {
        return;
    };
    let Some(ch) = bounded(conn.create_channel()).await else {
        return;
    };
    if bounded(ch.basic_qos(128, BasicQosOptions::default()))
        .await
        .is_none()
    {
        return;
    }
    let Some(mut rx) = consume_all(&ch, &queues, false).await else {
        return;
    };
    let mut inbox = Inbox::default();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_millis(20), rx.recv()).await {
            Ok(Some((q, d))) => {
                ledger.lock().unwrap().delivered(q, &d, cycle);
                inbox.receive(q, &d);
                if inbox.ready() < every {
                    continue;
                }
            }
            Ok(None) => return,
            Err(_) if inbox.ready() == 0 => continue,
            Err(_) => {}
        }
        let ready = inbox.take_ready();
        let last_tag = ready.last().expect("ready is not empty").0;
        {
            let mut l = ledger.lock().unwrap();
            l.stats.plain_acks += ready.len() as u64;
            l.maybe_consumed
                .extend(ready.iter().filter_map(|(_, _, id)| *id));
        }
        if bounded(ch.basic_ack(last_tag, BasicAckOptions { multiple: true }))
            .await
            .is_none()
        {
            return;
        }
    }
}

async fn declare(ch: &Channel, q: usize, passive: bool) -> bool {
    let options = QueueDeclareOptions {
        durable: true,
        passive,
        ..Default::default()
    };
    bounded(ch.queue_declare(name(q).as_str().into(), options, arguments(q)))
        .await
        .is_some()
}

/// What one log group's directory showed after a kill.
#[derive(Default, Debug, Clone, Copy)]
struct GroupFiles {
    /// Largest total size of its segments seen.
    segment_bytes_max: u64,
    /// Whether a checkpoint file was ever seen.
    checkpointed: bool,
    /// Whether segment 1 was ever gone (reclaimed) while later ones existed.
    reclaimed: bool,
}

/// Updates `groups` from the log group directories under `dirs`.
fn look_at_groups(dirs: &[PathBuf], groups: &mut [GroupFiles]) {
    for (g, seen) in groups.iter_mut().enumerate() {
        let (mut bytes, mut first_seg) = (0, u64::MAX);
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir.join(format!("group-{g:04}"))) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(seq) = name.strip_suffix(".seg") {
                    bytes += e.metadata().map_or(0, |m| m.len());
                    first_seg = first_seg.min(seq.parse().unwrap_or(u64::MAX));
                } else if name.starts_with("ckpt-") {
                    seen.checkpointed = true;
                }
            }
        }
        seen.segment_bytes_max = seen.segment_bytes_max.max(bytes);
        seen.reclaimed |= first_seg > 1 && first_seg != u64::MAX;
    }
}

/// Consumes every queue with no-ack until all are empty and quiet.
async fn drain_all(broker: &Broker, ledger: &Shared, cycle: u32) {
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.expect("channel");
    let all: Vec<usize> = (0..QUEUES).collect();
    let mut rx = consume_all(&ch, &all, true).await.expect("consume");
    let status = conn.create_channel().await.expect("channel");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            Ok(Some((q, d))) => {
                let mut l = ledger.lock().unwrap();
                l.delivered(q, &d, cycle);
                if let Ok(id) = decode(&d.data) {
                    l.drained.insert(id);
                }
                l.stats.final_drained += 1;
            }
            Ok(None) => panic!("the drain's consumers were cancelled"),
            Err(_) => {
                let mut queued = 0;
                for q in 0..QUEUES {
                    let options = QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    };
                    let ok = status
                        .queue_declare(name(q).as_str().into(), options, FieldTable::default())
                        .await
                        .expect("queue.declare passive");
                    queued += ok.message_count();
                }
                if queued == 0 {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{queued} messages still queued after 60 s of draining"
                );
            }
        }
    }
}

fn violations_report(seed: u64, ledger: &Ledger, broker_log: &str) -> String {
    let shown: Vec<&String> = ledger.violations.iter().take(10).collect();
    format!(
        "seed {seed}: {} violations, e.g.\n{}\nbroker log tail:\n{broker_log}",
        ledger.violations.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs for BERTH_KILL9_BUDGET_S (75 s): scripts/test.sh runs it as its kill9 suite"]
async fn kill9_loop_loses_no_confirmed_message_and_resurrects_no_durable_ack() {
    let seed = common::seed("kill -9 loop");
    let budget = Duration::from_secs(
        std::env::var(BUDGET_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(BUDGET_S_DEFAULT),
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let root = common::temp_dir("kill9", seed);
    let dirs = [root.join("a"), root.join("b")];
    let dir_refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let ledger: Shared = Arc::default();
    let mut groups = [GroupFiles::default(); LOG_GROUPS];
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let started = Instant::now();
    let mut cycle = 0u32;
    while started.elapsed() < budget {
        let mut broker = Broker::start(&dir_refs, FLAGS);
        {
            let conn = connect(&broker.uri).await;
            let ch = conn.create_channel().await.expect("channel");
            for q in 0..QUEUES {
                // After the first cycle the definitions must have survived.
                assert!(
                    declare(&ch, q, cycle > 0).await,
                    "seed {seed}: cycle {cycle}: queue {} is missing or differs",
                    name(q)
                );
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for p in 0..PUBLISHERS {
            tasks.push(tokio::spawn(publisher(
                broker.uri.clone(),
                p,
                cycle,
                rng.random(),
                Arc::clone(&ledger),
                Arc::clone(&stop),
            )));
        }
        // Each queue gets a transactional consumer, a plain one, or none
        // (its backlog then grows, pages out and expires).
        let (mut tx_queues, mut plain_queues) = ([Vec::new(), Vec::new()], Vec::new());
        for q in 0..QUEUES {
            match rng.random_range(0..10) {
                0..=4 => tx_queues[rng.random_range(0..2)].push(q),
                5..=7 => plain_queues.push(q),
                _ if kind(q) == Kind::DeadRejected => tx_queues[0].push(q),
                _ => {}
            }
        }
        for queues in tx_queues {
            tasks.push(tokio::spawn(transactional_consumer(
                broker.uri.clone(),
                queues,
                cycle,
                rng.random(),
                Arc::clone(&ledger),
                Arc::clone(&stop),
            )));
        }
        tasks.push(tokio::spawn(plain_consumer(
            broker.uri.clone(),
            plain_queues,
            cycle,
            rng.random(),
            Arc::clone(&ledger),
            Arc::clone(&stop),
        )));
        tokio::time::sleep(Duration::from_millis(
            rng.random_range(LOAD_MS_MIN..LOAD_MS_MAX),
        ))
        .await;
        broker.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("a client task did not end within 30 s of the kill")
                .expect("a client task panicked");
        }
        errors.extend(broker.errors());
        warnings.extend(
            broker
                .warnings()
                .into_iter()
                .map(|w| format!("cycle {cycle}: {w}")),
        );
        look_at_groups(&dirs, &mut groups);
        let l = ledger.lock().unwrap();
        assert!(
            l.violations.is_empty(),
            "{}",
            violations_report(seed, &l, &broker.log_tail())
        );
        drop(l);
        cycle += 1;
    }

    let broker = Broker::start(&dir_refs, FLAGS);
    drain_all(&broker, &ledger, cycle).await;
    errors.extend(broker.errors());
    drop(broker);
    let l = ledger.lock().unwrap();
    let s = &l.stats;
    eprintln!(
        "kill -9 loop: {cycle} cycles in {:.1} s; {} published, {} confirmed (up to {} in flight \
         per publisher), {} nacked; {} deliveries checked ({} recovered from disk, {} from the \
         expiry dead-letter queue, {} from the reject dead-letter queue); {} durable acks and \
         {} durable rejects, {} commits in doubt, {} plain acks; {} drained at the end; \
         log groups: {:?}",
        started.elapsed().as_secs_f64(),
        s.published,
        s.confirmed,
        s.in_flight_max,
        s.nacked,
        s.deliveries,
        s.recovered_deliveries,
        s.expired_deliveries,
        s.rejected_deliveries,
        s.durable_acks,
        s.durable_rejects,
        s.in_doubt_commits,
        s.plain_acks,
        s.final_drained,
        groups,
    );
    assert!(
        l.violations.is_empty(),
        "{}",
        violations_report(seed, &l, "(final drain)")
    );
    let lost = l.lost();
    let mut lost_where: HashMap<(usize, u32), usize> = HashMap::new();
    for id in &lost {
        let (q, c, _) = l.published[id];
        *lost_where.entry((q, c)).or_default() += 1;
    }
    assert!(
        lost.is_empty(),
        "seed {seed}: {} confirmed messages lost ({} per (queue, cycle published): {lost_where:?}); \
         broker errors: {errors:#?}; broker warnings: {warnings:#?}; e.g.\n{}",
        lost.len(),
        lost.len(),
        lost.iter()
            .take(10)
            .map(|id| l.history(*id))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        errors.is_empty(),
        "seed {seed}: the broker logged errors:\n{}",
        errors.join("\n")
    );
    assert!(
        cycle >= CYCLES_MIN,
        "seed {seed}: only {cycle} cycles in {budget:?}; the test proves too little"
    );
    // The load must have reached what the test claims to exercise.
    for (what, n) in [
        ("confirmed messages", s.confirmed),
        ("durable acks", s.durable_acks),
        ("durable rejects", s.durable_rejects),
        ("recovered deliveries", s.recovered_deliveries),
        ("expired dead-lettered deliveries", s.expired_deliveries),
        ("rejected dead-lettered deliveries", s.rejected_deliveries),
    ] {
        assert!(n > 0, "seed {seed}: no {what}; the test proves too little");
    }
    assert!(
        groups
            .iter()
            .all(|g| g.segment_bytes_max > 256 * 1024 && g.checkpointed),
        "seed {seed}: some log group got (almost) no load or never checkpointed: {groups:?}"
    );
    drop(l);
}

/// The ledger's checks can fail: each case a broken broker would produce.
mod ledger_checks {
    use super::*;

    fn ledger_with(id: u64, queue: usize, persistent: bool) -> Ledger {
        let mut l = Ledger::default();
        l.published(id, queue, 0, persistent);
        if persistent {
            l.confirmed.insert(id);
        }
        l
    }

    #[test]
    fn a_confirmed_message_never_seen_again_is_lost() {
        let l = ledger_with(7, 2, true);
        assert_eq!(l.lost(), [7]);
    }

    #[test]
    fn a_confirmed_message_acked_or_drained_is_not_lost() {
        let mut l = ledger_with(7, 2, true);
        l.committed(&[(2, 7)], &[]);
        assert!(l.lost().is_empty());
        let mut l = ledger_with(7, 2, true);
        l.check_delivery(2, &encode(7, true, 3), false, 0);
        l.drained.insert(7);
        assert!(l.lost().is_empty());
        assert!(l.violations.is_empty(), "{:?}", l.violations);
    }

    #[test]
    fn a_delivery_after_a_committed_ack_is_a_violation() {
        let mut l = ledger_with(7, 2, true);
        l.committed(&[(2, 7)], &[]);
        l.check_delivery(2, &encode(7, true, 3), true, 1);
        assert!(
            l.violations[0].contains("tx.commit-ok"),
            "{:?}",
            l.violations
        );
    }

    #[test]
    fn a_recovered_message_must_be_flagged_redelivered() {
        let mut l = ledger_with(7, 2, true);
        l.check_delivery(2, &encode(7, true, 3), false, 1);
        assert!(
            l.violations[0].contains("redelivered"),
            "{:?}",
            l.violations
        );
    }

    #[test]
    fn a_transient_message_must_not_survive_a_restart() {
        let mut l = ledger_with(7, 2, false);
        l.check_delivery(2, &encode(7, false, 3), true, 1);
        assert!(l.violations[0].contains("transient"), "{:?}", l.violations);
    }

    #[test]
    fn a_damaged_body_or_a_wrong_queue_is_a_violation() {
        let mut l = ledger_with(7, 2, true);
        let mut body = encode(7, true, 3);
        body[14] ^= 1;
        l.check_delivery(2, &body, false, 0);
        l.check_delivery(5, &encode(7, true, 3), false, 0);
        l.check_delivery(REJECTED, &encode(7, true, 3), false, 0);
        assert_eq!(l.violations.len(), 3, "{:?}", l.violations);
    }

    #[test]
    fn dead_lettering_duplicates_are_allowed_only_where_documented() {
        // Queue 0 is a TTL queue: its expiry copies may come again.
        let mut l = ledger_with(9, 0, true);
        l.check_delivery(EXPIRED, &encode(9, true, 3), false, 0);
        l.committed(&[(EXPIRED, 9)], &[]);
        l.check_delivery(EXPIRED, &encode(9, true, 3), false, 1);
        assert!(l.violations.is_empty(), "{:?}", l.violations);
        // Queue 1 dead-letters rejects: a committed reject's copy is unique.
        let mut l = ledger_with(8, 1, true);
        l.committing(&[(1, 8)]);
        l.committed(&[], &[(1, 8)]);
        l.check_delivery(REJECTED, &encode(8, true, 3), false, 0);
        l.committed(&[(REJECTED, 8)], &[]);
        l.check_delivery(REJECTED, &encode(8, true, 3), true, 1);
        assert_eq!(l.violations.len(), 1, "{:?}", l.violations);
    }
}
