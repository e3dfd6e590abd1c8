//! Restart time after an abrupt stop, on real files.
//!
//! ```text
//! cargo run --release -p berth-store --example restart -- fill DIR QUEUES PER_QUEUE BYTES
//! cargo run --release -p berth-store --example restart -- open DIR
//! ```
//!
//! `fill` publishes and then exits the process without closing the store
//! (as `kill -9` would: no shutdown checkpoint, page cache intact); `open`
//! times recovery.

use std::time::Instant;

use berth_store::{QueueId, Store, StoreConfig, Ticket};
use bytes::Bytes;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: restart fill DIR QUEUES PER_QUEUE BYTES | restart open DIR";
    let dir = args.get(2).expect(usage);
    let cfg = StoreConfig::new(dir);
    match args.get(1).map(String::as_str) {
        Some("fill") => {
            let queues: u64 = args[3].parse().expect(usage);
            let per_queue: u64 = args[4].parse().expect(usage);
            let bytes: usize = args[5].parse().expect(usage);
            let (store, _) = Store::open(cfg).expect("open");
            let payload = Bytes::from(vec![0x5A; bytes]);
            let started = Instant::now();
            for i in 0..per_queue {
                for q in 0..queues {
                    let m = store.next_msg_id();
                    store.publish(m, &[QueueId(q)], payload.clone(), None);
                }
                if i % 1000 == 999 {
                    let (done, ticket) = Ticket::new();
                    store.flush(done);
                    ticket.wait().expect("flush");
                }
            }
            let (done, ticket) = Ticket::new();
            store.flush(done);
            ticket.wait().expect("flush");
            let secs = started.elapsed().as_secs_f64();
            let n = queues * per_queue;
            let rate = n as f64 / secs;
            println!("filled {n} messages of {bytes} B in {secs:.2} s ({rate:.0} msg/s); exiting without close");
            std::process::exit(0);
        }
        Some("open") => {
            let started = Instant::now();
            let (store, rec) = Store::open(cfg).expect("open");
            let secs = started.elapsed().as_secs_f64();
            let msgs: usize = rec.queues.values().map(Vec::len).sum();
            println!(
                "recovered {msgs} messages in {} queues in {secs:.3} s (replayed {} records, scanned {} bytes, {} checkpoints used)",
                rec.queues.len(),
                rec.stats.records_replayed,
                rec.stats.bytes_scanned,
                rec.stats.checkpoints_used
            );
            let index: u64 = store.stats().iter().map(|s| s.index_bytes).sum();
            let per = index as f64 / msgs.max(1) as f64;
            println!("index RAM: {index} bytes = {per:.1} bytes per message");
            std::mem::forget(store); // measure recovery only
        }
        _ => panic!("{usage}"),
    }
}
