//! Backward compatibility: a store image written by berth 0.1.0 (store
//! format 1, manifest version 2) and committed under `tests/data/golden-v1`
//! opens with every message and definition, and verifies clean. A later
//! format must keep this test passing (or migrate the image explicitly).
//!
//! The image: `berth serve --log-groups 2 --segment-size-bytes 4096`, a
//! durable direct exchange `golden-x`, durable queues `golden-a` and
//! `golden-b` bound by their names, 40 persistent messages
//! `"golden message <i> " × 8` alternating between them, the first 10 of
//! `golden-a` acked, clean shutdown.

use std::path::{Path, PathBuf};

use berth_store::inspect::{inspect_group, Layout};
use berth_store::storage::OsStorage;
use berth_store::{Store, StoreConfig};
use berth_testdir::TestDir;

fn copy_image(to: &Path) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &to.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    let image = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-v1");
    copy(&image, to);
}

#[test]
fn golden_store_image_of_format_1_opens_with_every_message_and_verifies() {
    let (_dir, dir) = TestDir::unmade("golden").and_path();
    copy_image(&dir);

    let layout = Layout::open(&OsStorage, std::slice::from_ref(&dir)).unwrap();
    assert_eq!(layout.manifest.group_count, 2);
    assert_eq!(layout.manifest_version, 2);
    for g in 0..2 {
        let rep = inspect_group(&OsStorage, &layout, g, &|_| {}).unwrap();
        assert!(rep.problems.is_empty(), "group {g}: {:?}", rep.problems);
    }

    // A different log_groups setting: the image's manifest wins.
    let mut cfg = StoreConfig::new(dir.clone());
    cfg.log_groups = 7;
    let (store, rec) = Store::open(cfg).expect("the golden image opens");
    assert_eq!(store.group_count(), 2);
    let mut sizes: Vec<usize> = rec.queues.values().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [10, 20]);
    let keys: Vec<String> = rec
        .metadata
        .keys()
        .map(|k| String::from_utf8_lossy(k).replace('\0', "|"))
        .collect();
    for want in ["x|/|golden-x", "q|/|golden-a", "q|/|golden-b"] {
        assert!(keys.iter().any(|k| k == want), "{want} in {keys:?}");
    }
    assert_eq!(
        keys.iter()
            .filter(|k| k.starts_with("b|/|golden-x"))
            .count(),
        2
    );
    let mut numbers = Vec::new();
    for (q, msgs) in &rec.queues {
        for m in msgs {
            let payload = store.read(*q, m.msg).expect("payload reads back");
            let text = String::from_utf8_lossy(&payload);
            let n: usize = text
                .split("golden message ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("payload {text:?}"));
            assert!(text.contains(&format!("golden message {n} ").repeat(8)));
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    // golden-a held the even numbers, its first 10 (0, 2, .., 18) acked.
    let expected: Vec<usize> = (0..40).filter(|i| i % 2 == 1 || *i >= 20).collect();
    assert_eq!(numbers, expected);
    store.close().unwrap();

    // Opened by this build, the store says its payloads may now carry
    // times (manifest version 3), so a berth before them refuses it.
    let layout = Layout::open(&OsStorage, std::slice::from_ref(&dir)).unwrap();
    assert_eq!(layout.manifest_version, 3);
    assert_eq!(layout.manifest.group_count, 2);
    let (store, rec) = Store::open(StoreConfig::new(dir.clone())).expect("opens again");
    assert_eq!(rec.queues.values().map(Vec::len).sum::<usize>(), 30);
    store.close().unwrap();
}

/// The golden image (written by berth 0.1.0) reshapes to another group
/// count and another number of data directories with every message.
#[test]
fn golden_store_image_of_format_1_reshapes_with_every_message() {
    use berth_store::reshape;
    use std::sync::Arc;

    let base = TestDir::unmade("golden-reshape");
    let (a, b) = (base.join("a"), base.join("b"));
    copy_image(&a);
    let read_all = |dirs: &[PathBuf]| {
        let mut cfg = StoreConfig::new(dirs[0].clone());
        cfg.data_dirs = dirs.to_vec();
        let (store, rec) = Store::open(cfg).expect("opens");
        let mut out = Vec::new();
        for (q, msgs) in &rec.queues {
            for m in msgs {
                out.push((*q, m.msg, store.read(*q, m.msg).expect("reads")));
            }
        }
        store.close().unwrap();
        (out, rec.metadata)
    };
    let before = read_all(std::slice::from_ref(&a));
    let dirs = vec![a.clone(), b.clone()];
    let plan = reshape::plan(&OsStorage, &dirs, Some(5))
        .unwrap()
        .expect("a reshape is needed");
    assert_eq!((plan.old_groups, plan.new_groups), (2, 5));
    let mut cfg = StoreConfig::new(a.clone());
    cfg.data_dirs.clone_from(&dirs);
    reshape::run(&plan, &cfg, Arc::new(OsStorage), 1).unwrap();
    let layout = Layout::open(&OsStorage, &dirs).unwrap();
    assert_eq!(layout.manifest.group_count, 5);
    assert_eq!(read_all(&dirs), before);
}
