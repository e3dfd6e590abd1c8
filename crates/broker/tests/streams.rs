//! Streams at the broker's level, over `MemoryJournal` (a perfect store):
//! a restart that finds a gap (a write lost before a crash, never a
//! confirmed one) keeps every later offset, and retention by age follows
//! the broker's clock and moves readers to the new first offset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Outlet, Session};
use berth_broker::clock::{Clock, ManualClock};
use berth_broker::durable::{Done, Durability, Journal, JournalError, MemoryJournal};
use berth_broker::message::Message;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;
use parking_lot::Mutex;

mod common;
use common::{restart, Bodies};

/// (x-stream-offset header, body) of every delivery, with its tag; and
/// how often a queue asked whether it may deliver.
#[derive(Default)]
struct Sink(
    Mutex<Vec<(u64, i64, Vec<u8>)>>,
    std::sync::atomic::AtomicUsize,
);

impl Outlet for Sink {
    fn deliver(&self, _: u16, _: &str, tag: u64, _: bool, m: &Message) {
        let offset = match m
            .headers()
            .and_then(|h| h.inner().get("x-stream-offset").cloned())
        {
            Some(AMQPValue::LongLongInt(o)) => o,
            other => panic!("x-stream-offset missing or of the wrong type: {other:?}"),
        };
        self.0.lock().push((tag, offset, m.body.to_vec()));
    }
    fn get_ok(&self, _: u16, _: u64, _: bool, _: &Message, _: u32) {
        panic!("no basic.get on a stream");
    }
    fn consumer_cancelled(&self, _: u16, _: &str) {}
    fn is_congested(&self) -> bool {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        false
    }
}

fn channel(v: &Arc<VHost>, out: &Arc<Sink>) -> Arc<Channel> {
    Channel::new(
        1,
        Arc::new(Session {
            connection_id: 1,
            vhost: Arc::clone(v),
            outlet: Arc::clone(out) as Arc<dyn Outlet>,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: Arc::from("guest"),
            events: None,
        }),
    )
}

fn stream_args(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    for (k, v) in extra {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn declare(v: &VHost, name: &str, args: FieldTable, now: Instant) {
    let d = QueueDeclare {
        durable: true,
        arguments: args,
        ..Default::default()
    };
    v.declare_queue(1, name, &d, now).expect("declare a stream");
}

fn publish(v: &VHost, queue: &str, body: &str, now: Instant) {
    let m = Message::new(
        String::new(),
        queue.to_owned(),
        encode_properties(&AMQPProperties::default()),
        Bytes::from(body.to_owned()),
    )
    .unwrap();
    let mut done = || -> Done { Box::new(|r| r.expect("journaled")) };
    assert_eq!(v.publish("", &m, now, &mut done).unwrap().queues, 1);
}

/// A reader of stream `queue` from `offset` (an `x-stream-offset`) on a
/// channel of its own with prefetch `prefetch`: the channel (the caller
/// keeps it open) and what reaches it.
fn reader(
    v: &Arc<VHost>,
    queue: &str,
    offset: AMQPValue,
    prefetch: u16,
    now: Instant,
) -> (Arc<Channel>, Arc<Sink>) {
    let out = Arc::new(Sink::default());
    let ch = channel(v, &out);
    ch.qos(prefetch, false, now);
    let mut args = FieldTable::default();
    args.insert("x-stream-offset".into(), offset);
    let q = v.queue(1, queue).unwrap();
    ch.consume_with(q, "", false, false, &args, now, |_| {})
        .expect("consume");
    (ch, out)
}

fn first() -> AMQPValue {
    AMQPValue::LongString("first".into())
}

/// Consumes `queue` from `offset` with prefetch 100; returns what arrived.
fn read_from(v: &Arc<VHost>, queue: &str, offset: AMQPValue, now: Instant) -> Vec<(i64, Vec<u8>)> {
    let (ch, out) = reader(v, queue, offset, 100, now);
    let got = out
        .0
        .lock()
        .iter()
        .map(|(_, o, b)| (*o, b.clone()))
        .collect();
    ch.close(now);
    got
}

#[test]
fn a_gap_left_by_a_crash_keeps_every_later_offset() {
    let t0 = Instant::now();
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    for i in 0..10 {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    // The write of offset 3 never reached the disk (its publisher was
    // never confirmed); the writes after it did.
    {
        let mut m = journal.streams.lock();
        let q = &mut m.values_mut().next().expect("the stream's messages").1;
        assert!(q.remove(&3).is_some(), "offset 3 was appended");
    }
    let (broker2, report) = restart(&journal, Bodies::OnDisk, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.messages, 9);
    let v2 = broker2.vhost("/").unwrap();
    let got = read_from(&v2, "s", first(), t0);
    let want: Vec<(i64, Vec<u8>)> = [0, 1, 2, 4, 5, 6, 7, 8, 9]
        .iter()
        .map(|i| (*i, format!("m{i}").into_bytes()))
        .collect();
    assert_eq!(got, want);
    // An absolute offset finds its own message, past the gap too.
    let at5 = read_from(&v2, "s", AMQPValue::LongLongInt(5), t0);
    assert_eq!(at5[0], (5, b"m5".to_vec()));
    // The next message continues after the last offset, not the count.
    publish(&v2, "s", "m10", t0);
    let last = read_from(&v2, "s", AMQPValue::LongString("last".into()), t0);
    assert_eq!(last, vec![(10, b"m10".to_vec())]);
}

/// Moves a stream's appends to one publish per message (message ids from
/// 100 on), as berth stored streams before the journal had them.
fn to_legacy(journal: &MemoryJournal) {
    let streams = std::mem::take(&mut *journal.streams.lock());
    let mut m = journal.messages.lock();
    for (q, (_, entries)) in streams {
        let list = m.entry(q).or_default();
        for (offset, payload) in entries {
            list.insert(100 + offset, payload);
        }
    }
}

#[test]
fn a_stream_stored_one_publish_each_moves_to_appends_at_a_restart() {
    let t0 = Instant::now();
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    for i in 0..10 {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    to_legacy(&journal);
    // The write of offset 3 never reached the disk.
    journal
        .messages
        .lock()
        .values_mut()
        .next()
        .unwrap()
        .remove(&103);
    let (broker2, report) = restart(&journal, Bodies::OnDisk, t0);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.messages, 9);
    // Appended at their offsets, and the old records gone.
    let appended: Vec<u64> = journal
        .streams
        .lock()
        .values()
        .next()
        .unwrap()
        .1
        .keys()
        .copied()
        .collect();
    assert_eq!(appended, vec![0, 1, 2, 4, 5, 6, 7, 8, 9]);
    assert!(journal.messages.lock().values().all(|m| m.is_empty()));
    let v2 = broker2.vhost("/").unwrap();
    let got = read_from(&v2, "s", first(), t0);
    assert_eq!(
        got.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![0, 1, 2, 4, 5, 6, 7, 8, 9]
    );
    publish(&v2, "s", "m10", t0);
    let last = read_from(&v2, "s", AMQPValue::LongString("last".into()), t0);
    assert_eq!(last, vec![(10, b"m10".to_vec())]);
}

#[test]
fn a_legacy_entry_far_past_the_others_is_reported_not_filled() {
    let t0 = Instant::now();
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    for i in 0..3 {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    to_legacy(&journal);
    // Damage that passed the checksum: the last entry claims an offset
    // a trillion past the others.
    {
        let mut m = journal.messages.lock();
        let q = m.values_mut().next().unwrap();
        let ids: Vec<u64> = q.keys().copied().collect();
        let mut bad = q[&ids[2]].to_vec();
        bad[1..9].copy_from_slice(&(1u64 << 40).to_le_bytes());
        q.insert(ids[2], Bytes::from(bad));
    }
    let (broker2, report) = restart(&journal, Bodies::OnDisk, t0);
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert!(
        report.skipped[0].contains("past a gap"),
        "{:?}",
        report.skipped
    );
    let v2 = broker2.vhost("/").unwrap();
    let got = read_from(&v2, "s", first(), t0);
    assert_eq!(got, vec![(0, b"m0".to_vec()), (1, b"m1".to_vec())]);
}

#[test]
fn retention_by_age_follows_the_clock_and_moves_readers_to_the_new_first_offset() {
    let t0 = Instant::now();
    let clock = Arc::new(ManualClock::new(t0, 1_700_000_000));
    let journal = Arc::new(MemoryJournal::default());
    let dur = Durability::new(journal.clone(), 1, 1);
    let broker = Broker::with_parts(["/"], dur, clock.clone());
    let v = broker.vhost("/").unwrap();
    // Each entry is well over 60 bytes: a segment holds one message.
    let args = stream_args(&[
        ("x-max-age", AMQPValue::LongString("10s".into())),
        ("x-stream-max-segment-size-bytes", AMQPValue::LongInt(60)),
    ]);
    declare(&v, "aged", args, t0);
    // A reader that stalls at offset 0 (prefetch 1, never acks).
    let (ch, out) = reader(&v, "aged", first(), 1, t0);
    for i in 0..5 {
        publish(&v, "aged", &format!("old{i}"), clock.now());
    }
    clock.advance(Duration::from_secs(20));
    publish(&v, "aged", "new", clock.now());
    let now = clock.now();
    // The old segments went; the active one (the new message) stayed.
    assert_eq!(journal.streams.lock().values().next().unwrap().1.len(), 1);
    let got = read_from(&v, "aged", first(), now);
    assert_eq!(got, vec![(5, b"new".to_vec())]);
    // The stalled reader had offset 0; once it acks, it goes on at 5.
    let tag = out.0.lock()[0].0;
    ch.ack(tag, false, now).unwrap();
    let seen: Vec<i64> = out.0.lock().iter().map(|(_, o, _)| *o).collect();
    assert_eq!(seen, vec![0, 5]);
}

/// A journal whose publish completions wait until the test runs them (a
/// slow fsync), and which reads back what it was given.
#[derive(Default)]
struct HeldJournal {
    inner: MemoryJournal,
    held: Mutex<Vec<Done>>,
}

impl Journal for HeldJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.inner.publish(msg, queues, payload, None);
        self.held.lock().extend(done);
    }
    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        self.inner.stream_append(queue, offset, payload, None);
        self.held.lock().extend(done);
    }
    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        self.inner.stream_read(queue, from, count_max, bytes_max)
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.inner.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.inner.purge(queue, done);
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.inner.delete_meta(key)
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.inner.read(queue, msg)
    }
    fn pages(&self) -> bool {
        true
    }
}

impl HeldJournal {
    /// Completes the oldest `n` held writes.
    fn complete(&self, n: usize) {
        let due: Vec<Done> = self.held.lock().drain(..n).collect();
        for d in due {
            d(Ok(()));
        }
    }
}

#[test]
fn consumers_get_only_messages_whose_write_is_durable() {
    let t0 = Instant::now();
    let journal = Arc::new(HeldJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    let (_ch, out) = reader(&v, "s", AMQPValue::LongString("next".into()), 100, t0);
    let mut unconfirmed = || -> Done { Box::new(|_| {}) };
    for i in 0..3 {
        let m = Message::new(
            String::new(),
            "s".into(),
            encode_properties(&AMQPProperties::default()),
            Bytes::from(format!("m{i}")),
        )
        .unwrap();
        v.publish("", &m, t0, &mut unconfirmed).unwrap();
    }
    let offsets = || -> Vec<i64> { out.0.lock().iter().map(|(_, o, _)| *o).collect() };
    broker.run_timers(Instant::now());
    assert_eq!(
        offsets(),
        Vec::<i64>::new(),
        "nothing before its write is durable"
    );
    journal.complete(2);
    broker.run_timers(Instant::now());
    assert_eq!(offsets(), vec![0, 1]);
    journal.complete(1);
    broker.run_timers(Instant::now());
    assert_eq!(offsets(), vec![0, 1, 2]);
}

/// A consumer at the end of a stream is woken once per commit it waits
/// for, through the waker the server's timer task installs (at once, not
/// at the next tick), and a commit nobody waits for wakes nothing.
/// Counted, not timed. (PerfTest's consumer latency behind four
/// publishers, 145 ms median, came from a lag built while the JVM warmed
/// up and drained slowly on saturated cores, not from waking:
/// docs/BENCHMARKS.md, "Where a stream consumer's latency came from".)
#[test]
fn a_commit_a_caught_up_reader_waits_for_wakes_the_stream_once() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let t0 = Instant::now();
    let journal = Arc::new(HeldJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let wakes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&wakes);
    assert!(broker.set_timer_waker(Box::new(move || {
        w.fetch_add(1, SeqCst);
    })));
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    for i in 0..3 {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    journal.complete(3);
    assert_eq!(wakes.load(SeqCst), 0, "no reader waits: no wake-up");

    let (_ch, out) = reader(&v, "s", AMQPValue::LongString("next".into()), 100, t0);
    let offsets = || -> Vec<i64> { out.0.lock().iter().map(|(_, o, _)| *o).collect() };
    publish(&v, "s", "m3", t0);
    assert_eq!(wakes.load(SeqCst), 0, "not durable yet");
    journal.complete(1);
    assert_eq!(wakes.load(SeqCst), 1, "its commit wakes the stream");
    assert_eq!(offsets(), Vec::<i64>::new(), "delivered by the timer task");
    broker.run_timers(Instant::now());
    assert_eq!(offsets(), vec![3]);
    // Two writes in flight: each commit the reader waits for wakes once.
    publish(&v, "s", "m4", t0);
    publish(&v, "s", "m5", t0);
    journal.complete(1);
    assert_eq!(wakes.load(SeqCst), 2);
    broker.run_timers(Instant::now());
    assert_eq!(offsets(), vec![3, 4]);
    journal.complete(1);
    assert_eq!(wakes.load(SeqCst), 3);
    broker.run_timers(Instant::now());
    assert_eq!(offsets(), vec![3, 4, 5]);
    // Nothing more in flight: run again, nothing more woken or sent.
    broker.run_timers(Instant::now());
    assert_eq!((wakes.load(SeqCst), offsets().len()), (3, 3));
}

/// A journal that counts the messages read back from it.
#[derive(Default)]
struct CountingJournal {
    inner: MemoryJournal,
    reads: std::sync::atomic::AtomicUsize,
}

impl Journal for CountingJournal {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.inner.publish(msg, queues, payload, done);
    }
    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        self.inner.stream_append(queue, offset, payload, done);
    }
    fn stream_trim(&self, queue: u64, below: u64, done: Option<Done>) {
        self.inner.stream_trim(queue, below, done);
    }
    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        let got = self.inner.stream_read(queue, from, count_max, bytes_max)?;
        self.reads
            .fetch_add(got.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(got)
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.inner.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.inner.purge(queue, done);
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.inner.delete_meta(key)
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.read(queue, msg)
    }
    fn pages(&self) -> bool {
        true
    }
}

#[test]
fn ten_readers_behind_share_what_is_read_back_instead_of_reading_it_each() {
    const MESSAGES: usize = 5000;
    const READERS: usize = 10;
    let t0 = Instant::now();
    let journal = Arc::new(CountingJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "fan", stream_args(&[]), t0);
    for i in 0..MESSAGES {
        publish(&v, "fan", &format!("m{i}"), t0);
    }
    let readers: Vec<(Arc<Channel>, Arc<Sink>)> = (0..READERS)
        .map(|_| reader(&v, "fan", first(), 50, t0))
        .collect();
    // Readers go at different speeds (the odd ones ack every other
    // round), so they drift apart as PerfTest's consumers do.
    let mut acked = [0usize; READERS];
    for round in 0.. {
        let mut all_done = true;
        for (k, (ch, out)) in readers.iter().enumerate() {
            let got = out.0.lock().len();
            if got < MESSAGES {
                all_done = false;
            }
            if (k % 2 == 1 && round % 2 == 1) || got == acked[k] {
                continue;
            }
            let tag = out.0.lock()[got - 1].0;
            ch.ack(tag, true, t0).unwrap();
            acked[k] = got;
        }
        if all_done {
            break;
        }
        assert!(round < 10 * MESSAGES, "the readers stopped");
    }
    for (_, out) in &readers {
        let offsets: Vec<i64> = out.0.lock().iter().map(|(_, o, _)| *o).collect();
        assert_eq!(offsets, (0..MESSAGES as i64).collect::<Vec<_>>());
    }
    let reads = journal.reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        reads <= 2 * MESSAGES,
        "{READERS} readers read {reads} messages back for a stream of {MESSAGES}: each read it on its own"
    );
}

#[test]
fn an_ack_on_a_stream_offers_deliveries_only_to_readers_with_credit() {
    const READERS: usize = 10;
    let t0 = Instant::now();
    let journal = Arc::new(MemoryJournal::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    for i in 0..100 {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    let readers: Vec<(Arc<Channel>, Arc<Sink>)> = (0..READERS)
        .map(|_| reader(&v, "s", first(), 1, t0))
        .collect();
    let asked = || -> Vec<usize> {
        readers
            .iter()
            .map(|(_, o)| o.1.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    };
    let before = asked();
    // Reader 0 acks its one delivery: it alone has credit again.
    let (ch, out) = &readers[0];
    let tag = out.0.lock()[0].0;
    ch.ack(tag, false, t0).unwrap();
    assert_eq!(out.0.lock().len(), 2, "reader 0 got its next message");
    let after = asked();
    let others: usize = (1..READERS).map(|k| after[k] - before[k]).sum();
    assert_eq!(
        others, 0,
        "the ack of reader 0 offered deliveries to readers without credit (asked {before:?} then {after:?})"
    );
}

/// A journal whose stream appends complete at once (a cluster's commit)
/// but become readable only when the test applies them (the member's
/// store writing them when it applies the entry).
#[derive(Default)]
struct CommitsFirst {
    inner: MemoryJournal,
    unapplied: Mutex<Vec<(u64, u64, Bytes)>>,
    readable_end: Mutex<u64>,
}

impl Journal for CommitsFirst {
    fn publish(&self, msg: u64, queues: &[u64], payload: Bytes, done: Option<Done>) {
        self.inner.publish(msg, queues, payload, done);
    }
    fn stream_append(&self, queue: u64, offset: u64, payload: Bytes, done: Option<Done>) {
        self.unapplied.lock().push((queue, offset, payload));
        if let Some(d) = done {
            d(Ok(()));
        }
    }
    fn stream_read(
        &self,
        queue: u64,
        from: u64,
        count_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, JournalError> {
        self.inner.stream_read(queue, from, count_max, bytes_max)
    }
    fn stream_readable_end(&self, _queue: u64) -> Option<u64> {
        Some(*self.readable_end.lock())
    }
    fn remove(&self, queue: u64, msgs: &[u64], done: Option<Done>) {
        self.inner.remove(queue, msgs, done);
    }
    fn purge(&self, queue: u64, done: Option<Done>) {
        self.inner.purge(queue, done);
    }
    fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<(), JournalError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &[u8]) -> Result<(), JournalError> {
        self.inner.delete_meta(key)
    }
    fn read(&self, queue: u64, msg: u64) -> Result<Bytes, JournalError> {
        self.inner.read(queue, msg)
    }
    fn pages(&self) -> bool {
        true
    }
}

impl CommitsFirst {
    /// Makes every committed append readable.
    fn apply(&self) {
        for (queue, offset, payload) in self.unapplied.lock().drain(..) {
            self.inner.stream_append(queue, offset, payload, None);
            *self.readable_end.lock() = offset + 1;
        }
    }
}

/// In a cluster a stream append completes once committed, before this
/// member's store has written it; the stream let its resident tail go
/// at the completion, so a reader behind it read an empty range from the
/// store and skipped those offsets: confirmed messages it never got
/// (issue 45). The tail now stays until the journal reads it back.
#[test]
fn a_reader_behind_never_skips_what_the_journal_cannot_read_back_yet() {
    const N: usize = 1_000;
    let t0 = Instant::now();
    let journal = Arc::new(CommitsFirst::default());
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    declare(&v, "s", stream_args(&[]), t0);
    // A reader that lags: prefetch 1, one ack at a time.
    let (ch, out) = reader(&v, "s", first(), 1, t0);
    for i in 0..N {
        publish(&v, "s", &format!("m{i}"), t0);
    }
    let mut acked = None;
    let mut ack_next = |n: usize| {
        for _ in 0..n {
            let tag = out.0.lock().last().expect("a delivery").0;
            if acked == Some(tag) {
                return; // nothing more came
            }
            ch.ack(tag, false, t0).unwrap();
            acked = Some(tag);
        }
    };
    ack_next(10);
    // The store catches up; the next append lets the tail go, and the
    // reader reads the rest back from the journal.
    journal.apply();
    publish(&v, "s", "last", t0);
    journal.apply();
    ack_next(N - 10);
    let offsets: Vec<i64> = out.0.lock().iter().map(|(_, o, _)| *o).collect();
    let expected: Vec<i64> = (0..=i64::try_from(N).unwrap()).collect();
    let skipped: Vec<&i64> = expected.iter().filter(|o| !offsets.contains(o)).collect();
    assert!(
        skipped.is_empty(),
        "{} committed offsets never delivered, from {:?}",
        skipped.len(),
        skipped.first()
    );
    assert_eq!(offsets, expected);
}
