//! The next segment, prepared off the write path: a helper thread writes
//! [`PREPARED_SEGMENT_NAME`] with zeros to the segment size and
//! fdatasyncs it, so that at the roll the writer only renames it into
//! place. Appends then overwrite zeros, and an fdatasync changes no file
//! size: it writes no inode. With direct appends on, the zeros go past
//! the page cache as the appends do ([`Storage::appends`]), from one
//! buffer written again and again: no copy of them into the cache's
//! pages, and no 64 MiB of zero pages in the cache.
//!
//! Invariants:
//! - The writer never waits for a preparation: at a roll it takes the
//!   file only if the helper has finished with it, and otherwise creates
//!   a growing segment as it always did (the helper's file is kept for a
//!   later roll; see `Writer::awaiting_prepared` for the early one).
//! - A prepared file is whole (every byte zero, the size fdatasynced)
//!   before it is handed over; a failed preparation (ENOSPC included)
//!   removes its file and hands nothing over.
//! - The prepared file holds no record and is never read: a crash at any
//!   point leaves at most a file recovery removes.
//! - Dropping the slot stops and joins the helper.
//! - The helper has at most `PREPARE_WRITE_BACK_BYTES` of zeros on their
//!   way to the device at a time, and rests between write-backs: it takes
//!   the device's spare time, not the committers'.

use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use super::*;
use crate::append_buf::AppendBuf;

/// Zeros written per call while preparing.
const PREPARE_CHUNK_BYTES: usize = 1 << 20;

/// Zeros written out to the device (and waited for) at a time. Left to
/// the kernel, 64 MiB of dirty zeros go out in one burst, at the latest at
/// the final fdatasync, and every committer's fdatasync in the meantime
/// queues behind them; written back a few MiB at a time, the device
/// queue never holds more than this of the helper's.
const PREPARE_WRITE_BACK_BYTES: u64 = 4 << 20;

/// After each write-back the helper rests this many times as long as it
/// took, so it uses at most 1 / (1 + this) of the device's time and the
/// committers' fdatasyncs find the device idle the rest of it.
const PREPARE_REST_PER_WRITE_BACK: u32 = 1;

type Prepared = Result<Arc<dyn StorageFile>, StoreError>;

/// The helper preparing the next segment, or the file it prepared.
pub(super) struct Slot {
    storage: Arc<dyn Storage>,
    /// Where the helper writes.
    path: PathBuf,
    /// Whether the zeros go past the page cache
    /// (`StoreConfig::direct_appends`).
    direct: bool,
    job: Option<(JoinHandle<Prepared>, Arc<AtomicBool>)>,
    /// What a finished job made, until a roll takes it.
    ready: Option<Arc<dyn StorageFile>>,
}

impl Slot {
    pub(super) fn new(storage: Arc<dyn Storage>, dir: &std::path::Path, direct: bool) -> Slot {
        Slot {
            storage,
            path: segment::prepared_segment_path(dir),
            direct,
            job: None,
            ready: None,
        }
    }

    /// Starts preparing unless a preparation is under way or done.
    pub(super) fn start(&mut self, bytes: u64) {
        if self.job.is_some() || self.ready.is_some() {
            return;
        }
        let storage = Arc::clone(&self.storage);
        let path = self.path.clone();
        let direct = self.direct;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_helper = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("berth-segprep".into())
            .spawn(move || {
                let made = prepare(&*storage, &path, bytes, direct, &stop_helper);
                if made.is_err() {
                    match storage.remove(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => tracing::warn!(file = %path.display(), error = %e,
                            "removing a failed segment preparation"),
                    }
                }
                made
            });
        match spawned {
            Ok(handle) => self.job = Some((handle, stop)),
            Err(e) => tracing::warn!(error = %e, "no thread to prepare the next segment"),
        }
    }

    /// Whether a prepared file is ready to take.
    pub(super) fn is_ready(&mut self) -> bool {
        self.collect();
        self.ready.is_some()
    }

    /// The prepared file, if the helper has finished making it.
    pub(super) fn take(&mut self) -> Option<Arc<dyn StorageFile>> {
        self.collect();
        self.ready.take()
    }

    /// Joins a finished helper, keeping what it made.
    fn collect(&mut self) {
        if !self.job.as_ref().is_some_and(|(h, _)| h.is_finished()) {
            return;
        }
        let (handle, _) = self.job.take().expect("checked");
        match handle.join() {
            Ok(Ok(file)) => self.ready = Some(file),
            Ok(Err(e)) => {
                tracing::warn!(error = %e,
                    "preparing the next segment failed: it grows as it is written");
            }
            Err(_) => tracing::error!("the segment preparation helper panicked"),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((handle, stop)) = self.job.take() {
            stop.store(true, Ordering::Relaxed);
            if let Ok(Ok(file)) = handle.join() {
                self.ready = Some(file);
            }
        }
        if self.ready.take().is_some() {
            // A failed one removed its file. If this fails (or the
            // process dies first), the next start removes it.
            if let Err(e) = self.storage.remove(&self.path) {
                tracing::warn!(file = %self.path.display(), error = %e,
                    "removing the unused prepared segment");
            }
        }
    }
}

fn prepare(
    storage: &dyn Storage,
    path: &std::path::Path,
    bytes: u64,
    direct: bool,
    stop: &AtomicBool,
) -> Prepared {
    let file = storage
        .create(path)
        .map_err(|e| StoreError::io("create", path, e))?;
    let file = if direct {
        storage
            .appends(path, file)
            .map_err(|e| StoreError::io("open for direct appends", path, e))?
    } else {
        file
    };
    // One chunk of zeros, placed once: every chunk starts at a multiple
    // of its size, so the same placement fits them all.
    let mut zeros = AppendBuf::with_room(PREPARE_CHUNK_BYTES);
    zeros.place(0);
    zeros.extend_from_slice(&vec![0u8; PREPARE_CHUNK_BYTES]);
    let mut at = 0u64;
    // Start of the zeros not yet written back, and when writing them began.
    let mut behind = 0u64;
    let mut started = std::time::Instant::now();
    while at < bytes {
        if stop.load(Ordering::Relaxed) {
            return Err(StoreError::io(
                "prepare",
                path,
                std::io::Error::new(std::io::ErrorKind::Interrupted, "writer closing"),
            ));
        }
        let n =
            usize::try_from((bytes - at).min(PREPARE_CHUNK_BYTES as u64)).expect("at most a chunk");
        zeros.truncate(n);
        file.append(&mut zeros, at)
            .map_err(|e| StoreError::io("write", path, e))?;
        at += n as u64;
        if at - behind >= PREPARE_WRITE_BACK_BYTES || at == bytes {
            // Written past the cache, the zeros are on the device already
            // and this returns at once; through it, this is the wait.
            file.write_back(behind, at - behind)
                .map_err(|e| StoreError::io("sync_file_range", path, e))?;
            behind = at;
            if at < bytes {
                std::thread::sleep(started.elapsed() * PREPARE_REST_PER_WRITE_BACK);
            }
            started = std::time::Instant::now();
        }
    }
    // A direct write covers whole blocks: a size between two is cut back.
    let len = file.len().map_err(|e| StoreError::io("stat", path, e))?;
    if len > bytes {
        file.set_len(bytes)
            .map_err(|e| StoreError::io("truncate", path, e))?;
    }
    file.sync_data()
        .map_err(|e| StoreError::io("fdatasync", path, e))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::tests::pages_cached;
    use crate::storage::OsStorage;

    #[test]
    fn prepared_zeros_go_past_the_page_cache_with_direct_appends() {
        let (_dir, dir) = berth_testdir::TestDir::new("prepare-direct").and_path();
        // Not a whole number of blocks: the last direct write is cut back.
        let bytes = (4 << 20) + 1000;
        for direct in [true, false] {
            let path = dir.join(format!("prepared-{direct}"));
            let file = prepare(&OsStorage, &path, bytes, direct, &AtomicBool::new(false)).unwrap();
            assert_eq!(file.len().unwrap(), bytes);
            let Some(cached) = pages_cached(&path) else {
                eprintln!(
                    "{} has no page cache to look at (tmpfs): skipped",
                    dir.display()
                );
                return;
            };
            if direct {
                // At most the last, partial block, which the cut zeroes.
                assert!(
                    cached <= 1,
                    "{cached} pages of the prepared zeros are cached"
                );
            } else {
                assert!(
                    cached > 1000,
                    "only {cached} pages cached through the cache"
                );
            }
            let on_disk = std::fs::read(&path).unwrap();
            assert_eq!(on_disk.len() as u64, bytes);
            assert!(on_disk.iter().all(|b| *b == 0));
        }
    }
}
