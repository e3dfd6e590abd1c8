//! What the server's integration tests share.
#![allow(dead_code)] // each test binary uses part of it

use std::time::Instant;

use berth_broker::vhost::QueueDeclare;
use berth_broker::Broker;
use berth_protocol::{AMQPValue, FieldTable};

/// A test's own directory, removed when the test ends, passed or failed
/// (kept for a failed test with `BERTH_KEEP_TEST_DIRS=1`).
pub use berth_testdir::TestDir as TempDir;

/// Declares the durable stream `name` in the default vhost and returns its
/// queue id in the store.
pub fn declare_stream(broker: &Broker, name: &str) -> u64 {
    let v = broker.vhost("/").expect("default vhost");
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    let d = QueueDeclare {
        durable: true,
        arguments: args,
        ..Default::default()
    };
    v.declare_queue(1, name, &d, Instant::now())
        .expect("declare a stream");
    v.queue(1, name)
        .expect("the stream")
        .store_id
        .expect("durable")
}
