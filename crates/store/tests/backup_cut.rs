//! A backup of a running store is one instant for every group (issue 16,
//! item 6): a message dead-lettered from a queue of one group to a queue
//! of another while the backup runs is in the backup (in its source queue,
//! its target queue, or both), never in neither.
//!
//! A dead-letter move is what the broker does: publish the copy in the
//! target queue's group, wait until it is durable, then Remove the
//! original in the source queue's group.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_store::storage::{OsStorage, Storage, StorageFile};
use berth_store::{backup, MsgId, QueueId, Recovered, Store, StoreConfig, SyncMode, Ticket};
use berth_testdir::TestDir;
use bytes::Bytes;

/// A directory not made yet, removed when the test ends (see berth-testdir).
fn temp(name: &str) -> TestDir {
    TestDir::unmade(&format!("backup-cut-{name}"))
}

type Hook = Box<dyn FnOnce() + Send>;

/// The real file system, with a hook run the first time a backup lists
/// one directory (the moment the backup has cut every group before it and
/// none after it), and a delay each time it lists it (a slow disk).
struct HookStorage {
    watch: PathBuf,
    hook: Mutex<Option<Hook>>,
    delay: Duration,
}

impl Storage for HookStorage {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        OsStorage.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        if dir == self.watch {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
            std::thread::sleep(self.delay);
        }
        OsStorage.list(dir)
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn StorageFile>> {
        OsStorage.create(path)
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn StorageFile>> {
        OsStorage.open(path)
    }
    fn open_read(&self, path: &Path) -> std::io::Result<Arc<dyn StorageFile>> {
        OsStorage.open_read(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        OsStorage.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        OsStorage.remove(path)
    }
    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        OsStorage.remove_dir(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        OsStorage.sync_dir(dir)
    }
}

fn config(dir: &Path, sync: SyncMode) -> StoreConfig {
    let mut cfg = StoreConfig::new(dir.to_path_buf());
    cfg.log_groups = 2;
    cfg.segment_size_bytes = 64 * 1024;
    cfg.sync = sync;
    cfg
}

/// A queue id whose group is `g`.
fn queue_in(store: &Store, g: u32, skip: u64) -> QueueId {
    (skip..)
        .map(QueueId)
        .find(|q| store.group_of(*q) == g)
        .expect("some queue maps to every group")
}

fn publish(store: &Store, msg: MsgId, q: QueueId) {
    let (done, ticket) = Ticket::new();
    store.publish(
        msg,
        &[q],
        Bytes::from(format!("message {}", msg.0)),
        Some(done),
    );
    ticket.wait().expect("publish");
}

fn remove(store: &Store, msg: MsgId, q: QueueId) {
    let (done, ticket) = Ticket::new();
    store.remove(q, &[msg], Some(done));
    ticket.wait().expect("remove");
}

/// Dead-letters `msg` from `from` to `to` as the broker does: the copy is
/// durable in `to` before the original leaves `from`. Returns the copy's id.
fn dead_letter(store: &Store, msg: MsgId, from: QueueId, to: QueueId) -> MsgId {
    let copy = store.next_msg_id();
    publish(store, copy, to);
    remove(store, msg, from);
    copy
}

/// What a backup holds: restored into a new directory and opened.
fn open_backup(out: &Path) -> Recovered {
    let (_restored, restored) = TestDir::unmade("backup-cut-restored").and_path();
    backup::restore(&OsStorage, out, std::slice::from_ref(&restored), &|_| {}).expect("restore");
    let (store, rec) = Store::open(config(&restored, SyncMode::Always)).expect("open restored");
    store.close().expect("close restored");
    rec
}

fn holds(rec: &Recovered, q: QueueId, msg: MsgId) -> bool {
    rec.queues
        .get(&q)
        .is_some_and(|msgs| msgs.iter().any(|m| m.msg == msg))
}

#[test]
fn a_dead_letter_between_the_cuts_of_two_groups_is_in_the_backup() {
    let dir = temp("between");
    let out = temp("between-out");
    let storage = Arc::new(HookStorage {
        watch: dir.join("group-0001"),
        hook: Mutex::new(None),
        delay: Duration::ZERO,
    });
    let (store, _) =
        Store::open_with(config(&dir, SyncMode::Always), Arc::clone(&storage) as _).unwrap();
    let store = Arc::new(store);
    // The backup cuts group 0 before group 1: the target queue is in the
    // group cut first, the source queue in the one cut second.
    let source = queue_in(&store, 1, 1);
    let target = queue_in(&store, 0, 1);
    let originals: Vec<MsgId> = (0..5)
        .map(|_| {
            let m = store.next_msg_id();
            publish(&store, m, source);
            m
        })
        .collect();

    // Between the two cuts, every message is dead-lettered from the
    // source to the target by another thread (the broker's), for as long
    // as it takes or 500 ms.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (moved_tx, moved_rx) = mpsc::channel::<Vec<MsgId>>();
    let mover = {
        let (store, originals) = (Arc::clone(&store), originals.clone());
        std::thread::spawn(move || {
            go_rx.recv().expect("the backup reached group 1");
            let copies: Vec<MsgId> = originals
                .iter()
                .map(|m| dead_letter(&store, *m, source, target))
                .collect();
            // The hook stops waiting after 500 ms: then nobody listens.
            let _hook_may_have_given_up = moved_tx.send(copies.clone());
            copies
        })
    };
    let moved_during_cut = Arc::new(AtomicBool::new(false));
    {
        let moved_during_cut = Arc::clone(&moved_during_cut);
        *storage.hook.lock().unwrap() = Some(Box::new(move || {
            go_tx.send(()).expect("the mover waits");
            let moved = moved_rx.recv_timeout(Duration::from_millis(500)).is_ok();
            moved_during_cut.store(moved, Ordering::SeqCst);
        }));
    }
    let report = store.backup(&out, "test", 0, &|_| {}).expect("backup");
    let copies = mover.join().expect("mover");
    eprintln!(
        "moved while the backup was cutting: {}; {report:?}",
        moved_during_cut.load(Ordering::SeqCst)
    );

    let rec = open_backup(&out);
    for (m, copy) in originals.iter().zip(&copies) {
        assert!(
            holds(&rec, source, *m) || holds(&rec, target, *copy),
            "message {m}, confirmed before the backup started and dead-lettered from queue \
             {source} (group 1) to queue {target} (group 0) during it, is in neither queue of \
             the backup"
        );
    }
    // The store itself went on: every message is now in the target.
    drop(rec);
    Arc::try_unwrap(store)
        .ok()
        .expect("one owner")
        .close()
        .unwrap();
}

#[test]
fn backups_taken_while_dead_letters_cross_groups_hold_every_message() {
    const MESSAGES: usize = 40;
    const BACKUPS: usize = 12;
    let dir = temp("loop");
    // Listing group 1 takes 20 ms: a slow disk widens the time between
    // the two groups' cuts (the broker keeps writing meanwhile).
    let storage = Arc::new(HookStorage {
        watch: dir.join("group-0001"),
        hook: Mutex::new(None),
        delay: Duration::from_millis(20),
    });
    let (store, _) = Store::open_with(config(&dir, SyncMode::Interval), storage).unwrap();
    let store = Arc::new(store);
    let queues = [queue_in(&store, 0, 1), queue_in(&store, 1, 1)];
    // Where each message is: (its current id, the index of its queue).
    let at: Arc<Vec<(AtomicU64, AtomicU64)>> = Arc::new(
        (0..MESSAGES)
            .map(|i| {
                let m = store.next_msg_id();
                publish(&store, m, queues[i % 2]);
                (AtomicU64::new(m.0), AtomicU64::new((i % 2) as u64))
            })
            .collect(),
    );
    // Dead-lettering runs in a loop, back and forth between the groups,
    // for the whole test; every id a message ever had is remembered.
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(vec![Vec::<(MsgId, QueueId)>::new(); MESSAGES]));
    for (i, h) in history.lock().unwrap().iter_mut().enumerate() {
        h.push((MsgId(at[i].0.load(Ordering::SeqCst)), queues[i % 2]));
    }
    let mover = {
        let (store, at, stop, history) = (
            Arc::clone(&store),
            Arc::clone(&at),
            Arc::clone(&stop),
            Arc::clone(&history),
        );
        std::thread::spawn(move || {
            let mut moves = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for (i, (id, q)) in at.iter().enumerate() {
                    let from = q.load(Ordering::SeqCst) as usize;
                    let to = 1 - from;
                    let msg = MsgId(id.load(Ordering::SeqCst));
                    let copy = store.next_msg_id();
                    publish(&store, copy, queues[to]);
                    history.lock().unwrap()[i].push((copy, queues[to]));
                    remove(&store, msg, queues[from]);
                    id.store(copy.0, Ordering::SeqCst);
                    q.store(to as u64, Ordering::SeqCst);
                    moves += 1;
                }
            }
            moves
        })
    };
    let mut outs = Vec::new();
    for b in 0..BACKUPS {
        let out = temp(&format!("loop-out-{b}"));
        store.backup(&out, "test", 0, &|_| {}).expect("backup");
        outs.push(out);
    }
    stop.store(true, Ordering::SeqCst);
    let moves = mover.join().expect("mover");
    eprintln!("{moves} dead letters during {BACKUPS} backups");
    assert!(moves > 0, "dead-lettering ran during the backups");
    let history = history.lock().unwrap();
    for (b, out) in outs.iter().enumerate() {
        let rec = open_backup(out);
        for (i, ids) in history.iter().enumerate() {
            assert!(
                ids.iter().any(|(m, q)| holds(&rec, *q, *m)),
                "backup {b}: message {i} (last ids {:?}), published before every backup and \
                 dead-lettered between the groups ever since, is in neither queue",
                &ids[ids.len().saturating_sub(3)..]
            );
        }
    }
    Arc::try_unwrap(store)
        .ok()
        .expect("one owner")
        .close()
        .unwrap();
}
