//! Files recovery must not silently do without (issue 16, item 2): the
//! journal's tail after the newest checkpoint's replay start, a whole
//! `group-NNNN` directory, and a manifest whose `group_count` berth never
//! writes. Each is refused with the file named and what to do; a new store
//! still creates its group directories.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::manifest::Manifest;
use berth_store::storage::Storage;
use berth_store::{MsgId, QueueId, Store, StoreConfig, StoreError};
use bytes::Bytes;
use common::{config, fresh, group_dir, open, wait};

fn reopen(
    fs: &FaultStorage,
    cfg: &StoreConfig,
) -> Result<(Store, berth_store::Recovered), StoreError> {
    Store::open_with(cfg.clone(), Arc::new(fs.clone()))
}

fn refusal(fs: &FaultStorage, cfg: &StoreConfig) -> String {
    match reopen(fs, cfg) {
        Ok((_, rec)) => panic!(
            "opened with {} queue(s) and damage {:?}",
            rec.queues.len(),
            rec.damage
        ),
        Err(e) => e.to_string(),
    }
}

fn publish(store: &Store, queue: u64) -> MsgId {
    let m = store.next_msg_id();
    let payload = Bytes::from(vec![7u8; 300]);
    wait(|d| store.publish(m, &[QueueId(queue)], payload, Some(d))).unwrap();
    m
}

#[test]
fn missing_journal_tail_after_the_replay_start_refuses_to_start() {
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    let (fs, store) = fresh(21, &cfg);
    let acked: Vec<MsgId> = (0..40).map(|_| publish(&store, 1)).collect();
    wait(|d| store.remove(QueueId(1), &acked, Some(d))).unwrap();
    // Replay now starts past the header of the active segment, with an
    // empty index: the checkpoint knows no message of the tail.
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    for _ in 0..5 {
        publish(&store, 1); // confirmed, synced, in the tail only
    }
    fs.crash();
    drop(store);
    fs.power_on();
    let dir = group_dir(0);
    for name in fs.names(&dir) {
        if name.ends_with(".seg") {
            fs.remove(&dir.join(name)).unwrap();
        }
    }
    fs.sync_dir(&dir).unwrap();
    let err = refusal(&fs, &cfg);
    assert!(err.contains(".seg"), "{err}");
    assert!(err.contains("tail"), "{err}");
    assert!(err.contains("restore"), "{err}");
    assert!(err.contains("accept_missing_segments"), "{err}");
}

#[test]
fn missing_group_directory_refuses_to_start() {
    let cfg = config(2);
    let (fs, store) = fresh(22, &cfg);
    for q in 0..8 {
        publish(&store, q);
    }
    store.close().unwrap();
    let gone = group_dir(1);
    for name in fs.names(&gone) {
        fs.remove(&gone.join(name)).unwrap();
    }
    fs.remove_dir(&gone).unwrap();
    let err = refusal(&fs, &cfg);
    assert!(err.contains("group-0001"), "{err}");
    assert!(err.contains("restore"), "{err}");
    assert!(!fs
        .names(&PathBuf::from("/data"))
        .contains(&"group-0001".to_owned()));
}

#[test]
fn a_new_store_creates_every_group_directory() {
    let fs = FaultStorage::new(23);
    let (store, _) = open(&fs, &config(3));
    drop(store);
    let names = fs.names(&PathBuf::from("/data"));
    for g in 0..3 {
        assert!(names.contains(&format!("group-{g:04}")), "{names:?}");
    }
    let (_store, rec) = reopen(&fs, &config(3)).unwrap();
    assert_eq!(rec.stats.groups, 3);
}

#[test]
fn manifest_with_zero_groups_is_refused_naming_the_file() {
    let fs = FaultStorage::new(24);
    let cfg = config(1);
    drop(open(&fs, &cfg));
    let path = PathBuf::from("/data/MANIFEST");
    let mut m = Manifest::decode(&fs.contents(&path).unwrap(), &path).unwrap();
    m.group_count = 0;
    fs.put_durable(&path, &m.encode()).unwrap();
    let err = refusal(&fs, &cfg);
    assert!(err.contains("/data/MANIFEST"), "{err}");
    assert!(err.contains("group_count 0"), "{err}");
}
