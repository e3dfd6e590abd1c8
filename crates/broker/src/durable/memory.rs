//! Journals that keep nothing on disk: [`NoJournal`] (the broker without
//! a store) and [`MemoryJournal`] (tests: what it holds is exactly what a
//! perfect store would give back after a restart, and it can be told to
//! fail metadata or message writes, as a store whose disk fails would).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use super::{complete, Done, Journal, JournalError, MessageParts};

/// A journal that keeps nothing (the broker without a store).
pub struct NoJournal;

impl Journal for NoJournal {
    fn publish(&self, _msg: u64, _queues: &[u64], _payload: Bytes, done: Option<Done>) {
        complete(done, Ok(()));
    }
    fn publish_message(
        &self,
        _msg: u64,
        _queues: &[u64],
        _payload: MessageParts<'_>,
        done: Option<Done>,
    ) {
        // Nothing is kept: joining the parts would be a copy for nothing.
        complete(done, Ok(()));
    }
    fn remove(&self, _queue: u64, _msgs: &[u64], done: Option<Done>) {
        complete(done, Ok(()));
    }
    fn purge(&self, _queue: u64, done: Option<Done>) {
        complete(done, Ok(()));
    }
    fn put_meta(&self, _key: &[u8], _value: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    fn delete_meta(&self, _key: &[u8]) -> Result<(), JournalError> {
        Ok(())
    }
    fn stream_append(&self, _queue: u64, _offset: u64, _payload: Bytes, done: Option<Done>) {
        complete(done, Ok(()));
    }
}

/// A stream [`MemoryJournal`] holds: its trim point, and offset → payload.
pub type MemoryStream = (u64, BTreeMap<u64, Bytes>);

/// One metadata write: key, and value (`None`: a delete).
pub type MetaWrite = (Vec<u8>, Option<Vec<u8>>);

/// An in-memory journal that records what it was told, for tests: what it
/// holds is exactly what a perfect store would give back after a restart.
#[derive(Default)]
pub struct MemoryJournal {
    pub meta: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Every metadata write in the order it was made durable (key, value;
    /// `None`: a delete): the command stream a replica would replay.
    pub meta_log: Mutex<Vec<MetaWrite>>,
    /// While set, metadata writes fail (and change nothing), as with a
    /// store whose disk failed.
    pub fail_meta: AtomicBool,
    /// While set, message writes fail (their completions get an error and
    /// nothing is kept), as with a store whose disk failed.
    pub fail_messages: AtomicBool,
    /// queue → (msg → payload), in publish order.
    pub messages: Mutex<BTreeMap<u64, BTreeMap<u64, Bytes>>>,
    /// Streams by queue.
    pub streams: Mutex<BTreeMap<u64, MemoryStream>>,
    /// Payload bytes handed back by reads (`read`, `read_many`,
    /// `read_heads`), for tests that bound what a restart reads.
    pub bytes_read: AtomicU64,
}

impl Journal for MemoryJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        if self.fail_messages.load(Ordering::Relaxed) {
            let why = "injected failure: the message write was not stored";
            complete(done, Err(JournalError::new(why)));
            return;
        }
        let mut m = self.messages.lock();
        for q in queues {
            m.entry(*q).or_default().insert(msg, payload.clone());
        }
        drop(m);
        complete(done, Ok(()));
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        if let Some(q) = self.messages.lock().get_mut(&queue) {
            for id in msgs {
                q.remove(id);
            }
        }
        complete(done, Ok(()));
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.messages.lock().remove(&queue);
        self.streams.lock().remove(&queue);
        complete(done, Ok(()));
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.check_meta_write()?;
        self.meta.lock().insert(key.to_vec(), value.to_vec());
        (self.meta_log.lock()).push((key.to_vec(), Some(value.to_vec())));
        Ok(())
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.check_meta_write()?;
        self.meta.lock().remove(key);
        self.meta_log.lock().push((key.to_vec(), None));
        Ok(())
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        let p = self.stored(queue, msg)?;
        self.bytes_read.fetch_add(p.len() as u64, Ordering::Relaxed);
        Ok(p)
    }
    fn read_heads(&self, queue: u64, msgs: &[u64], len: usize) -> Vec<Result<Bytes, JournalError>> {
        (msgs.iter())
            .map(|m| {
                let p = self.stored(queue, *m)?;
                let head = p.slice(..len.min(p.len()));
                self.bytes_read
                    .fetch_add(head.len() as u64, Ordering::Relaxed);
                Ok(head)
            })
            .collect()
    }
    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        (self.streams.lock())
            .entry(queue)
            .or_default()
            .1
            .insert(offset, payload);
        complete(done, Ok(()));
    }
    fn stream_trim(&self, queue: u64, below: u64, done: Option<Done>) {
        let mut m = self.streams.lock();
        let q = m.entry(queue).or_default();
        q.0 = q.0.max(below);
        q.1.retain(|o, _| *o >= below);
        complete(done, Ok(()));
    }
    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        let m = self.streams.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (o, p) in m.get(&queue).into_iter().flat_map(|q| q.1.range(from..)) {
            if out.len() >= count_max || bytes >= bytes_max {
                break;
            }
            bytes += p.len();
            out.push((*o, p.clone()));
        }
        Ok(out)
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

impl MemoryJournal {
    /// Message `msg` of `queue` as stored, not counted as read.
    fn stored(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        (self.messages.lock().get(&queue))
            .and_then(|q| q.get(&msg))
            .cloned()
            .ok_or_else(|| {
                JournalError::new(format!("message {msg} of queue {queue} is not stored"))
            })
    }

    /// Its streams as a store gives them back after a restart.
    pub fn stored_streams(&self) -> std::collections::HashMap<u64, super::StoredStream> {
        self.streams
            .lock()
            .iter()
            .filter_map(|(q, (trimmed, m))| {
                let (&first, _) = m.first_key_value()?;
                let (&last, _) = m.last_key_value()?;
                let mut before = 0;
                let marks = m
                    .iter()
                    .map(|(o, p)| {
                        let mark = (*o, before);
                        before += p.len() as u64;
                        mark
                    })
                    .collect();
                let stored = super::StoredStream {
                    first: first.max(*trimmed),
                    end: last + 1,
                    messages: m.len() as u64,
                    bytes: before,
                    marks,
                };
                Some((*q, stored))
            })
            .collect()
    }

    /// Makes every metadata write fail from now on (`true`) or succeed
    /// again (`false`).
    pub fn fail_meta_writes(&self, fail: bool) {
        self.fail_meta.store(fail, Ordering::Relaxed);
    }

    /// Makes every message write fail from now on (`true`) or succeed
    /// again (`false`).
    pub fn fail_message_writes(&self, fail: bool) {
        self.fail_messages.store(fail, Ordering::Relaxed);
    }

    fn check_meta_write(&self) -> Result<(), JournalError> {
        if self.fail_meta.load(Ordering::Relaxed) {
            return Err(JournalError::new(
                "injected failure: the metadata write was not stored",
            ));
        }
        Ok(())
    }
}
