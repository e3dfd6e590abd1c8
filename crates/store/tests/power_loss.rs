//! Power-loss tests through the fault-injecting storage: concurrent
//! publishers and ackers, a simulated power loss at a random moment, restart,
//! and the store's promises checked:
//! - every publish whose completion reported success is recovered (unless a
//!   removal of it was issued), with its exact payload;
//! - no message whose removal completed successfully comes back.
//!
//! The same checker run with `SyncMode::Never` (completion without
//! fdatasync) must find violations: that is what shows the test would fail
//! if the fdatasync before completion were removed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_store::fault::FaultStorage;
use berth_store::{MsgId, QueueId, Store, SyncMode};
use bytes::Bytes;
use common::{config, open, seed, wait};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Default)]
struct Log {
    published_ok: BTreeSet<(QueueId, MsgId)>,
    remove_issued: BTreeSet<(QueueId, MsgId)>,
    remove_ok: BTreeSet<(QueueId, MsgId)>,
}

fn payload_for(m: MsgId) -> Bytes {
    let n = 50 + (m.0 % 7) as usize * 300;
    Bytes::from(m.0.to_le_bytes().repeat(n / 8))
}

const QUEUES: u64 = 6;

fn worker(store: &Store, log: &Mutex<Log>, stop: &AtomicBool, completions: &AtomicU64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let ack_candidate = {
            let l = log.lock();
            if rng.random_bool(0.4) && !l.published_ok.is_empty() {
                let pick = rng.random_range(0..l.published_ok.len());
                l.published_ok
                    .iter()
                    .nth(pick)
                    .copied()
                    .filter(|k| !l.remove_issued.contains(k))
            } else {
                None
            }
        };
        let result = if let Some((q, m)) = ack_candidate {
            log.lock().remove_issued.insert((q, m));
            let r = wait(|d| store.remove(q, &[m], Some(d)));
            if r.is_ok() {
                log.lock().remove_ok.insert((q, m));
            }
            r
        } else {
            let m = store.next_msg_id();
            let mut qs = vec![QueueId(rng.random_range(0..QUEUES))];
            if rng.random_bool(0.3) {
                qs.push(QueueId(rng.random_range(0..QUEUES)));
                qs.dedup();
            }
            let r = wait(|d| store.publish(m, &qs, payload_for(m), Some(d)));
            if r.is_ok() {
                let mut l = log.lock();
                for q in qs {
                    l.published_ok.insert((q, m));
                }
            }
            r
        };
        if result.is_err() {
            return; // the power is gone
        }
        completions.fetch_add(1, Ordering::Relaxed);
    }
}

/// One run; returns the promise violations found after the restart.
fn power_loss_run(seed: u64, sync: SyncMode, tear: bool) -> Vec<String> {
    let fs = FaultStorage::new(seed);
    fs.set_tear_on_crash(tear);
    fs.set_sync_latency(Duration::from_micros(50));
    let mut cfg = config(3);
    cfg.sync = sync;
    cfg.sync_interval_ms = 1_000;
    cfg.segment_size_bytes = 16 * 1024;
    cfg.checkpoint_journal_bytes = 48 * 1024;
    let mut rng = StdRng::seed_from_u64(seed);
    let (store, _) = open(&fs, &cfg);
    let store = Arc::new(store);
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let completions = Arc::new(AtomicU64::new(0));
    let crash_after = rng.random_range(20..300);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (store, log, stop, completions) = (
                Arc::clone(&store),
                Arc::clone(&log),
                Arc::clone(&stop),
                Arc::clone(&completions),
            );
            std::thread::spawn(move || {
                worker(&store, &log, &stop, &completions, seed.wrapping_add(t))
            })
        })
        .collect();
    while completions.load(Ordering::Relaxed) < crash_after {
        std::thread::sleep(Duration::from_micros(100));
    }
    fs.crash();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    drop(store); // its shutdown fails: no power
    fs.power_on();

    let (store, rec) = open(&fs, &cfg);
    let log = log.lock();
    let present: BTreeSet<(QueueId, MsgId)> = rec
        .queues
        .iter()
        .flat_map(|(q, ms)| ms.iter().map(move |m| (*q, m.msg)))
        .collect();
    let mut violations = Vec::new();
    for k in &log.published_ok {
        if !log.remove_issued.contains(k) && !present.contains(k) {
            violations.push(format!("confirmed publish {:?} lost", k));
        }
    }
    for k in &log.remove_ok {
        if present.contains(k) {
            violations.push(format!("confirmed removal {:?} undone", k));
        }
    }
    for (q, m) in &present {
        match store.read(*q, *m) {
            Ok(p) if p == payload_for(*m) => {}
            other => violations.push(format!("{q:?} {m:?} reads back as {other:?}")),
        }
    }
    // Recovery is idempotent: a second crash right away changes nothing.
    drop(store);
    fs.crash();
    fs.power_on();
    let (_store, rec2) = open(&fs, &cfg);
    let by_queue = |r: &berth_store::Recovered| -> BTreeMap<QueueId, Vec<MsgId>> {
        r.queues
            .iter()
            .map(|(q, ms)| (*q, ms.iter().map(|m| m.msg).collect()))
            .collect()
    };
    if by_queue(&rec) != by_queue(&rec2) {
        violations.push("second recovery differs from the first".into());
    }
    if !rec.damage.is_empty() && !tear {
        violations.push(format!(
            "damage reported after a clean power loss: {:?}",
            rec.damage
        ));
    }
    violations
}

#[test]
fn confirmed_writes_survive_power_loss() {
    let base = seed(0x5EED_0001);
    for i in 0..12 {
        let s = base.wrapping_add(i);
        let v = power_loss_run(s, SyncMode::Always, false);
        assert!(v.is_empty(), "seed {s}: {v:#?}");
    }
}

#[test]
fn confirmed_writes_survive_power_loss_with_torn_writes() {
    let base = seed(0x5EED_1000);
    for i in 0..12 {
        let s = base.wrapping_add(i);
        let v = power_loss_run(s, SyncMode::Always, true);
        assert!(v.is_empty(), "seed {s}: {v:#?}");
    }
}

/// The checker's teeth: completing before fdatasync (what `never` does, and
/// what removing the sync from the write path would do) loses confirmed
/// writes, and the same checker notices.
#[test]
fn checker_catches_completion_without_fdatasync() {
    let base = seed(0x5EED_2000);
    let caught =
        (0..6).any(|i| !power_loss_run(base.wrapping_add(i), SyncMode::Never, false).is_empty());
    assert!(
        caught,
        "power loss without fdatasync went unnoticed: the power-loss test has no teeth"
    );
}
