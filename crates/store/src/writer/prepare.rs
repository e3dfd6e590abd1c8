//! The next segment, prepared off the write path: a helper thread writes
//! [`PREPARED_SEGMENT_NAME`] with zeros to the segment size and
//! fdatasyncs it, so that at the roll the writer only renames it into
//! place. Appends then overwrite zeros, and an fdatasync changes no file
//! size: it writes no inode.
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
    job: Option<(JoinHandle<Prepared>, Arc<AtomicBool>)>,
    /// What a finished job made, until a roll takes it.
    ready: Option<Arc<dyn StorageFile>>,
}

impl Slot {
    pub(super) fn new(storage: Arc<dyn Storage>, dir: &std::path::Path) -> Slot {
        Slot {
            storage,
            path: segment::prepared_segment_path(dir),
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
        let stop = Arc::new(AtomicBool::new(false));
        let stop_helper = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("berth-segprep".into())
            .spawn(move || {
                let made = prepare(&*storage, &path, bytes, &stop_helper);
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
    stop: &AtomicBool,
) -> Prepared {
    let file = storage
        .create(path)
        .map_err(|e| StoreError::io("create", path, e))?;
    let zeros = vec![0u8; PREPARE_CHUNK_BYTES];
    let mut at = 0u64;
    // Start of the zeros not yet written back.
    let mut behind = 0u64;
    while at < bytes {
        if stop.load(Ordering::Relaxed) {
            return Err(StoreError::io(
                "prepare",
                path,
                std::io::Error::new(std::io::ErrorKind::Interrupted, "writer closing"),
            ));
        }
        let n = usize::try_from((bytes - at).min(zeros.len() as u64)).expect("at most a chunk");
        file.write_all_at(&zeros[..n], at)
            .map_err(|e| StoreError::io("write", path, e))?;
        at += n as u64;
        if at - behind >= PREPARE_WRITE_BACK_BYTES || at == bytes {
            let started = std::time::Instant::now();
            file.write_back(behind, at - behind)
                .map_err(|e| StoreError::io("sync_file_range", path, e))?;
            behind = at;
            if at < bytes {
                std::thread::sleep(started.elapsed() * PREPARE_REST_PER_WRITE_BACK);
            }
        }
    }
    file.sync_data()
        .map_err(|e| StoreError::io("fdatasync", path, e))?;
    Ok(file)
}
