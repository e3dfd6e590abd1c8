//! What the broker asks of durable storage, and how it encodes what it
//! stores there.
//!
//! The broker persists: durable exchanges, durable queues, bindings whose
//! both ends are durable (as metadata), and persistent messages routed to
//! durable queues (as journal records). [`Journal`] is the seam: the server
//! implements it over `berth-store`; tests use [`MemoryJournal`].
//!
//! Invariants:
//! - A message's publish record is handed to the journal before the message
//!   is enqueued, so its removal (ack) can never be journaled before it.
//! - Metadata calls return only once the change is durable, so a
//!   `declare-ok` means the definition survives a crash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use berth_protocol::codec::{decode_field_table, encode_field_table};
use berth_protocol::{AMQPValue, FieldTable, LongString};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;

/// A journal failure (I/O error, failed fsync, poisoned group): what the
/// broker was doing, and the store's error as its cause.
#[derive(Debug, Clone)]
pub struct JournalError {
    what: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl JournalError {
    /// A failure with no underlying error (e.g. "not stored").
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            source: None,
        }
    }

    /// A failure caused by `source` (the store's error), kept as the cause.
    pub fn caused_by(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            what: what.into(),
            source: Some(Arc::new(source)),
        }
    }
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            // Operators read this in one log line: say the cause too.
            Some(s) => write!(f, "{}: {s}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Called once a journal write is durable (per the store's sync mode), or
/// failed. Runs on a store thread: keep it short.
pub type Done = Box<dyn FnOnce(Result<(), JournalError>) + Send + 'static>;

/// Durable storage as the broker needs it.
pub trait Journal: Send + Sync {
    /// Stores a persistent message for these durable queues.
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>);
    /// These messages left the queue for good (ack, drop, expiry, dead-letter).
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>);
    /// Every message of the queue left it (purge, delete).
    fn purge(&self, queue: u64, done: Option<Done>);
    /// Stores a definition; returns once it is durable.
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError>;
    /// Removes a definition; returns once that is durable.
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError>;
    /// Reads a stored message of a queue back (the payload given to
    /// `publish`). Valid once [`Journal::written`] says so.
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        let _ = (queue, msg);
        Err(JournalError::new("this journal keeps no messages"))
    }
    /// [`Journal::read`] for several messages of a queue at once (the
    /// journal may read neighbouring records together): one result per
    /// message, in order.
    fn read_many(&self, queue: u64, msgs: &[u64]) -> Vec<Result<Bytes, JournalError>> {
        msgs.iter().map(|m| self.read(queue, *m)).collect()
    }
    /// Can messages be written for paging and read back? (A journal that
    /// keeps nothing says no, and queues keep every body in memory.)
    fn pages(&self) -> bool {
        false
    }
    /// For each message: is it written, so that [`Journal::read`] finds it
    /// and its body need not stay in memory? A journal that cannot read
    /// messages back says no.
    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        let _ = queue;
        vec![false; msgs.len()]
    }
}

/// Where lifecycle events go (`event_log.enabled`): the sink frames,
/// stamps (time, per-group sequence) and writes the broker's encoded
/// events (see [`crate::events`]). `key` chooses the group.
pub trait EventSink: Send + Sync {
    fn append(&self, key: u64, payload: &[u8]);
}

/// Marks a journal queue id, or a queued message's journal id, as a
/// paging copy: a body written only to leave memory (a transient message,
/// or any message of a non-durable queue). Such copies never survive a
/// restart: the journal's queues with this bit are purged at startup.
pub const PAGING_BIT: u64 = 1 << 63;

/// The journal and the id counters every vhost and queue shares.
pub struct Durability {
    pub journal: Arc<dyn Journal>,
    /// Next journal message id (never reused: restored from the journal).
    next_msg_id: AtomicU64,
    /// Next journal queue id (durable queues and paging ids).
    next_queue_id: AtomicU64,
    /// Ready messages per queue whose bodies stay in memory; beyond it,
    /// bodies already written to the journal are read back when needed.
    resident_messages_max: AtomicUsize,
    /// Removals waiting to be journaled: (queue, message, completion).
    /// Filled from journal completions (a store thread, which must not
    /// call back into the store), emptied by [`Durability::flush_removals`]
    /// from broker threads.
    deferred: Mutex<Vec<(u64, u64, Option<Done>)>>,
    /// The event log, once set at startup; unset (the default) every
    /// event hook is one branch.
    events: OnceLock<Arc<dyn EventSink>>,
}

impl Durability {
    /// Ids continue from the given values (one past the largest recovered).
    pub fn new(journal: Arc<dyn Journal>, next_msg_id: u64, next_queue_id: u64) -> Self {
        Self {
            journal,
            next_msg_id: AtomicU64::new(next_msg_id),
            next_queue_id: AtomicU64::new(next_queue_id),
            resident_messages_max: AtomicUsize::new(crate::limits::RESIDENT_MESSAGES_MAX_DEFAULT),
            deferred: Mutex::new(Vec::new()),
            events: OnceLock::new(),
        }
    }

    /// A completion for a write that `msg`'s removal from `queue` must wait
    /// for: once that write is durable, the removal is queued for the next
    /// [`Durability::flush_removals`]; if it failed, the message stays
    /// (it returns after a restart) and `done` gets the error.
    pub fn defer_removal(self: &Arc<Self>, queue: u64, msg: u64, done: Option<Done>) -> Done {
        let me = Arc::downgrade(self);
        Box::new(move |r: Result<(), JournalError>| match (r, me.upgrade()) {
            (Ok(()), Some(dur)) => dur.deferred.lock().push((queue, msg, done)),
            (Ok(()), None) => {
                if let Some(d) = done {
                    d(Err(JournalError::new(
                        "the broker stopped before the removal was journaled",
                    )));
                }
            }
            (Err(e), _) => {
                tracing::error!(queue, msg, error = %e, "a dead-lettered copy was not stored; the message stays in its queue and returns after a restart");
                if let Some(d) = done {
                    d(Err(e));
                }
            }
        })
    }

    /// Journals the removals whose prerequisite writes are durable.
    pub fn flush_removals(&self) {
        let due = std::mem::take(&mut *self.deferred.lock());
        if due.is_empty() {
            return;
        }
        let mut by_queue: BTreeMap<u64, (Vec<u64>, Vec<Done>)> = BTreeMap::new();
        for (q, m, d) in due {
            let e = by_queue.entry(q).or_default();
            e.0.push(m);
            e.1.extend(d);
        }
        for (q, (msgs, dones)) in by_queue {
            self.journal.remove(q, &msgs, all_of(dones));
        }
    }

    /// Turns the event log on (once, at startup).
    pub fn set_events(&self, sink: Arc<dyn EventSink>) {
        if self.events.set(sink).is_err() {
            tracing::warn!("the event log was already set; keeping the first");
        }
    }

    /// The event log, if it is on, shared.
    pub fn event_sink(&self) -> Option<Arc<dyn EventSink>> {
        self.events.get().cloned()
    }

    /// The event log, if it is on.
    #[inline]
    pub fn events(&self) -> Option<&dyn EventSink> {
        self.events.get().map(|s| s.as_ref())
    }

    pub fn journal(&self) -> &dyn Journal {
        self.journal.as_ref()
    }

    /// A fresh journal message id.
    pub fn new_message_id(&self) -> u64 {
        self.next_msg_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh journal queue id for a durable queue.
    pub fn new_queue_id(&self) -> u64 {
        self.next_queue_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh journal queue id for a queue's paging copies.
    pub fn new_paging_id(&self) -> u64 {
        self.new_queue_id() | PAGING_BIT
    }

    pub fn resident_messages_max(&self) -> usize {
        self.resident_messages_max.load(Ordering::Relaxed)
    }

    pub fn set_resident_messages_max(&self, n: usize) {
        self.resident_messages_max.store(n, Ordering::Relaxed);
    }
}

/// One completion that runs each of `dones` with the same result (`None`
/// if there are none).
pub fn all_of(dones: Vec<Done>) -> Option<Done> {
    if dones.is_empty() {
        return None;
    }
    Some(Box::new(move |r: Result<(), JournalError>| {
        for d in dones {
            d(r.clone());
        }
    }))
}

/// Splits `done` into `n` completions: it runs once all of them have run,
/// with the first error any of them got.
pub fn split_done(done: Done, n: usize) -> Vec<Done> {
    assert!(n > 0, "a completion splits into at least one part");
    struct Countdown {
        left: usize,
        result: Result<(), JournalError>,
        done: Option<Done>,
    }
    let shared = Arc::new(Mutex::new(Countdown {
        left: n,
        result: Ok(()),
        done: Some(done),
    }));
    (0..n)
        .map(|_| {
            let shared = Arc::clone(&shared);
            Box::new(move |r: Result<(), JournalError>| {
                let fire = {
                    let mut c = shared.lock();
                    if c.result.is_ok() {
                        c.result = r;
                    }
                    c.left -= 1;
                    (c.left == 0).then(|| (c.done.take(), c.result.clone()))
                };
                if let Some((Some(d), r)) = fire {
                    d(r);
                }
            }) as Done
        })
        .collect()
}

/// A journal that keeps nothing (the broker without a store).
pub struct NoJournal;

impl Journal for NoJournal {
    fn publish(&self, _msg: u64, _queues: &[u64], _payload: Bytes, done: Option<Done>) {
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn remove(&self, _queue: u64, _msgs: &[u64], done: Option<Done>) {
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn purge(&self, _queue: u64, done: Option<Done>) {
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn put_meta(&self, _key: &[u8], _value: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    fn delete_meta(&self, _key: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
}

/// An in-memory journal that records what it was told, for tests: what it
/// holds is exactly what a perfect store would give back after a restart.
#[derive(Default)]
pub struct MemoryJournal {
    pub meta: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// queue → (msg → payload), in publish order.
    pub messages: Mutex<BTreeMap<u64, BTreeMap<u64, Bytes>>>,
}

impl Journal for MemoryJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        let mut m = self.messages.lock();
        for q in queues {
            m.entry(*q).or_default().insert(msg, payload.clone());
        }
        drop(m);
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        if let Some(q) = self.messages.lock().get_mut(&queue) {
            for id in msgs {
                q.remove(id);
            }
        }
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.messages.lock().remove(&queue);
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.meta.lock().insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.meta.lock().remove(key);
        Ok(())
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.messages
            .lock()
            .get(&queue)
            .and_then(|q| q.get(&msg))
            .cloned()
            .ok_or_else(|| {
                JournalError::new(format!("message {msg} of queue {queue} is not stored"))
            })
    }
    fn pages(&self) -> bool {
        true
    }
    fn written(&self, queue: u64, msgs: &[u64]) -> Vec<bool> {
        let m = self.messages.lock();
        let q = m.get(&queue);
        msgs.iter()
            .map(|id| q.is_some_and(|q| q.contains_key(id)))
            .collect()
    }
}

// --- Encodings -------------------------------------------------------------
//
// Metadata keys: `q\0VHOST\0NAME`, `x\0VHOST\0NAME`,
// `b\0VHOST\0SOURCE\0q|x\0DESTINATION\0ROUTING_KEY\0ARGS-HEX`; values are
// AMQP field tables (the codec berth already has, self-describing and
// extensible). Message payload: u8 exchange length, exchange, u8 routing key
// length, routing key, u32 BE properties length, properties, body.

/// Key of a queue definition.
pub fn queue_key(vhost: &str, name: &str) -> Vec<u8> {
    join(&[b"q", vhost.as_bytes(), name.as_bytes()])
}

/// Key of an exchange definition.
pub fn exchange_key(vhost: &str, name: &str) -> Vec<u8> {
    join(&[b"x", vhost.as_bytes(), name.as_bytes()])
}

/// Key of a binding definition.
pub fn binding_key(
    vhost: &str,
    source: &str,
    to_queue: bool,
    destination: &str,
    routing_key: &str,
    args: &FieldTable,
) -> Vec<u8> {
    let args_hex: String = encode_field_table(args)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    join(&[
        b"b",
        vhost.as_bytes(),
        source.as_bytes(),
        if to_queue { b"q" } else { b"x" },
        destination.as_bytes(),
        routing_key.as_bytes(),
        args_hex.as_bytes(),
    ])
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(p);
    }
    out
}

/// Splits a metadata key into its parts.
pub fn split_key(key: &[u8]) -> Vec<String> {
    key.split(|b| *b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v.as_bytes().to_vec()))
}

/// A stored table value as bytes.
pub fn table_bytes(entries: &[(&str, AMQPValue)]) -> Vec<u8> {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    encode_field_table(&t)
}

/// Reads a stored table value.
pub fn read_table(bytes: &[u8]) -> Option<FieldTable> {
    decode_field_table(bytes)
}

/// The store's queue id recorded in a queue definition's value (what the
/// store tools use to name a queue id).
pub fn queue_id_of(value: &[u8]) -> Option<u64> {
    match read_table(value)?.inner().get("id")? {
        AMQPValue::LongLongInt(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// A queue definition's value.
pub fn queue_value(id: u64, auto_delete: bool, arguments: &FieldTable) -> Vec<u8> {
    table_bytes(&[
        (
            "id",
            AMQPValue::LongLongInt(i64::try_from(id).unwrap_or(i64::MAX)),
        ),
        ("auto_delete", AMQPValue::Boolean(auto_delete)),
        ("arguments", AMQPValue::FieldTable(arguments.clone())),
    ])
}

/// An exchange definition's value.
pub fn exchange_value(
    kind: &str,
    auto_delete: bool,
    internal: bool,
    arguments: &FieldTable,
) -> Vec<u8> {
    table_bytes(&[
        ("type", s(kind)),
        ("auto_delete", AMQPValue::Boolean(auto_delete)),
        ("internal", AMQPValue::Boolean(internal)),
        ("arguments", AMQPValue::FieldTable(arguments.clone())),
    ])
}

/// A binding definition's value (its arguments).
pub fn binding_value(arguments: &FieldTable) -> Vec<u8> {
    table_bytes(&[("arguments", AMQPValue::FieldTable(arguments.clone()))])
}

/// Encodes a message for the journal.
pub fn encode_message(exchange: &str, routing_key: &str, properties: &[u8], body: &[u8]) -> Bytes {
    let ex = &exchange.as_bytes()[..exchange.len().min(255)];
    let rk = &routing_key.as_bytes()[..routing_key.len().min(255)];
    let mut b =
        BytesMut::with_capacity(2 + ex.len() + rk.len() + 4 + properties.len() + body.len());
    b.put_u8(ex.len() as u8);
    b.extend_from_slice(ex);
    b.put_u8(rk.len() as u8);
    b.extend_from_slice(rk);
    b.put_u32(properties.len() as u32);
    b.extend_from_slice(properties);
    b.extend_from_slice(body);
    b.freeze()
}

/// A decoded journal message: (exchange, routing key, properties, body).
pub type StoredMessage = (String, String, Bytes, Bytes);

/// Decodes a message written by [`encode_message`]; `None` if it is not
/// well formed (the caller reports it with the queue and message id).
pub fn decode_message(p: &Bytes) -> Option<StoredMessage> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<Bytes> {
        let end = at.checked_add(n)?;
        if end > p.len() {
            return None;
        }
        let out = p.slice(at..end);
        at = end;
        Some(out)
    };
    let exl = take(1)?[0] as usize;
    let exchange = String::from_utf8(take(exl)?.to_vec()).ok()?;
    let rkl = take(1)?[0] as usize;
    let routing_key = String::from_utf8(take(rkl)?.to_vec()).ok()?;
    let pl = u32::from_be_bytes(take(4)?[..].try_into().ok()?) as usize;
    let properties = take(pl)?;
    let body = p.slice(at..);
    Some((exchange, routing_key, properties, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_encoding_roundtrips() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello");
        let (e, k, p, body) = decode_message(&b).unwrap();
        assert_eq!(
            (e.as_str(), k.as_str(), &p[..], &body[..]),
            ("ex", "a.b", &b"\x10\x00\x02"[..], &b"hello"[..])
        );
    }

    #[test]
    fn truncated_message_is_refused_not_misread() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"");
        for cut in 0..b.len() - 1 {
            assert!(decode_message(&b.slice(..cut)).is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn keys_split_back_into_their_parts() {
        let k = binding_key("/", "src", true, "q1", "a.#", &FieldTable::default());
        let parts = split_key(&k);
        assert_eq!(&parts[..6], ["b", "/", "src", "q", "q1", "a.#"]);
    }

    /// docs/FORMAT.md, "Broker payloads": a message as the broker stores it.
    #[test]
    fn golden_bytes_message_payload() {
        let b = encode_message("ex", "a.b", b"\x10\x00\x02", b"hello");
        let expected: &[u8] = &[
            0x02, b'e', b'x', // exchange: u8 length, bytes
            0x03, b'a', b'.', b'b', // routing key: u8 length, bytes
            0x00, 0x00, 0x00, 0x03, // properties length: u32 big-endian
            0x10, 0x00, 0x02, // properties as on the wire
            b'h', b'e', b'l', b'l', b'o', // body: the rest
        ];
        assert_eq!(&b[..], expected);
    }

    /// docs/FORMAT.md, "Broker metadata": a durable queue's definition.
    #[test]
    fn golden_bytes_queue_definition() {
        assert_eq!(queue_key("/", "q1"), b"q\0/\0q1");
        let v = queue_value(7, false, &FieldTable::default());
        let mut expected: Vec<u8> = vec![0, 0, 0, 41]; // table length, u32 BE
        expected.extend_from_slice(b"\x09arguments"); // keys sorted, shortstr
        expected.extend_from_slice(&[b'F', 0, 0, 0, 0]); // empty table
        expected.extend_from_slice(b"\x0bauto_delete");
        expected.extend_from_slice(&[b't', 0]); // boolean false
        expected.extend_from_slice(b"\x02id");
        expected.extend_from_slice(&[b'l', 0, 0, 0, 0, 0, 0, 0, 7]); // i64 BE
        assert_eq!(v, expected);
    }

    #[test]
    fn a_split_completion_runs_once_after_every_part_with_the_first_error() {
        let got: Arc<Mutex<Vec<Result<(), JournalError>>>> = Arc::default();
        let g = Arc::clone(&got);
        let mut parts = split_done(Box::new(move |r| g.lock().push(r)), 3).into_iter();
        parts.next().unwrap()(Ok(()));
        parts.next().unwrap()(Err(JournalError::new("disk full")));
        assert!(got.lock().is_empty(), "waits for the last part");
        parts.next().unwrap()(Ok(()));
        let got = got.lock();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().to_string(), "disk full");
    }
}
