//! The broker's journal seam implemented over `berth-store`, and the
//! startup path that opens the store and rebuilds the broker from it.
//!
//! How the store keeps the contract written on
//! [`berth_broker::durable::Journal`]: a log group is one of the store's
//! groups (a queue's by `splitmix64(queue) % group_count`, a metadata
//! key's by `crc32c(key) % group_count`, docs/FORMAT.md); a write's
//! position is the lsn its record gets, which the group's writer thread
//! hands out in the order requests reach it; that thread runs the
//! completions of a batch after the batch's write (and, under
//! `store.sync = always`, its fdatasync), so in lsn order; a failed sync
//! (or write, but for a full disk) poisons the group, which then fails
//! what was pending and every later request; a write that found the disk
//! full is taken back (it keeps no lsn) and the group refuses requests
//! until space returns.
//!
//! Invariants:
//! - Metadata calls block (off the async reactor, via `block_in_place`)
//!   until the store reports the write durable: a `declare-ok` is only sent
//!   for a definition that survives a crash.
//! - Nothing the store reports is dropped: completion errors reach the
//!   broker's completions (publisher nacks, connection errors), recovery
//!   damage and skipped entries are logged.

use std::sync::Arc;
use std::time::Instant;

use berth_broker::durable::StoredStream;
use berth_broker::durable::{Done, Journal, JournalError, MessageParts, PAGING_BIT};
use berth_broker::{Broker, Recovered as BrokerRecovered};
use berth_store::{MsgId, Payload, QueueId, StoreError};
use berth_store::{Store, Ticket};
use bytes::Bytes;
use smallvec::SmallVec;

/// `berth-store` as the broker's journal.
pub struct StoreJournal {
    pub store: Store,
    /// The lifecycle event log, if `event_log.enabled` (closed at
    /// shutdown, after the store's last flush).
    pub events: std::sync::OnceLock<Arc<berth_events::writer::EventLog>>,
}

fn adapt(done: Option<Done>) -> Option<berth_store::Done> {
    done.map(|d| -> berth_store::Done {
        Box::new(move |r: Result<(), StoreError>| {
            d(r.map_err(|e| JournalError::caused_by("the store could not write", e)));
        })
    })
}

/// Runs blocking work (a wait for fsync, a disk read) so that, on a tokio
/// worker, the worker's other tasks move to another thread meanwhile.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn wait_durable(f: impl FnOnce(berth_store::Done)) -> Result<(), JournalError> {
    let (done, ticket) = Ticket::new();
    f(done);
    blocking(|| {
        ticket
            .wait()
            .map_err(|e| JournalError::caused_by("the store could not write", e))
    })
}

impl StoreJournal {
    /// Both publishes, whole or in parts, end here.
    fn publish_payload(&self, msg: u64, queues: &[u64], payload: Payload, done: Option<Done>) {
        // One queue (the common case) needs no list on the heap.
        if let [q] = queues {
            self.store
                .publish_payload(MsgId(msg), &[QueueId(*q)], payload, adapt(done));
            return;
        }
        let queues: Vec<QueueId> = queues.iter().map(|q| QueueId(*q)).collect();
        self.store
            .publish_payload(MsgId(msg), &queues, payload, adapt(done));
    }
}

impl Journal for StoreJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.publish_payload(msg, queues, Payload::from(payload), done);
    }

    fn publish_message(
        &self,
        msg: u64,
        queues: &[u64],
        payload: MessageParts<'_>,
        done: Option<Done>,
    ) {
        // The head is copied (inline, when short); properties and body are
        // shared until the group writer copies them into its batch.
        let payload = Payload::new(
            payload.head,
            payload.properties.clone(),
            payload.body.clone(),
        );
        self.publish_payload(msg, queues, payload, done);
    }

    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        // Inline for an ack's one id: no list on the heap.
        let msgs: SmallVec<[MsgId; 4]> = msgs.iter().map(|m| MsgId(*m)).collect();
        self.store.remove(QueueId(queue), &msgs, adapt(done));
    }

    fn purge(&self, queue: u64, done: Option<Done>) {
        self.store.purge(QueueId(queue), adapt(done));
    }

    fn groups(&self) -> u32 {
        self.store.group_count()
    }

    fn group_of(&self, queue: u64) -> u32 {
        self.store.group_of(QueueId(queue))
    }

    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        wait_durable(|d| {
            self.store.put_meta(
                Bytes::copy_from_slice(key),
                Bytes::copy_from_slice(value),
                Some(d),
            )
        })
    }

    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        wait_durable(|d| self.store.delete_meta(Bytes::copy_from_slice(key), Some(d)))
    }

    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        self.store
            .append(QueueId(queue), offset, payload, adapt(done));
    }

    fn stream_trim(&self, queue: u64, below: u64, done: Option<Done>) {
        self.store.trim(QueueId(queue), below, adapt(done));
    }

    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        // A cold read can wait for the disk: keep other connections going.
        blocking(|| {
            self.store
                .read_stream(QueueId(queue), from, count_max, bytes_max)
        })
        .map_err(|e| JournalError::caused_by("the store could not read the stream", e))
    }

    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.store
            .read(QueueId(queue), MsgId(msg))
            .map_err(|e| JournalError::caused_by("the store could not read the message", e))
    }

    fn read_many(&self, queue: u64, msgs: &[u64]) -> Vec<Result<Bytes, JournalError>> {
        let msgs: Vec<MsgId> = msgs.iter().map(|m| MsgId(*m)).collect();
        // A cold read can wait for the disk: keep other connections going.
        blocking(|| self.store.read_many(QueueId(queue), &msgs))
            .into_iter()
            .map(|r| {
                r.map_err(|e| JournalError::caused_by("the store could not read the message", e))
            })
            .collect()
    }

    fn read_heads(&self, queue: u64, msgs: &[u64], len: usize) -> Vec<Result<Bytes, JournalError>> {
        let msgs: Vec<MsgId> = msgs.iter().map(|m| MsgId(*m)).collect();
        blocking(|| self.store.read_heads(QueueId(queue), &msgs, len))
            .into_iter()
            .map(|r| {
                r.map_err(|e| JournalError::caused_by("the store could not read the message", e))
            })
            .collect()
    }

    fn pages(&self) -> bool {
        true
    }

    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        let msgs: Vec<MsgId> = msgs.iter().map(|m| MsgId(*m)).collect();
        self.store.written(QueueId(queue), &msgs)
    }

    fn has_room(&self) -> bool {
        self.store.has_room()
    }

    fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.store.poll_room(cx)
    }
}

/// Opens the store and builds the broker from what it holds.
pub fn open_broker(
    config: &crate::Config,
) -> Result<(Arc<Broker>, Arc<StoreJournal>), crate::ServerError> {
    open_broker_with(config, |j| Arc::clone(j) as Arc<dyn Journal>)
}

/// [`open_broker`], with the broker's journal made from the store's by
/// `wrap` (a cluster leader's broker writes through Raft and reads from
/// its own store).
pub fn open_broker_with(
    config: &crate::Config,
    wrap: impl FnOnce(&Arc<StoreJournal>) -> Arc<dyn Journal>,
) -> Result<(Arc<Broker>, Arc<StoreJournal>), crate::ServerError> {
    let started = Instant::now();
    let sc = config.store_config();
    crate::reshape::apply(config, &sc)?;
    let (store, mut recovered) =
        Store::open(sc).map_err(|source| crate::ServerError::Store { source })?;
    let journal = Arc::new(StoreJournal {
        store,
        events: std::sync::OnceLock::new(),
    });
    broker_from(config, journal, &mut recovered, started, wrap)
}

/// Builds the broker from what an opened store `recovered`.
pub fn broker_from(
    config: &crate::Config,
    journal: Arc<StoreJournal>,
    recovered: &mut berth_store::Recovered,
    started: Instant,
    wrap: impl FnOnce(&Arc<StoreJournal>) -> Arc<dyn Journal>,
) -> Result<(Arc<Broker>, Arc<StoreJournal>), crate::ServerError> {
    for d in &recovered.damage {
        tracing::error!(damage = ?d, "store damage found during recovery and quarantined");
    }
    // Bodies stay on disk: queues read them back when they deliver them,
    // so restart time follows the index, not the bytes stored.
    // Paging copies (transient bodies written only to leave memory) never
    // outlive the process that wrote them.
    let paging: Vec<QueueId> = recovered
        .queues
        .keys()
        .filter(|q| q.0 & PAGING_BIT != 0)
        .copied()
        .collect();
    // Taken, not copied: (id, size) pairs are the store's own lists, each
    // converted where it lies (the same 16 bytes a message).
    let paged = std::mem::take(&mut recovered.queues)
        .into_iter()
        .filter(|(qid, _)| qid.0 & PAGING_BIT == 0)
        .map(|(qid, msgs)| {
            let list = msgs.into_iter().map(|m| (m.msg.0, m.payload_len)).collect();
            (qid.0, list)
        })
        .collect();
    let br = BrokerRecovered {
        meta: recovered
            .metadata
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect(),
        messages: Default::default(),
        paged,
        streams: recovered
            .streams
            .iter()
            .map(|(q, s)| {
                let stored = StoredStream {
                    first: s.first,
                    end: s.end,
                    messages: s.messages,
                    bytes: s.bytes,
                    marks: s.marks.clone(),
                };
                (q.0, stored)
            })
            .collect(),
    };
    let (next_recovered, next_queue) = br.next_ids();
    let next_msg = recovered.next_msg_id.0.max(next_recovered);
    for q in &paging {
        journal.store.purge(*q, None);
    }
    if !paging.is_empty() {
        tracing::info!(
            queues = paging.len(),
            "dropped paging copies of transient messages from before the restart"
        );
    }
    let broker = Broker::with_journal(
        config.auth.vhosts.iter().map(String::as_str),
        wrap(&journal),
        next_msg,
        next_queue,
    );
    broker.set_resident_messages_max(config.store.queue_resident_messages_max);
    broker.set_resident_bytes_max(config.store.queue_resident_bytes_max);
    broker.set_count_limits(config.limits.count_limits());
    crate::auth::init(&broker, config, &br.meta)?;
    let report = broker.restore(br, Instant::now());
    if let Some(log) = crate::event_log::start(config, journal.store.group_count(), &broker)? {
        let _first_and_only = journal.events.set(log);
    }
    for s in &report.skipped {
        tracing::warn!("not restored: {s}");
    }
    // Records of queues that no longer exist (a publish raced a deletion,
    // or a crash came between a definition's delete and its purge): a
    // purge makes them dead, and compaction and segment deletion reclaim
    // their space.
    for q in &report.orphaned_queues {
        journal.purge(*q, None);
    }
    if !report.orphaned_queues.is_empty() {
        tracing::info!(
            queues = report.orphaned_queues.len(),
            messages = report.orphaned_messages,
            "reclaimed stored messages of deleted queues"
        );
    }
    tracing::info!(
        exchanges = report.exchanges,
        queues = report.queues,
        bindings = report.bindings,
        messages = report.messages,
        groups = recovered.stats.groups,
        records_replayed = recovered.stats.records_replayed,
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "recovered from the store"
    );
    Ok((broker, journal))
}
