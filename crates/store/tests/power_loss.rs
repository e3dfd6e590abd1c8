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
//!
//! Checkpoint, segment and compaction thresholds are small, so background
//! housekeeping (checkpoints, segment deletion, compaction) runs during
//! every run; removals reach the disk ahead of unsynced data, as a
//! journaling file system may order them; and some runs lose power right
//! after a file removal, where deleting before syncing would show.

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

/// What the workers of one run share. While `quiet` is set they issue no
/// requests: traffic comes in bursts, and housekeeping runs alone in the
/// quiet between them, as in production.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    quiet: AtomicBool,
    completions: AtomicU64,
}

fn worker(store: &Store, log: &Mutex<Log>, ctl: &Control, seed: u64) {
    let (stop, completions) = (&ctl.stop, &ctl.completions);
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        if ctl.quiet.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
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

/// Where the power fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CrashAt {
    /// After a random number of completions.
    Completions,
    /// Right after a random file removal (segment or checkpoint deletion),
    /// or after many completions if that comes first.
    Removal,
}

/// What one run saw.
struct Outcome {
    violations: Vec<String>,
    bytes_compacted: u64,
    segments_deleted: u64,
}

/// One run; returns the promise violations found after the restart.
fn power_loss_run(seed: u64, sync: SyncMode, tear: bool) -> Vec<String> {
    power_loss_run_at(seed, sync, tear, CrashAt::Completions).violations
}

fn power_loss_run_at(seed: u64, sync: SyncMode, tear: bool, at: CrashAt) -> Outcome {
    let fs = FaultStorage::new(seed);
    fs.set_tear_on_crash(tear);
    fs.set_reorder_removals(true);
    fs.set_sync_latency(Duration::from_micros(50));
    let mut cfg = config(3);
    cfg.sync = sync;
    cfg.sync_interval_ms = 1_000;
    cfg.segment_size_bytes = 8 * 1024;
    cfg.checkpoint_journal_bytes = 8 * 1024;
    cfg.checkpoint_interval_ms = 5;
    cfg.compaction_live_percent_max = 90;
    cfg.compaction_pause_ms = 0;
    cfg.compaction_bytes_per_turn = 2 * 1024;
    let mut rng = StdRng::seed_from_u64(seed);
    let (store, _) = open(&fs, &cfg);
    let store = Arc::new(store);
    let log = Arc::new(Mutex::new(Log::default()));
    let ctl = Arc::new(Control::default());
    let crash_after = match at {
        CrashAt::Completions => rng.random_range(20..300),
        CrashAt::Removal => {
            fs.crash_after_removes(Some(rng.random_range(1..12)), ".seg");
            4_000
        }
    };
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (store, log, ctl) = (Arc::clone(&store), Arc::clone(&log), Arc::clone(&ctl));
            std::thread::spawn(move || worker(&store, &log, &ctl, seed.wrapping_add(t)))
        })
        .collect();
    let mut next_toggle = std::time::Instant::now();
    while ctl.completions.load(Ordering::Relaxed) < crash_after && !fs.is_down() {
        std::thread::sleep(Duration::from_micros(100));
        if at == CrashAt::Removal && std::time::Instant::now() >= next_toggle {
            ctl.quiet.fetch_xor(true, Ordering::Relaxed);
            next_toggle += Duration::from_micros(rng.random_range(500..5_000));
        }
    }
    ctl.quiet.store(false, Ordering::Relaxed);
    fs.crash_after_removes(None, "");
    if !fs.is_down() {
        fs.crash();
    }
    ctl.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let stats = store.stats();
    let bytes_compacted = stats.iter().map(|s| s.bytes_compacted).sum();
    let segments_deleted = stats.iter().map(|s| s.segments_deleted).sum();
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
    Outcome {
        violations,
        bytes_compacted,
        segments_deleted,
    }
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

/// Compaction copies live messages forward and the source segment is then
/// deleted: the copies must be durable before the deletion can be, or a
/// power loss right after it leaves the index pointing at a missing file.
#[test]
fn compacted_messages_survive_power_loss_right_after_a_segment_deletion() {
    let base = seed(0x5EED_3000);
    let (mut compacted, mut deleted) = (0, 0);
    for i in 0..64 {
        let s = base.wrapping_add(i);
        let o = power_loss_run_at(s, SyncMode::Always, false, CrashAt::Removal);
        assert!(o.violations.is_empty(), "seed {s}: {:#?}", o.violations);
        compacted += o.bytes_compacted;
        deleted += o.segments_deleted;
    }
    assert!(
        compacted > 0 && deleted > 0,
        "housekeeping never ran (compacted {compacted} bytes, deleted {deleted} segments): the model tests nothing"
    );
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
