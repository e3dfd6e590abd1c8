//! Online compaction shares its group's writer with publishers: it runs in
//! bounded steps between commits, so a publish sent while a large
//! compaction is under way is written and confirmed long before the
//! compaction ends.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_store::fault::FaultStorage;
use berth_store::hooked::{FileHooks, Hooked};
use berth_store::{MsgId, QueueId, Store, Ticket};
use bytes::Bytes;
use common::{config, wait};

/// Every read takes `READ_DELAY` once set: compaction reads each record
/// it moves, so a compaction of ~1,400 records lasts for a second — far
/// longer than this test's threads can be kept waiting for a core on a
/// loaded machine. (The publish path does not read.)
struct SlowReads(AtomicBool);

const READ_DELAY: Duration = Duration::from_micros(700);

impl FileHooks for SlowReads {
    fn before_read(&self, _: &Path, _: usize) {
        if self.0.load(Ordering::Relaxed) {
            std::thread::sleep(READ_DELAY);
        }
    }
}

/// Publishes `count` messages of `len` bytes to `queue`, then removes all
/// but every `keep_every`-th: every sealed segment is left mostly dead.
fn mostly_dead_segments(
    store: &berth_store::Store,
    queue: QueueId,
    count: usize,
    len: usize,
    keep_every: usize,
) -> Vec<MsgId> {
    let mut ids = Vec::with_capacity(count);
    let mut tickets = Vec::with_capacity(count);
    for i in 0..count {
        let m = store.next_msg_id();
        ids.push(m);
        let (done, ticket) = Ticket::new();
        let payload = Bytes::from(vec![u8::try_from(i % 251).unwrap(); len]);
        store.publish(m, &[queue], payload, Some(done));
        tickets.push(ticket);
    }
    for t in tickets {
        t.wait().expect("publish");
    }
    let dead: Vec<MsgId> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % keep_every != 0)
        .map(|(_, m)| *m)
        .collect();
    wait(|d| store.remove(queue, &dead, Some(d))).expect("remove");
    ids.into_iter().step_by(keep_every).collect()
}

#[test]
fn a_publish_is_confirmed_while_a_large_compaction_is_still_running() {
    let fs = FaultStorage::new(16);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 64 * 1024;
    // Only the explicit compaction below runs, in steps of 16 KiB.
    cfg.compaction_pause_ms = 3_600_000;
    cfg.compaction_bytes_per_turn = 16 * 1024;
    let slow = Arc::new(SlowReads(AtomicBool::new(false)));
    let storage = Hooked {
        inner: fs,
        hooks: Arc::clone(&slow),
    };
    let (store, _) = Store::open_with(cfg, Arc::new(storage)).expect("open");
    let store = Arc::new(store);
    let queue = QueueId(1);
    // ~4 MB written, a third of it live: about 80 steps of copying.
    let kept = mostly_dead_segments(&store, queue, 4000, 1000, 3);
    let before = store.stats()[0].bytes_compacted;
    assert_eq!(before, 0, "nothing compacted before it was asked for");

    slow.0.store(true, Ordering::Relaxed);
    let compaction = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.compact())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.stats()[0].bytes_compacted == 0 {
        assert!(Instant::now() < deadline, "compaction never started");
        std::thread::sleep(Duration::from_micros(200));
    }

    let m = store.next_msg_id();
    // How far the compaction was when the publish completed, read by its
    // completion on the writer thread (this thread may be scheduled late).
    let (tx, rx) = std::sync::mpsc::channel();
    let at_completion = Arc::clone(&store);
    store.publish(
        m,
        &[queue],
        Bytes::from_static(b"during"),
        Some(Box::new(move |r| {
            let copied = at_completion.stats()[0].bytes_compacted;
            tx.send((r, copied)).expect("the test waits");
        })),
    );
    let (result, compacted_when_confirmed) = rx.recv().expect("completion");
    result.expect("publish during compaction");
    compaction
        .join()
        .expect("compaction thread")
        .expect("compaction");
    let total = store.stats()[0].bytes_compacted;
    // The steps are 16 KiB: confirmed within a few steps, not at the end.
    assert!(
        compacted_when_confirmed < total / 2,
        "the publish was confirmed only after {compacted_when_confirmed} of the \
         compaction's {total} bytes were copied: compaction held up its group"
    );
    assert_eq!(store.read(queue, m).unwrap(), Bytes::from_static(b"during"));
    for id in &kept {
        store
            .read(queue, *id)
            .expect("a live message survives compaction");
    }
}
