//! A checkpoint does not read back the journal its writer wrote since the
//! previous one: the writer kept what the index needs of those records
//! (`writer/facts.rs`), so their payloads are never read, copied or
//! checksummed again for a checkpoint.

mod common;

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::storage::{Storage, StorageFile};
use berth_store::{QueueId, Store};
use bytes::Bytes;
use common::{config, wait};

/// [`FaultStorage`] counting the bytes read from segment files.
struct CountingStorage {
    inner: FaultStorage,
    segment_bytes_read: Arc<AtomicU64>,
}

struct CountingFile {
    inner: Arc<dyn StorageFile>,
    read: Option<Arc<AtomicU64>>,
}

impl CountingStorage {
    fn wrap(&self, path: &Path, file: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        let segment = path.extension().is_some_and(|e| e == "seg");
        Arc::new(CountingFile {
            inner: file,
            read: segment.then(|| Arc::clone(&self.segment_bytes_read)),
        })
    }
}

impl Storage for CountingStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.wrap(path, self.inner.create(path)?))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.wrap(path, self.inner.open(path)?))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

impl StorageFile for CountingFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(read) = &self.read {
            read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

#[test]
fn checkpoints_do_not_read_back_the_journal_the_writer_wrote() {
    let read = Arc::new(AtomicU64::new(0));
    let storage = CountingStorage {
        inner: FaultStorage::new(7),
        segment_bytes_read: Arc::clone(&read),
    };
    let mut cfg = config(1);
    // No compaction: it reads the records it moves.
    cfg.compaction_live_percent_max = 0;
    let (store, _) = Store::open_with(cfg, Arc::new(storage)).expect("open");
    let mut live = Vec::new();
    // Deltas of publishes and removes, and bases when they add up to one.
    for round in 0..30u64 {
        for _ in 0..40 {
            let m = store.next_msg_id();
            let q = QueueId(round % 3);
            wait(|d| store.publish(m, &[q], Bytes::from(vec![5u8; 2048]), Some(d))).unwrap();
            live.push((q, m));
        }
        for (q, m) in live.drain(..30) {
            wait(|d| store.remove(q, &[m], Some(d))).unwrap();
        }
        store.checkpoint().unwrap();
    }
    let stats = &store.stats()[0];
    assert!(stats.checkpoints >= 30, "{stats:?}");
    assert!(stats.segments_deleted > 0, "{stats:?}");
    assert_eq!(
        read.load(Ordering::Relaxed),
        0,
        "checkpoints read segment bytes back"
    );
}
