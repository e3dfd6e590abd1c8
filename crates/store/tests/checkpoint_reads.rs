//! A checkpoint does not read back the journal its writer wrote since the
//! previous one: the writer kept what the index needs of those records
//! (`writer/facts.rs`), so their payloads are never read, copied or
//! checksummed again for a checkpoint.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::hooked::{FileHooks, Hooked};
use berth_store::{QueueId, Store};
use bytes::Bytes;
use common::{config, wait};

/// Counts the bytes read from segment files.
#[derive(Default)]
struct SegmentReads(AtomicU64);

impl FileHooks for SegmentReads {
    fn before_read(&self, path: &Path, len: usize) {
        if path.extension().is_some_and(|e| e == "seg") {
            self.0.fetch_add(len as u64, Ordering::Relaxed);
        }
    }
}

#[test]
fn checkpoints_do_not_read_back_the_journal_the_writer_wrote() {
    let read = Arc::new(SegmentReads::default());
    let storage = Hooked {
        inner: FaultStorage::new(7),
        hooks: Arc::clone(&read),
    };
    let mut cfg = config(1);
    // No compaction: it reads the records it moves.
    cfg.compaction_live_percent_max = 0;
    let (store, _) = Store::open_with(cfg, Arc::new(storage)).expect("open");
    let mut live = Vec::new();
    // Deltas of publishes and removes, and bases when they add up to one.
    for round in 0..30u64 {
        for _ in 0..40 {
            let m = store.next_msg_id();
            let q = QueueId(round % 3);
            wait(|d| store.publish(m, &[q], Bytes::from(vec![5u8; 2048]), Some(d))).unwrap();
            live.push((q, m));
        }
        for (q, m) in live.drain(..30) {
            wait(|d| store.remove(q, &[m], Some(d))).unwrap();
        }
        store.checkpoint().unwrap();
    }
    let stats = &store.stats()[0];
    assert!(stats.checkpoints >= 30, "{stats:?}");
    assert!(stats.segments_deleted > 0, "{stats:?}");
    assert_eq!(
        read.0.load(Ordering::Relaxed),
        0,
        "checkpoints read segment bytes back"
    );
}
