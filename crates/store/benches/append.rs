//! Confirmed append throughput with group commit (`SyncMode::Always`, real
//! files, fdatasync per batch): 2 KB and 16 KB payloads vs number of log
//! groups and concurrent appenders. Each appender waits for its completion
//! before the next append (a publisher with one confirm outstanding), so
//! any batching comes from group commit alone.
//!
//! Run: `cargo bench -p berth-store --bench append`
//! (`BERTH_BENCH_DIR` picks the data directory; default: the system temp dir;
//! `BERTH_BENCH_COMMIT_DELAY_US` overrides `commit_delay_us_max`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_store::{MsgId, QueueId, Store, StoreConfig, Ticket};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn bench_dir(tag: &str) -> std::path::PathBuf {
    let base = std::env::var_os("BERTH_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    base.join(format!("berth-store-bench-{}-{tag}", std::process::id()))
}

/// `appenders` threads each append `per_appender` messages, one at a time.
fn run(store: &Arc<Store>, appenders: u64, per_appender: u64, payload: &Bytes) -> Duration {
    let started = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|t| {
            let store = Arc::clone(store);
            let payload = payload.clone();
            std::thread::spawn(move || {
                for _ in 0..per_appender {
                    let m: MsgId = store.next_msg_id();
                    let (done, ticket) = Ticket::new();
                    // One queue per appender: appenders spread over groups.
                    store.publish(m, &[QueueId(t)], payload.clone(), Some(done));
                    ticket.wait().expect("append");
                    // Acks need not be awaited, as with basic.ack.
                    store.remove(QueueId(t), &[m], None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender");
    }
    started.elapsed()
}

fn append(c: &mut Criterion) {
    for size in [2 * 1024usize, 16 * 1024] {
        let mut g = c.benchmark_group(format!("append_confirmed_{}k", size / 1024));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(3));
        let payload = Bytes::from(vec![0xAB; size]);
        for groups in [1u32, 2, 4] {
            for appenders in [1u64, 4, 16] {
                let dir = bench_dir(&format!("{size}-{groups}-{appenders}"));
                let mut cfg = StoreConfig::new(&dir);
                cfg.log_groups = groups;
                if let Some(us) = std::env::var("BERTH_BENCH_COMMIT_DELAY_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    cfg.commit_delay_us_max = us;
                }
                let (store, _) = Store::open(cfg).expect("open");
                let store = Arc::new(store);
                g.throughput(Throughput::Elements(appenders));
                g.bench_with_input(
                    BenchmarkId::new(format!("groups={groups}"), format!("appenders={appenders}")),
                    &appenders,
                    |b, &appenders| {
                        // One criterion "iteration" = one message from each appender.
                        b.iter_custom(|iters| run(&store, appenders, iters, &payload));
                    },
                );
                drop(store);
                std::fs::remove_dir_all(&dir).expect("clean up bench dir");
            }
        }
        g.finish();
    }
}

criterion_group!(benches, append);
criterion_main!(benches);
