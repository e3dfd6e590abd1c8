//! What the server's integration tests share.
#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::time::Instant;

use berth_broker::vhost::QueueDeclare;
use berth_broker::Broker;
use berth_protocol::{AMQPValue, FieldTable};

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("berth-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("could not remove {}: {e}", self.0.display());
        }
    }
}

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
