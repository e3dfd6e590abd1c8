//! A restart with 1,000 pending delayed messages of 1 MiB each (issue 48):
//! recovery reads each one's due time (8 bytes at the head of its
//! payload), never a body, counted by the journal; each message is still
//! routed at its due time, not before. The journal here keeps each
//! payload's head and gives the body back as it was written (every body
//! is its 8-byte number followed by the same filler), so the test holds
//! kilobytes, not a gigabyte.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{complete, Done, Durability, Journal, JournalError, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::{Broker, Recovered};
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

const BODY_BYTES: usize = 1024 * 1024;
const FILLER: u8 = b'b';
/// Bytes of each body after its number: all [`FILLER`].
const FILL_BYTES: usize = BODY_BYTES - 8;
const MESSAGES: u64 = 1_000;

/// A stored payload without its filler, and how many filler bytes were cut.
type Kept = (Bytes, usize);

/// A journal that keeps a message's payload without its filler, and
/// counts what it hands back.
#[derive(Default)]
struct FillerJournal {
    meta: MemoryJournal,
    /// queue → msg → (payload without its filler, filler bytes cut).
    messages: Mutex<BTreeMap<u64, BTreeMap<u64, Kept>>>,
    bytes_read: AtomicU64,
}

impl FillerJournal {
    fn whole(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        let m = self.messages.lock();
        let (kept, cut) = (m.get(&queue).and_then(|q| q.get(&msg)))
            .cloned()
            .ok_or_else(|| JournalError::new(format!("{msg} of {queue} not stored")))?;
        let mut b = BytesMut::with_capacity(kept.len() + cut);
        b.extend_from_slice(&kept);
        b.resize(kept.len() + cut, FILLER);
        Ok(b.freeze())
    }
}

impl Journal for FillerJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        let cut = if payload.len() >= FILL_BYTES
            && payload[payload.len() - FILL_BYTES..]
                .iter()
                .all(|b| *b == FILLER)
        {
            FILL_BYTES
        } else {
            0
        };
        let kept = payload.slice(..payload.len() - cut);
        let mut m = self.messages.lock();
        for q in queues {
            m.entry(*q).or_default().insert(msg, (kept.clone(), cut));
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
        complete(done, Ok(()));
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.meta.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.meta.delete_meta(key)
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        let p = self.whole(queue, msg)?;
        self.bytes_read.fetch_add(p.len() as u64, Ordering::Relaxed);
        Ok(p)
    }
    fn read_heads(&self, queue: u64, msgs: &[u64], len: usize) -> Vec<Result<Bytes, JournalError>> {
        let stored = self.messages.lock();
        (msgs.iter())
            .map(|id| {
                let (kept, _) = (stored.get(&queue).and_then(|q| q.get(id)))
                    .ok_or_else(|| JournalError::new(format!("{id} of {queue} not stored")))?;
                let head = kept.slice(..len.min(kept.len()));
                self.bytes_read
                    .fetch_add(head.len() as u64, Ordering::Relaxed);
                Ok(head)
            })
            .collect()
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

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

struct World {
    journal: Arc<FillerJournal>,
    clock: Arc<ManualClock>,
    broker: Arc<Broker>,
    v: Arc<VHost>,
}

impl World {
    fn over(journal: Arc<FillerJournal>, clock: Arc<ManualClock>, msg: u64, queue: u64) -> Self {
        let dur = Durability::new(journal.clone(), msg, queue);
        let broker = Broker::with_parts(["/"], dur, clock.clone() as Arc<dyn Clock>);
        let v = broker.vhost("/").unwrap();
        Self {
            journal,
            clock,
            broker,
            v,
        }
    }

    /// "Crash" and start again; the store gives back ids and sizes only,
    /// as a restart of the real store does.
    fn restart(&self) -> Self {
        let r = Recovered {
            streams: Default::default(),
            meta: (self.journal.meta.meta.lock().iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            messages: Default::default(),
            paged: (self.journal.messages.lock().iter())
                .map(|(q, m)| {
                    let list = m
                        .iter()
                        .map(|(id, (kept, cut))| (*id, u32::try_from(kept.len() + cut).unwrap()));
                    (*q, list.collect())
                })
                .collect(),
        };
        let (msg, queue) = r.next_ids();
        let w = Self::over(self.journal.clone(), self.clock.clone(), msg, queue);
        let report = w.broker.restore(r, w.clock.now());
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        assert_eq!(report.delayed_messages, MESSAGES as usize);
        w
    }

    fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.broker.run_timers(self.clock.now());
    }

    /// The numbers of the messages ready in `q`, taken.
    fn take(&self, queue: &str) -> Vec<u64> {
        let q = self.v.queue(1, queue).unwrap();
        let mut out = Vec::new();
        while let Some((m, _)) = q.get(true, self.clock.now()) {
            assert_eq!(m.msg.body.len(), BODY_BYTES);
            out.push(u64::from_le_bytes(m.msg.body[..8].try_into().unwrap()));
        }
        out
    }
}

#[test]
fn a_restart_with_1000_pending_messages_of_1_mib_reads_no_body() {
    let journal = Arc::new(FillerJournal::default());
    let clock = Arc::new(ManualClock::new(Instant::now(), 1_700_000_000));
    let w = World::over(journal, clock, 1, 1);
    let d = ExchangeDeclare {
        kind: "x-delayed-message".into(),
        durable: true,
        arguments: table(&[("x-delayed-type", AMQPValue::LongString("direct".into()))]),
        ..Default::default()
    };
    w.v.declare_exchange("d", &d).unwrap();
    let q = QueueDeclare {
        durable: true,
        ..Default::default()
    };
    w.v.declare_queue(1, "q", &q, w.clock.now()).unwrap();
    w.v.bind_queue(1, "q", "d", "k", &FieldTable::default())
        .unwrap();
    let filler = vec![FILLER; FILL_BYTES];
    for i in 0..MESSAGES {
        // Due 1 s, 1.01 s, 1.02 s, ... after the first publish.
        let delay = i64::try_from(1_000 + 10 * i).unwrap();
        let p = AMQPProperties::default()
            .with_delivery_mode(2)
            .with_headers(table(&[("x-delay", AMQPValue::LongLongInt(delay))]));
        let mut body = i.to_le_bytes().to_vec();
        body.extend_from_slice(&filler);
        let m = Message::new("d".into(), "k".into(), encode_properties(&p), body.into()).unwrap();
        (w.v.publish("d", &m, w.clock.now(), &mut || Box::new(|r| r.unwrap()))).unwrap();
    }
    w.journal.bytes_read.store(0, Ordering::Relaxed);
    let w2 = w.restart();
    let read = w2.journal.bytes_read.load(Ordering::Relaxed);
    assert!(
        read <= MESSAGES * 8,
        "a restart read {read} bytes to learn {MESSAGES} due times of 8 bytes each"
    );
    // Each is routed at its due time, not a millisecond before.
    w2.advance_ms(999);
    assert!(w2.take("q").is_empty(), "nothing before 1 s");
    for i in 0..MESSAGES {
        w2.advance_ms(1);
        assert_eq!(w2.take("q"), [i], "message {i} at its due time");
        w2.advance_ms(9);
        assert!(w2.take("q").is_empty(), "nothing between due times");
    }
}
