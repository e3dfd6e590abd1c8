//! A reshape only reads the old store (issue 16, Documents): whatever its
//! recovery has to repair — a torn tail to truncate, a damaged range to
//! quarantine, an unfinished checkpoint to delete — is repaired in what
//! the copy is made from, never in the old store's files, which stay
//! byte for byte as they were (the operator's way back).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_store::checkpoint::CHECKPOINT_TMP_NAME;
use berth_store::reshape::{self, STAGING_DIR};
use berth_store::storage::OsStorage;
use berth_store::{MsgId, QueueId, Store, StoreConfig, Ticket};
use berth_testdir::TestDir;
use bytes::Bytes;

/// A directory not made yet, removed when the test ends (see berth-testdir).
fn temp(name: &str) -> TestDir {
    TestDir::unmade(&format!("reshape-ro-{name}"))
}

fn config(dir: &Path, groups: u32) -> StoreConfig {
    let mut c = StoreConfig::new(dir.to_path_buf());
    c.log_groups = groups;
    c.segment_size_bytes = 8192;
    c
}

/// Every file under `dir` but the staging copy, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == STAGING_DIR) {
                continue;
            }
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn segments(group_dir: &Path) -> Vec<PathBuf> {
    let mut s: Vec<PathBuf> = std::fs::read_dir(group_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    s.sort();
    s
}

#[test]
fn reshape_leaves_the_old_store_byte_for_byte_unchanged_whatever_its_recovery_repairs() {
    let (_dir, dir) = temp("old").and_path();
    let (store, _) = Store::open(config(&dir, 2)).unwrap();
    for q in 1..=6u64 {
        for i in 0..40u64 {
            let (done, t) = Ticket::new();
            let m = store.next_msg_id();
            store.publish(
                m,
                &[QueueId(q)],
                Bytes::from(format!("{q}-{i}-{}", "x".repeat(120))),
                Some(done),
            );
            t.wait().unwrap();
        }
    }
    store.close().unwrap();

    // Group 0: its checkpoints gone (so recovery replays its whole
    // journal), a payload byte flipped in the middle of its first segment
    // (a damaged range with valid records after it: quarantined) and an
    // unfinished checkpoint (deleted). Group 1: a torn write at the end of
    // its newest segment (truncated).
    let g0 = dir.join("group-0000");
    for e in std::fs::read_dir(&g0).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if berth_store::checkpoint::parse_checkpoint_name(&name).is_some() {
            std::fs::remove_file(&p).unwrap();
        }
    }
    let first = &segments(&g0)[0];
    let mut bytes = std::fs::read(first).unwrap();
    let at = bytes.len() / 3;
    let x = at + bytes[at..].iter().position(|b| *b == b'x').unwrap();
    bytes[x] ^= 1;
    std::fs::write(first, &bytes).unwrap();
    std::fs::write(
        g0.join(CHECKPOINT_TMP_NAME),
        b"a checkpoint a crash cut short",
    )
    .unwrap();
    let g1 = dir.join("group-0001");
    let newest = segments(&g1).pop().unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&newest)
        .unwrap();
    std::io::Write::write_all(&mut f, &[0x5a; 37]).unwrap();
    drop(f);

    let before = files(&dir);
    let plan = reshape::plan(&OsStorage, std::slice::from_ref(&dir), Some(3))
        .unwrap()
        .expect("2 groups on disk, 3 wanted");
    let report =
        reshape::copy_and_verify(&plan, &config(&dir, 3), Arc::new(OsStorage)).expect("copy");
    let after = files(&dir);
    for (p, b) in &before {
        match after.get(p) {
            None => panic!("reshape removed {} from the old store", p.display()),
            Some(a) if a != b => panic!(
                "reshape changed {} of the old store: {} bytes before, {} after",
                p.display(),
                b.len(),
                a.len()
            ),
            Some(_) => {}
        }
    }
    let added: Vec<&PathBuf> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    assert!(
        added.is_empty(),
        "reshape wrote into the old store: {added:?}"
    );

    // The copy holds what recovery keeps: every message but the damaged one.
    assert_eq!(report.messages, 6 * 40 - 1, "{report:?}");
    assert_eq!(report.damaged_ranges, 1, "{report:?}");
    let staging = dir.join(STAGING_DIR);
    let (copy, rec) = Store::open(config(&staging, 3)).unwrap();
    let n: usize = rec.queues.values().map(Vec::len).sum();
    assert_eq!(n, 6 * 40 - 1);
    assert!(rec.damage.is_empty(), "the copy is clean: {:?}", rec.damage);
    assert!(rec.queues.values().flatten().all(|m| m.msg > MsgId(0)));
    copy.close().unwrap();
}
