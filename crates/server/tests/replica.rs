//! A cluster member's replica: committed commands applied to its store,
//! snapshots of the whole state, and restoring one into any store.
//!
//! Pinned here: a restart (store reopened, emptied or restored to the last
//! snapshot, then every later entry applied again, as Raft does) ends in
//! the state before it, and restoring a snapshot makes any store — empty,
//! or holding other queues, messages and definitions — equal to the state
//! it was taken from.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_cluster::Apply;
use berth_server::cluster::command::Command;
use berth_server::cluster::replica::Replica;
use berth_server::cluster::view::Announcements;
use berth_server::store_journal::StoreJournal;
use berth_store::{MsgId, QueueId, Store, StoreConfig, Ticket};
use bytes::Bytes;

mod common;
use common::TempDir;

fn replica(dir: &TempDir, groups: u32) -> Replica {
    let mut c = StoreConfig::new(dir.to_path_buf());
    c.log_groups = groups;
    let (store, _) = Store::open(c).expect("open store");
    let journal = Arc::new(StoreJournal {
        store,
        events: std::sync::OnceLock::new(),
    });
    Replica::new(journal, Arc::new(Announcements::default()), None)
}

type State = (
    BTreeMap<Bytes, Bytes>,
    BTreeMap<QueueId, Vec<(MsgId, Bytes)>>,
    BTreeMap<QueueId, Vec<(u64, Bytes)>>,
);

/// Every definition and every queue's messages with their bodies.
fn state(r: &Replica) -> State {
    let j = r.store().expect("open");
    let (done, ticket) = Ticket::new();
    j.store.flush(done);
    ticket.wait().expect("flush");
    let live = j.store.live_state();
    let queues = live
        .queues
        .iter()
        .map(|(q, msgs)| {
            let bodies = j.store.read_many(*q, msgs);
            let with: Vec<(MsgId, Bytes)> = msgs
                .iter()
                .zip(bodies)
                .map(|(m, b)| (*m, b.expect("readable")))
                .collect();
            (*q, with)
        })
        .collect();
    let streams = live
        .streams
        .keys()
        .map(|q| {
            let read = j
                .store
                .read_stream(*q, 0, 1_000, 1 << 20)
                .expect("readable");
            (*q, read)
        })
        .collect();
    // The member's own note of what its store holds is not replicated state.
    let mut metadata = live.metadata;
    metadata.remove(berth_server::cluster::replica::HELD_THROUGH_KEY);
    (metadata, queues, streams)
}

fn apply(r: &Replica, index: u64, c: &Command) {
    r.apply(index, bytes::Bytes::from(c.encode()));
}

fn history() -> Vec<Command> {
    let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    vec![
        Command::PutMeta {
            key: b("k1"),
            value: b("v1"),
        },
        Command::PutMeta {
            key: b("k2"),
            value: b("v2"),
        },
        Command::Publish {
            msg: 1,
            queues: vec![10, 11],
            payload: b("one"),
        },
        Command::Publish {
            msg: 2,
            queues: vec![10],
            payload: b("two"),
        },
        Command::Publish {
            msg: 3,
            queues: vec![12],
            payload: b("three"),
        },
        Command::Remove {
            queue: 10,
            msgs: vec![1],
        },
        Command::DeleteMeta { key: b("k2") },
        Command::Purge { queue: 12 },
        Command::Publish {
            msg: 4,
            queues: vec![12],
            payload: b("four"),
        },
        Command::PutMeta {
            key: b("k1"),
            value: b("v1bis"),
        },
        Command::Announce {
            name: "n1".into(),
            amqp: "127.0.0.1:1".into(),
            http: String::new(),
        },
        // A stream: appends, a trim of its head, more appends.
        Command::Append {
            queue: 20,
            offset: 0,
            payload: b("s0"),
        },
        Command::Append {
            queue: 20,
            offset: 1,
            payload: b("s1"),
        },
        Command::Append {
            queue: 20,
            offset: 2,
            payload: b("s2"),
        },
        Command::Trim {
            queue: 20,
            below: 1,
        },
        Command::Append {
            queue: 20,
            offset: 3,
            payload: b("s3"),
        },
    ]
}

#[test]
fn a_restart_that_applies_the_log_again_ends_in_the_same_state() {
    let dir = TempDir::new("replica-again");
    let once = {
        let r = replica(&dir, 3);
        for (i, c) in history().iter().enumerate() {
            apply(&r, i as u64 + 1, c);
        }
        state(&r)
    };
    assert_eq!(
        once.1[&QueueId(10)].len(),
        1,
        "message 1 left queue 10: {once:?}"
    );
    assert_eq!(
        once.1[&QueueId(12)].len(),
        1,
        "message 4 came after the purge: {once:?}"
    );
    let offsets: Vec<u64> = once.2[&QueueId(20)].iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        vec![1, 2, 3],
        "the stream after its trim: {once:?}"
    );
    // A restart with no snapshot: the store as it was left, emptied, then
    // the whole log applied again. (Applied on a store still holding its
    // effects, skipping what was there, a queued purge hid message 4.)
    {
        let r = replica(&dir, 3);
        r.start_empty();
        for (i, c) in history().iter().enumerate() {
            apply(&r, i as u64 + 1, c);
        }
        assert_eq!(state(&r), once);
    }
    // With a snapshot taken halfway: restored, then the rest applied.
    let half = 6;
    let d = TempDir::new("replica-half");
    let snapshot = {
        let h = replica(&d, 2);
        for (i, c) in history().iter().take(half).enumerate() {
            apply(&h, i as u64 + 1, c);
        }
        h.snapshot_to_vec(0).expect("snapshot")
    };
    let r = replica(&dir, 3);
    r.restore(&snapshot, 0);
    for (i, c) in history().iter().enumerate().skip(half) {
        apply(&r, i as u64 + 1, c);
    }
    assert_eq!(state(&r), once);
    assert_eq!(r.failure(), None);
}

#[test]
fn a_restored_snapshot_makes_any_store_equal_to_the_state_it_was_taken_from() {
    let a = TempDir::new("replica-source");
    let source = replica(&a, 2);
    for (i, c) in history().iter().enumerate() {
        apply(&source, i as u64 + 1, c);
    }
    let snapshot = source.snapshot_to_vec(0).expect("snapshot");
    let wanted = state(&source);

    // An empty store, and one holding other definitions, queues, messages
    // (and a message the snapshot has, in a queue where it must not be).
    let b = TempDir::new("replica-empty");
    let empty = replica(&b, 1);
    let c = TempDir::new("replica-other");
    let other = replica(&c, 4);
    let junk = [
        Command::PutMeta {
            key: Bytes::from_static(b"stale"),
            value: Bytes::from_static(b"x"),
        },
        Command::PutMeta {
            key: Bytes::from_static(b"k1"),
            value: Bytes::from_static(b"old"),
        },
        Command::Publish {
            msg: 9,
            queues: vec![99],
            payload: Bytes::from_static(b"gone"),
        },
        Command::Publish {
            msg: 2,
            queues: vec![11],
            payload: Bytes::from_static(b"two"),
        },
        Command::Append {
            queue: 21,
            offset: 0,
            payload: Bytes::from_static(b"junk"),
        },
        Command::Append {
            queue: 20,
            offset: 0,
            payload: Bytes::from_static(b"old"),
        },
    ];
    for (i, j) in junk.iter().enumerate() {
        apply(&other, i as u64 + 1, j);
    }
    for r in [&empty, &other] {
        r.restore(&snapshot, 0);
        assert_eq!(state(r), wanted);
        assert_eq!(r.failure(), None);
    }
}

#[test]
fn an_undecodable_command_marks_the_replica_failed_instead_of_being_skipped() {
    let dir = TempDir::new("replica-bad");
    let r = replica(&dir, 1);
    r.apply(7, bytes::Bytes::from_static(&[0xEE, 1, 2]));
    let why = r.failure().expect("failed");
    assert!(why.contains("entry 7"), "{why}");
}

/// A snapshot's data is written off the apply path while later commands
/// are applied: what they remove may be gone by the time it is read (it
/// is left out: the removal follows the snapshot in the log), and what
/// they add must not be in it (it would then be applied twice). Restored
/// and followed by those commands, any store ends equal to the source.
#[test]
fn a_snapshot_written_while_later_commands_apply_restores_to_the_same_state() {
    let a = TempDir::new("replica-capture-source");
    let source = replica(&a, 2);
    let past = history();
    for (i, c) in past.iter().enumerate() {
        apply(&source, i as u64 + 1, c);
    }
    let write = source.capture(0);
    let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    let later = [
        Command::Remove {
            queue: 10,
            msgs: vec![2],
        },
        Command::Purge { queue: 11 },
        Command::Publish {
            msg: 5,
            queues: vec![10],
            payload: b("five"),
        },
        Command::Append {
            queue: 20,
            offset: 4,
            payload: b("s4"),
        },
        Command::Trim {
            queue: 20,
            below: 2,
        },
        Command::PutMeta {
            key: b("k3"),
            value: b("v3"),
        },
    ];
    let base = past.len() as u64;
    for (i, c) in later.iter().enumerate() {
        apply(&source, base + i as u64 + 1, c);
    }
    // Everything applied is in the index before the bodies are read.
    let _ = state(&source);
    let mut snapshot = Vec::new();
    write(&mut snapshot).expect("the snapshot is written");
    let wanted = state(&source);

    let c = TempDir::new("replica-capture-copy");
    let copy = replica(&c, 3);
    copy.restore(&snapshot, 0);
    for (i, cmd) in later.iter().enumerate() {
        apply(&copy, base + i as u64 + 1, cmd);
    }
    assert_eq!(state(&copy), wanted);
    assert_eq!(copy.failure(), None);
}

/// A member that becomes leader reopens its store for its broker. A
/// snapshot's writer held the store for its whole build (13–15 s for a
/// 2 GB backlog), so a leader elected during one could not reopen it
/// ("still in use"), restarted, and the failover took 7 s instead of a
/// fraction of one (`bench-cluster-vs-rabbitmq.sh --backlog-mb 2048`).
/// The writer now reaches the store through the replica, batch by batch.
#[test]
fn a_store_reopened_during_a_snapshot_build_serves_the_rest_of_it() {
    let a = TempDir::new("replica-reopen-source");
    let source = replica(&a, 2);
    for (i, c) in history().iter().enumerate() {
        apply(&source, i as u64 + 1, c);
    }
    let wanted = state(&source);
    let write = source.capture(0);
    let reopened = source.reopen(|old| {
        old.store.close().map_err(|_| "close")?;
        let mut c = StoreConfig::new(a.to_path_buf());
        c.log_groups = 2;
        let (store, _) = Store::open(c).map_err(|_| "open")?;
        Ok::<_, &str>(Arc::new(StoreJournal {
            store,
            events: std::sync::OnceLock::new(),
        }))
    });
    if let Err(e) = reopened {
        panic!("a store could not be reopened during a snapshot build: {e}");
    }
    let mut snapshot = Vec::new();
    write(&mut snapshot).expect("the snapshot is written from the reopened store");

    let c = TempDir::new("replica-reopen-copy");
    let copy = replica(&c, 3);
    copy.restore(&snapshot, 0);
    assert_eq!(state(&copy), wanted);
    assert_eq!(copy.failure(), None);
}

/// Counts the bytes read from the store's files.
#[derive(Default)]
struct ReadBytes(std::sync::atomic::AtomicU64);

impl berth_store::hooked::FileHooks for ReadBytes {
    fn before_read(&self, _path: &std::path::Path, len: usize) {
        self.0
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The bytes read so far when the snapshot's first byte is written.
struct FirstWrite {
    reads: Arc<ReadBytes>,
    read_before: Option<u64>,
    written: usize,
}

impl std::io::Write for FirstWrite {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.read_before
            .get_or_insert(self.reads.0.load(std::sync::atomic::Ordering::Relaxed));
        self.written += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A snapshot's writer reads the bodies a few MB at a time. It used to
/// read 256 of them before it knew their size: 256 MiB for a queue of
/// 1 MiB messages (seen as a member's RSS rising by ~260 MiB during each
/// build of a 1 GiB backlog), up to 32 GiB with 128 MiB bodies.
#[test]
fn a_snapshot_of_large_messages_reads_them_a_few_mb_at_a_time() {
    const BODY: usize = 1024 * 1024;
    const COUNT: u64 = 40;
    let dir = TempDir::new("replica-read-bound");
    let reads = Arc::new(ReadBytes::default());
    let storage = berth_store::hooked::Hooked {
        inner: berth_store::storage::OsStorage,
        hooks: Arc::clone(&reads),
    };
    let (store, _) =
        Store::open_with(StoreConfig::new(dir.to_path_buf()), Arc::new(storage)).expect("open");
    let source = Replica::new(
        Arc::new(StoreJournal {
            store,
            events: std::sync::OnceLock::new(),
        }),
        Arc::new(Announcements::default()),
        None,
    );
    for i in 1..=COUNT {
        let body = Bytes::from(vec![u8::try_from(i).unwrap(); BODY]);
        let publish = Command::Publish {
            msg: i,
            queues: vec![7],
            payload: body,
        };
        apply(&source, i, &publish);
    }
    let write = source.capture(0);
    reads.0.store(0, std::sync::atomic::Ordering::Relaxed);
    let mut out = FirstWrite {
        reads: Arc::clone(&reads),
        read_before: None,
        written: 0,
    };
    write(&mut out).expect("written");
    assert!(
        out.written > (COUNT as usize) * BODY,
        "every body is in the snapshot ({} bytes)",
        out.written
    );
    let first = out.read_before.expect("something was written");
    let bound = (berth_server::limits::SNAPSHOT_READ_BYTES_MAX + BODY) as u64;
    assert!(
        first <= bound,
        "{first} bytes of bodies were read before the snapshot's first byte \
         (bound {bound}): the writer holds more than the bound at once"
    );
}

/// A message routed to two queues of one log group is one store record
/// naming both. A snapshot lists each queue's messages, so it names such
/// a message once per queue; restoring those one queue at a time made the
/// second publish replace the first (a publish sets a message's queues),
/// and the message was lost from every queue but the last: confirmed
/// messages gone after a restart or a snapshot install.
#[test]
fn a_message_held_by_two_queues_is_restored_in_both() {
    let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    for groups in [1, 2] {
        let a = TempDir::new("replica-shared-source");
        let source = replica(&a, groups);
        let past = [
            Command::Publish {
                msg: 1,
                queues: vec![10, 11, 12],
                payload: b("shared"),
            },
            Command::Publish {
                msg: 2,
                queues: vec![10],
                payload: b("alone"),
            },
            Command::Publish {
                msg: 3,
                queues: vec![11, 12],
                payload: b("pair"),
            },
            Command::Remove {
                queue: 12,
                msgs: vec![3],
            },
        ];
        for (i, c) in past.iter().enumerate() {
            apply(&source, i as u64 + 1, c);
        }
        let wanted = state(&source);
        assert_eq!(wanted.1.len(), 3, "three queues: {wanted:?}");
        let snapshot = source.snapshot_to_vec(0).expect("snapshot");

        // An empty store, and one that holds message 1 in one queue only
        // and message 3 in all three.
        let c = TempDir::new("replica-shared-empty");
        let empty = replica(&c, groups);
        let d = TempDir::new("replica-shared-partial");
        let partial = replica(&d, groups);
        apply(
            &partial,
            1,
            &Command::Publish {
                msg: 1,
                queues: vec![11],
                payload: b("shared"),
            },
        );
        apply(
            &partial,
            2,
            &Command::Publish {
                msg: 3,
                queues: vec![10, 11, 12],
                payload: b("pair"),
            },
        );
        for r in [&empty, &partial] {
            r.restore(&snapshot, 0);
            assert_eq!(state(r), wanted, "{groups} groups");
            assert_eq!(r.failure(), None);
        }
    }
}

fn reopen(dir: &TempDir, groups: u32) -> (Replica, Option<u64>) {
    let mut c = StoreConfig::new(dir.to_path_buf());
    c.log_groups = groups;
    let (store, recovered) = Store::open(c).expect("open store");
    let held = berth_server::cluster::replica::held_through(&recovered);
    let journal = Arc::new(StoreJournal {
        store,
        events: std::sync::OnceLock::new(),
    });
    (
        Replica::new(journal, Arc::new(Announcements::default()), held),
        held,
    )
}

/// Applies `history()` to a store in `dir`, with a snapshot taken after
/// its first `half` entries; returns the snapshot and the final state.
fn snapshot_halfway(dir: &TempDir, groups: u32, half: u64) -> (Vec<u8>, State) {
    let r = replica(dir, groups);
    let all = history();
    for (i, c) in all.iter().enumerate().take(half as usize) {
        apply(&r, i as u64 + 1, c);
    }
    let snapshot = r.snapshot_to_vec(half).expect("snapshot");
    for (i, c) in all.iter().enumerate().skip(half as usize) {
        apply(&r, i as u64 + 1, c);
    }
    (snapshot, state(&r))
}

/// A restart used to make the store equal to the last snapshot (reading
/// it twice, removing everything applied after it) and then write the
/// log since the snapshot again: O(backlog) of reads and O(log) of writes
/// before a member could serve. A store that holds the snapshot is now
/// kept, and the log after it replayed: what the store holds is skipped,
/// except after a purge of its queue in the replay (message 4 comes after
/// a purge of queue 12: skipped, the queued purge would take it away).
#[test]
fn a_restart_keeps_a_store_that_holds_the_snapshot_and_replays_the_log() {
    let dir = TempDir::new("replica-keep");
    let half = 6u64;
    let all = history();
    let (snapshot, once) = snapshot_halfway(&dir, 3, half);
    let log_last = all.len() as u64;
    let (r, held) = reopen(&dir, 3);
    assert_eq!(
        held,
        Some(half),
        "the capture recorded what the store holds"
    );
    r.resume(berth_cluster::Resume {
        snapshot: Some((&snapshot, half)),
        log_last,
        log_damaged: false,
    });
    assert_eq!(
        state(&r),
        once,
        "the store was not kept: it was made equal to the snapshot"
    );
    for (i, c) in all.iter().enumerate().skip(half as usize) {
        apply(&r, i as u64 + 1, c);
    }
    assert_eq!(state(&r), once, "the replay changed the state");
    assert_eq!(r.failure(), None);

    // Entries after the log's last are not a replay: applied as they come.
    let next = Command::Publish {
        msg: 77,
        queues: vec![10],
        payload: Bytes::from_static(b"new"),
    };
    apply(&r, log_last + 1, &next);
    let after = state(&r);
    assert!(after.1[&QueueId(10)].iter().any(|(m, _)| *m == MsgId(77)));
}

/// A store that cannot show it holds the snapshot (a log cut short, or a
/// key behind the snapshot) is made equal to the snapshot first, as
/// before, and ends in the same state.
#[test]
fn a_restart_restores_the_snapshot_when_the_store_may_lack_it() {
    let all = history();
    let half = 6u64;
    for (damaged, log_last) in [(true, all.len() as u64), (false, 3)] {
        let dir = TempDir::new("replica-untrusted");
        let (snapshot, once) = snapshot_halfway(&dir, 2, half);
        let (r, _) = reopen(&dir, 2);
        r.resume(berth_cluster::Resume {
            snapshot: Some((&snapshot, half)),
            log_last,
            log_damaged: damaged,
        });
        assert_ne!(state(&r), once, "restored to the snapshot");
        for (i, c) in all.iter().enumerate().skip(half as usize) {
            apply(&r, i as u64 + 1, c);
        }
        assert_eq!(state(&r), once);
        assert_eq!(r.failure(), None);
    }
}
