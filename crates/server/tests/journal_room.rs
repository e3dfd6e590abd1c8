//! A full store queue never blocks a tokio thread: publishing through the
//! server's journal while the group's writer is stalled (fault storage
//! whose fdatasync takes seconds) returns at once, and the runtime's other
//! tasks keep running; the publisher's task instead awaits room
//! (`Journal::poll_room`) and is woken once the writer catches up. Run on
//! a current-thread runtime, where any blocked call would stop every task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use berth_broker::durable::Journal;
use berth_server::store_journal::StoreJournal;
use berth_store::fault::FaultStorage;
use berth_store::{Store, StoreConfig};
use bytes::Bytes;

/// Requests a group's queue holds before it is full.
const REQUESTS_MAX: usize = 4;

fn stalled_journal(fs: &FaultStorage) -> Arc<StoreJournal> {
    let mut config = StoreConfig::new("/data");
    config.log_groups = 1;
    config.channel_requests_max = REQUESTS_MAX;
    let (store, _) = Store::open_with(config, Arc::new(fs.clone())).expect("open store");
    // From now on each fdatasync takes 3 s: the writer is stuck in the
    // one of this first publish while the test's publishes fill its queue.
    fs.set_sync_latency(Duration::from_secs(3));
    let journal = Arc::new(StoreJournal {
        store,
        events: OnceLock::new(),
    });
    journal.publish(1_000, &[1], Bytes::from_static(b"first"), None);
    // Its batch is written (counted) just before its fdatasync starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while journal.store.stats()[0].batches == 0 {
        assert!(Instant::now() < deadline, "the writer never took a request");
        std::thread::sleep(Duration::from_millis(1));
    }
    journal
}

#[test]
fn a_full_store_queue_does_not_block_the_runtime() {
    let fs = FaultStorage::new(21);
    let journal = stalled_journal(&fs);
    let (report, got) = mpsc::channel();
    let runtime_thread = {
        let journal = Arc::clone(&journal);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let ticks = Arc::new(AtomicU64::new(0));
                let ticker = {
                    let ticks = Arc::clone(&ticks);
                    tokio::spawn(async move {
                        loop {
                            ticks.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    })
                };
                tokio::task::yield_now().await;
                let publisher = {
                    let journal = Arc::clone(&journal);
                    tokio::spawn(async move {
                        for msg in 1..=(5 * REQUESTS_MAX as u64) {
                            journal.publish(msg, &[1], Bytes::from_static(b"m"), None);
                        }
                        // Back-pressure: wait, as a task, for the writer.
                        std::future::poll_fn(|cx| journal.poll_room(cx)).await;
                    })
                };
                let before = ticks.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                let progress = ticks.load(Ordering::SeqCst) - before;
                let room = journal.has_room();
                report.send((progress, room)).expect("the test waits");
                publisher.await.expect("publisher");
                ticker.abort();
            });
        })
    };
    let progress = got.recv_timeout(Duration::from_secs(1));
    // Unstall the writer so that every thread can finish.
    fs.set_sync_latency(Duration::ZERO);
    let (progress, room_while_stalled) = progress.expect(
        "the runtime made no progress for a second: a task blocked its only \
         thread on the full store queue",
    );
    // The publisher's wait for room ends once the writer catches up.
    runtime_thread.join().expect("runtime thread");
    assert!(
        !room_while_stalled,
        "the queue held {} requests for a bound of {REQUESTS_MAX}, yet had room",
        5 * REQUESTS_MAX
    );
    assert!(
        progress >= 10,
        "the ticker ran {progress} times in 300 ms on the runtime with the publisher"
    );
}
