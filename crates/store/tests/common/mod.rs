//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::{Recovered, Store, StoreConfig, StoreError, Ticket};

pub fn config(groups: u32) -> StoreConfig {
    let mut c = StoreConfig::new("/data");
    c.log_groups = groups;
    c.segment_size_bytes = 64 * 1024;
    c.recovery_progress_interval_ms = 60_000;
    c
}

pub fn open(fs: &FaultStorage, cfg: &StoreConfig) -> (Store, Recovered) {
    Store::open_with(cfg.clone(), Arc::new(fs.clone())).expect("open")
}

/// A store opened on new in-memory storage seeded with `seed`: the
/// storage (to crash, damage and reopen) and the store.
pub fn fresh(seed: u64, cfg: &StoreConfig) -> (FaultStorage, Store) {
    let fs = FaultStorage::new(seed);
    let (store, _) = open(&fs, cfg);
    (fs, store)
}

pub fn wait(f: impl FnOnce(berth_store::Done)) -> Result<(), StoreError> {
    let (done, ticket) = Ticket::new();
    f(done);
    ticket.wait()
}

pub fn group_dir(g: u32) -> PathBuf {
    PathBuf::from(format!("/data/group-{g:04}"))
}

/// Seed from `BERTH_TEST_SEED` or the given default, printed so a failure
/// can be replayed.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("BERTH_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    eprintln!("seed = {s} (replay with BERTH_TEST_SEED={s})");
    s
}
