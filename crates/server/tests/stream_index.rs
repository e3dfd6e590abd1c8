//! A stream costs the store no index entry per message (issue 18): its
//! records are found through a sparse index (a point every stride per
//! segment), so a stream far larger than memory can be held and read from
//! any offset. Pinned with the real store under the broker, before and
//! after a restart (which rebuilds the sparse index from the checkpoint and
//! the journal).

use std::sync::Arc;
use std::time::Instant;

use berth_broker::durable::Done;
use berth_broker::message::Message;
use berth_protocol::codec::encode_properties;
use berth_protocol::AMQPProperties;
use berth_server::store_journal::open_broker;
use berth_server::Config;
use berth_store::Ticket;
use bytes::Bytes;

mod common;
use common::{declare_stream, TempDir};

const MESSAGES: u64 = 20_000;

fn flush(journal: &berth_server::store_journal::StoreJournal) {
    let (done, ticket) = Ticket::new();
    journal.store.flush(done);
    ticket.wait().expect("flush");
}

/// (per-message index entries, index heap bytes) of the store's one group.
fn index_cost(journal: &berth_server::store_journal::StoreJournal) -> (u64, u64) {
    let st = &journal.store.stats()[0];
    (st.live_messages, st.index_bytes)
}

#[test]
fn a_stream_of_many_messages_keeps_no_index_entry_per_message() {
    let dir = TempDir::new("stream-index");
    let mut config = Config::default();
    config.store.data_dirs = vec![dir.to_path_buf()];
    config.store.log_groups = 1;
    config.store.segment_size_bytes = 1024 * 1024;
    let now = Instant::now();
    {
        let (broker, journal) = open_broker(&config).expect("open broker");
        declare_stream(&broker, "s");
        let v = broker.vhost("/").expect("default vhost");
        for i in 0..MESSAGES {
            let m = Message::new(
                String::new(),
                "s".into(),
                encode_properties(&AMQPProperties::default()),
                Bytes::from(format!("m{i:08}")),
            )
            .expect("a message");
            let mut done = || -> Done { Box::new(|r| r.expect("journaled")) };
            v.publish("", &m, now, &mut done).expect("publish");
        }
        flush(&journal);
        let (entries, bytes) = index_cost(&journal);
        assert!(
            entries == 0 && bytes < MESSAGES,
            "the store's index holds {entries} entries and {bytes} bytes for a stream of {MESSAGES} messages"
        );
        drop(v);
        drop(broker);
        let journal = Arc::try_unwrap(journal).ok().expect("the broker is gone");
        journal.store.close().expect("close");
    }
    // Restart: the sparse index comes back as small, and the stream whole.
    let (broker, journal) = open_broker(&config).expect("reopen broker");
    let (entries, bytes) = index_cost(&journal);
    assert!(
        entries == 0 && bytes < MESSAGES,
        "after a restart the store's index holds {entries} entries and {bytes} bytes for a stream of {MESSAGES} messages"
    );
    let q = broker
        .vhost("/")
        .expect("default vhost")
        .queue(1, "s")
        .expect("the stream");
    let stats = q.stream_stats().expect("a stream");
    assert_eq!(
        (stats.first_offset, stats.next_offset, stats.messages),
        (0, MESSAGES, MESSAGES)
    );
}
