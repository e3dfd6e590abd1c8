//! A data directory written before the journal had stream records (each
//! stream message a Publish record naming the stream alone, with a
//! message id, its payload the stream entry) is moved to Append records
//! at restore: pinned on the real store, and checked in the store itself
//! (its sparse index, what it reads back at each offset, and that the old
//! Publish records are gone), not through the broker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::durable::Done;
use berth_broker::message::Message;
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::AMQPProperties;
use berth_server::store_journal::{open_broker, StoreJournal};
use berth_server::Config;
use berth_store::{QueueId, Store, Ticket};
use bytes::Bytes;

mod common;
use common::{declare_stream, TempDir};

const MESSAGES: u64 = 300;
/// Offsets old retention had removed, and one write a crash lost.
const FIRST_KEPT: u64 = 40;
const LOST: u64 = 100;

fn config(dir: &TempDir) -> Config {
    let mut config = Config::default();
    config.store.data_dirs = vec![dir.to_path_buf()];
    config.store.log_groups = 2;
    config.store.segment_size_bytes = 64 * 1024;
    config
}

fn wait(f: impl FnOnce(berth_store::Done)) {
    let (done, ticket) = Ticket::new();
    f(done);
    ticket.wait().expect("durable");
}

/// Every record of stream `q` as the store reads it back, from offset 0.
fn records(store: &Store, q: u64) -> Vec<(u64, Bytes)> {
    let mut out: Vec<(u64, Bytes)> = Vec::new();
    loop {
        let from = out.last().map_or(0, |r| r.0 + 1);
        let batch = store
            .read_stream(QueueId(q), from, usize::MAX, usize::MAX)
            .expect("read");
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

fn close(broker: Arc<Broker>, journal: Arc<StoreJournal>) {
    drop(broker);
    let journal = Arc::try_unwrap(journal).ok().expect("the broker is gone");
    journal.store.close().expect("close");
}

/// Stream entries as berth writes them (offset, timestamp, message with
/// its offset header), from a broker on a scratch store.
fn entries() -> Vec<(u64, Bytes)> {
    let dir = TempDir::new("stream-migration-entries");
    let (broker, journal) = open_broker(&config(&dir)).expect("open broker");
    let q = declare_stream(&broker, "s");
    let v = broker.vhost("/").expect("default vhost");
    for i in 0..MESSAGES {
        let m = Message::new(
            String::new(),
            "s".into(),
            encode_properties(&AMQPProperties::default()),
            Bytes::from(format!("m{i:04} {}", "b".repeat(200))),
        )
        .expect("a message");
        let mut done = || -> Done { Box::new(|r| r.expect("journaled")) };
        v.publish("", &m, Instant::now(), &mut done)
            .expect("publish");
    }
    wait(|d| journal.store.flush(d));
    let out = records(&journal.store, q);
    assert_eq!(out.len() as u64, MESSAGES);
    drop(v);
    close(broker, journal);
    out
}

#[test]
fn a_stream_stored_one_publish_each_is_moved_to_appends_at_its_offsets() {
    let entries = entries();
    let legacy: Vec<(u64, Bytes)> = entries
        .into_iter()
        .filter(|(o, _)| *o >= FIRST_KEPT && *o != LOST)
        .collect();
    let dir = TempDir::new("stream-migration");
    let config = config(&dir);
    let q = {
        let (broker, journal) = open_broker(&config).expect("open broker");
        let q = declare_stream(&broker, "s");
        close(broker, journal);
        q
    };
    // The old layout, written with the store's own API: one Publish per
    // message, naming the stream alone.
    {
        let (store, _) = Store::open(config.store_config()).expect("open store");
        for (_, entry) in &legacy {
            let msg = store.next_msg_id();
            wait(|d| store.publish(msg, &[QueueId(q)], entry.clone(), Some(d)));
        }
        store.close().expect("close");
    }
    let (_, rec) = Store::open(config.store_config()).expect("open store");
    assert_eq!(rec.queues[&QueueId(q)].len(), legacy.len());
    assert!(!rec.streams.contains_key(&QueueId(q)));
    drop(rec);

    // The restore moves them.
    let (broker, journal) = open_broker(&config).expect("open broker");
    // The old records go once the appends are durable (from the last
    // append's completion, on the writer thread).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        wait(|d| journal.store.flush(d));
        let held: u64 = journal.store.stats().iter().map(|g| g.live_messages).sum();
        if held == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{held} old records still held");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        journal.store.stream_bounds(QueueId(q)),
        Some((FIRST_KEPT, MESSAGES))
    );
    assert!(
        records(&journal.store, q) == legacy,
        "every entry at its offset, byte for byte"
    );
    close(broker, journal);

    // What the store holds now, read with the store alone: Append records
    // at the same offsets, and no message of the stream.
    let (store, rec) = Store::open(config.store_config()).expect("open store");
    assert!(
        !rec.queues.contains_key(&QueueId(q)),
        "old Publish records left"
    );
    let rs = &rec.streams[&QueueId(q)];
    assert_eq!(
        (rs.first, rs.end, rs.messages),
        (FIRST_KEPT, MESSAGES, legacy.len() as u64)
    );
    let got = records(&store, q);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        legacy.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    assert!(got == legacy, "every entry at its offset, byte for byte");
    store.close().expect("close");

    // And the broker on it moves nothing again: the stream as it was.
    let (broker, journal) = open_broker(&config).expect("open broker");
    let stats = broker
        .vhost("/")
        .expect("default vhost")
        .queue(1, "s")
        .expect("the stream")
        .stream_stats()
        .expect("a stream");
    assert_eq!(
        (stats.first_offset, stats.next_offset, stats.messages),
        (FIRST_KEPT, MESSAGES, legacy.len() as u64)
    );
    assert!(records(&journal.store, q) == legacy);
    close(broker, journal);
}
