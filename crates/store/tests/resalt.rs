//! Version-1 stores (record salt 0) get a salt when copied into a new
//! store (issue 16, item 7): restore and reshape generate a new salt and
//! re-seal every record under it; until then, inspection says the store is
//! unsalted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_store::inspect::{inspect_group, Layout};
use berth_store::manifest::{self, Manifest, MANIFEST_NAME};
use berth_store::storage::OsStorage;
use berth_store::{backup, reshape, MsgId, QueueId, Store, StoreConfig, Ticket};
use berth_testdir::TestDir;
use bytes::Bytes;

/// A directory not made yet, removed when the test ends (see berth-testdir).
fn temp(name: &str) -> TestDir {
    TestDir::unmade(&format!("resalt-{name}"))
}

/// Creates, in `dir`, a 2-group store with a version-1 manifest (salt 0),
/// as berth wrote before the salt, and fills it through the store.
fn unsalted_store(dir: &Path) -> BTreeMap<(QueueId, MsgId), Bytes> {
    manifest::create_group_dirs(&OsStorage, &[dir.to_path_buf()], 2).unwrap();
    let mut b = Manifest {
        group_count: 2,
        dir_count: 1,
        dir_index: 0,
        store_id: 42,
        record_salt: 0,
    }
    .encode();
    b[8] = 1; // format_version 1: the salt bytes are reserved (0)
    let crc = crc32c::crc32c(&b[..40]);
    b[40..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.join(MANIFEST_NAME), b).unwrap();

    let mut cfg = StoreConfig::new(dir.to_path_buf());
    cfg.log_groups = 2;
    cfg.segment_size_bytes = 4096;
    let (store, _) = Store::open(cfg).unwrap();
    let mut sent = BTreeMap::new();
    for i in 0..60u64 {
        let m = store.next_msg_id();
        let q = QueueId(i % 4);
        let payload = Bytes::from(format!("payload {i} ").repeat(9));
        let (done, ticket) = Ticket::new();
        store.publish(m, &[q], payload.clone(), Some(done));
        ticket.wait().unwrap();
        sent.insert((q, m), payload);
    }
    store.close().unwrap();
    let layout = Layout::open(&OsStorage, &[dir.to_path_buf()]).unwrap();
    assert_eq!(layout.manifest.record_salt, 0);
    assert!(layout.unsalted_note().is_some());
    sent
}

/// Checks the store in `dirs` has a salt, verifies clean, and holds
/// exactly `sent`.
fn assert_salted_with(dirs: &[PathBuf], sent: &BTreeMap<(QueueId, MsgId), Bytes>) {
    let layout = Layout::open(&OsStorage, dirs).unwrap();
    assert_ne!(layout.manifest.record_salt, 0, "the copy is still unsalted");
    assert_eq!(layout.unsalted_note(), None);
    for g in 0..layout.manifest.group_count {
        let rep = inspect_group(&OsStorage, &layout, g, &|_| {}).unwrap();
        assert!(rep.problems.is_empty(), "group {g}: {:?}", rep.problems);
    }
    let mut cfg = StoreConfig::new(dirs[0].clone());
    cfg.data_dirs = dirs.to_vec();
    let (store, rec) = Store::open(cfg).unwrap();
    let mut found = BTreeMap::new();
    for (q, msgs) in &rec.queues {
        for m in msgs {
            found.insert((*q, m.msg), store.read(*q, m.msg).unwrap());
        }
    }
    assert_eq!(&found, sent);
    store.close().unwrap();
}

#[test]
fn restore_of_an_unsalted_store_gives_it_a_salt_and_reseals_every_record() {
    let base = temp("restore");
    let (old, out, new) = (base.join("old"), base.join("backup"), base.join("new"));
    let sent = unsalted_store(&old);
    let layout = Layout::open(&OsStorage, std::slice::from_ref(&old)).unwrap();
    backup::backup(&OsStorage, &layout, &out, "test", 0, &|_| {}).unwrap();
    backup::restore(&OsStorage, &out, std::slice::from_ref(&new), &|_| {}).unwrap();
    assert_salted_with(std::slice::from_ref(&new), &sent);
}

#[test]
fn reshape_of_an_unsalted_store_gives_it_a_salt() {
    let base = temp("reshape");
    let (a, b) = (base.join("a"), base.join("b"));
    let sent = unsalted_store(&a);
    let dirs = vec![a.clone(), b.clone()];
    let plan = reshape::plan(&OsStorage, &dirs, Some(3))
        .unwrap()
        .expect("a reshape is needed");
    let mut cfg = StoreConfig::new(a.clone());
    cfg.data_dirs.clone_from(&dirs);
    reshape::run(&plan, &cfg, Arc::new(OsStorage), 1).unwrap();
    assert_salted_with(&dirs, &sent);
}
