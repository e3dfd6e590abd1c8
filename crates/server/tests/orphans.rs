//! Records of a queue id with no definition (what a publish racing the
//! queue's deletion, or a crash between a definition's delete and its
//! purge, leaves in the store) are reclaimed when the server opens the
//! store: purged at startup, after which checkpoints delete the segments
//! they kept alive.

use std::sync::Arc;

use berth_server::store_journal::open_broker;
use berth_server::Config;
use berth_store::{MsgId, QueueId, Store, Ticket};
use bytes::Bytes;

mod common;
use common::TempDir;

fn wait(f: impl FnOnce(berth_store::Done)) {
    let (done, ticket) = Ticket::new();
    f(done);
    ticket.wait().expect("store write");
}

#[test]
fn records_of_a_queue_without_definition_are_purged_at_startup_and_their_segments_reclaimed() {
    let dir = TempDir::new("orphans");
    let mut config = Config::default();
    config.store.data_dirs = vec![dir.to_path_buf()];
    config.store.log_groups = 1;
    config.store.segment_size_bytes = 64 * 1024;

    // Queue id 77 was never declared (or its definition is gone): only
    // its messages are in the store, over several segments.
    let orphans = 40;
    {
        let (store, _) = Store::open(config.store_config()).expect("open store");
        for i in 0..orphans {
            let payload = Bytes::from(vec![7u8; 8 * 1024]);
            wait(|d| store.publish(MsgId(i + 1), &[QueueId(77)], payload, Some(d)));
        }
        store.close().expect("close");
    }

    let (broker, journal) = open_broker(&config).expect("open broker");
    wait(|d| journal.store.flush(d));
    let st = &journal.store.stats()[0];
    assert_eq!(
        st.live_messages, 0,
        "the {orphans} messages of queue 77 belong to no queue and must be purged at startup"
    );
    let segments_before = st.segments;
    assert!(segments_before >= 4, "{st:?}");
    journal.store.compact().expect("compact");
    journal.store.checkpoint().expect("checkpoint");
    journal.store.checkpoint().expect("checkpoint");
    let st = &journal.store.stats()[0];
    assert!(
        st.segments_deleted >= segments_before - 1 && st.live_bytes == 0,
        "the purged records' segments are deleted: {st:?}"
    );
    drop(broker);
    drop(Arc::try_unwrap(journal).ok());
}
