//! A full disk met by a write: take the batch back and wait for space,
//! instead of poisoning the group until a restart.
//!
//! Another process can fill the disk before the broker's disk alarm trips.
//! A `write` (or `create`) that then fails with ENOSPC or EDQUOT never
//! reached fdatasync, so the group still knows exactly what is on disk: the
//! bytes up to the mark taken before the batch. Everything after it is
//! cut off again and the group waits for space, probing for it.
//!
//! Invariants:
//! - Only [`StoreError::is_out_of_space`] is taken back. A failed
//!   fdatasync (or any other error) still poisons: after a failed sync the
//!   page cache's state is unknown, and retrying it proves nothing.
//! - A take-back leaves the group as it was at its [`Mark`]: the segment
//!   active then is active again, truncated to its length then and
//!   fdatasynced (so no complete record of the failed batch can come back
//!   after a crash); segments the batch started are removed and the
//!   directory synced; the lsns and segment numbers it used are handed out
//!   again, so the journal has neither gap nor repeat. No waiter of the
//!   batch succeeds, and the index was not touched (it is applied only
//!   after a successful write). If any step fails, the group is poisoned.
//! - While waiting, every write fails at once with [`StoreError::NoSpace`]
//!   and compaction pauses; a probe runs every
//!   [`NO_SPACE_RETRY_MS`] (never a busy loop): it writes zeros past the
//!   end of the active segment and truncates them away. Zeros are never a
//!   valid record, so a crash in between leaves only a torn tail, which
//!   recovery truncates.

use super::*;
use crate::limits::NO_SPACE_RETRY_MS;

/// Smallest probe: one page.
const PROBE_BYTES_MIN: usize = 4096;

/// What the group looked like before a batch (or compaction step or
/// probe): what a take-back returns to.
pub(super) struct Mark {
    /// The active segment and its written length.
    active: Option<(u32, u64)>,
    buf_len: usize,
    next_seq: u32,
    next_lsn: u64,
    journal_bytes_since_checkpoint: u64,
}

/// A group waiting for space.
pub(super) struct SpaceWait {
    /// What writes are refused with meanwhile.
    error: StoreError,
    /// When the next probe runs.
    retry_at: Instant,
    /// Bytes the probe writes: as many as the batch that failed.
    probe_bytes: usize,
}

impl Writer {
    pub(super) fn mark(&self) -> Mark {
        Mark {
            active: self.active.as_ref().map(|a| (a.seq, a.len)),
            buf_len: self.buf.len(),
            next_seq: self.next_seq,
            next_lsn: self.next_lsn,
            journal_bytes_since_checkpoint: self.journal_bytes_since_checkpoint,
        }
    }

    /// A write since `mark` failed with `cause`: takes it back and waits
    /// for space if the disk was full, else poisons. Returns what the
    /// waiters of the failed writes get.
    pub(super) fn write_failed(&mut self, mark: &Mark, cause: StoreError) -> StoreError {
        if !cause.is_out_of_space() {
            return self.poison(cause);
        }
        let probe_bytes = self.buf.len().saturating_sub(mark.buf_len);
        if let Err(e) = self.take_back(mark) {
            tracing::error!(group = self.group(), error = %e, "taking back a write that found the disk full failed");
            return self.poison(e);
        }
        let error = StoreError::NoSpace {
            group: self.group(),
            dir: self.shared.dir.clone(),
            retry_ms: NO_SPACE_RETRY_MS,
            cause: Arc::new(cause),
        };
        if self.space.is_none() {
            tracing::error!(group = self.group(), error = %error, cause = %source_of(&error),
                "log group out of disk space: refusing writes until space returns");
        }
        *self.shared.no_space.lock() = Some(error.clone());
        self.space = Some(SpaceWait {
            error: error.clone(),
            retry_at: self.clock.now() + Duration::from_millis(NO_SPACE_RETRY_MS),
            probe_bytes: probe_bytes.max(PROBE_BYTES_MIN),
        });
        error
    }

    /// Returns the group's files, counters and numbering to `mark`.
    fn take_back(&mut self, mark: &Mark) -> Result<(), StoreError> {
        // Their records may be among those taken back.
        self.drop_facts();
        self.buf.truncate(mark.buf_len);
        if self.next_seq > mark.next_seq {
            for seq in mark.next_seq..self.next_seq {
                self.shared.inner.lock().files.remove(&seq);
                self.sealed.remove(&seq);
                if self.active.as_ref().is_some_and(|a| a.seq == seq) {
                    self.active = None;
                }
                let path = segment::segment_path(&self.shared.dir, seq);
                match self.storage.remove(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("remove", path, e)),
                }
                tracing::debug!(
                    group = self.group(),
                    seq,
                    "segment of a failed batch removed"
                );
            }
            self.storage
                .sync_dir(&self.shared.dir)
                .map_err(self.err("fsync dir", &self.shared.dir))?;
            self.next_seq = mark.next_seq;
        }
        if let Some((seq, len)) = mark.active {
            if self.active.as_ref().is_none_or(|a| a.seq != seq) {
                // The batch sealed it and went on in a segment now removed.
                self.sealed.remove(&seq);
                let file = self
                    .shared
                    .inner
                    .lock()
                    .files
                    .get(&seq)
                    .cloned()
                    .expect("the segment active at the mark is still listed");
                self.active = Some(Active { seq, file, len });
            }
            let a = self.active.as_mut().expect("just set");
            a.len = len;
            let path = segment::segment_path(&self.shared.dir, seq);
            a.file
                .set_len(len)
                .map_err(|e| StoreError::io("truncate", &path, e))?;
            // Complete records of the failed batch may be in the page cache
            // past `len`: make the cut durable before anyone can rely on
            // their absence (a later batch reuses their lsns).
            a.file
                .sync_data()
                .map_err(|e| StoreError::io("fdatasync", &path, e))?;
            self.dirty = false;
        }
        self.next_lsn = mark.next_lsn;
        self.journal_bytes_since_checkpoint = mark.journal_bytes_since_checkpoint;
        // Positions the failed batch may have had synced (at a segment
        // roll) are no longer on disk and will be reissued.
        self.shared
            .counters
            .durable_lsn
            .fetch_min(mark.next_lsn.saturating_sub(1), Ordering::Release);
        Ok(())
    }

    /// While the group waits for space: the error to refuse writes with,
    /// unless a probe due now finds space again (then `None`: write).
    pub(super) fn refused_for_space(&mut self) -> Option<StoreError> {
        let wait = self.space.as_ref()?;
        if self.clock.now() < wait.retry_at {
            return Some(wait.error.clone());
        }
        self.probe_space();
        self.space.as_ref().map(|w| w.error.clone())
    }

    /// When the next probe is due, if the group waits for space.
    pub(super) fn space_retry_at(&self) -> Option<Instant> {
        self.space.as_ref().map(|w| w.retry_at)
    }

    /// Whether the group waits for space (compaction pauses meanwhile).
    pub(super) fn waiting_for_space(&self) -> bool {
        self.space.is_some()
    }

    /// Runs the probe if it is due: space found ends the wait.
    pub(super) fn probe_space_if_due(&mut self) {
        if self
            .space
            .as_ref()
            .is_some_and(|w| self.clock.now() >= w.retry_at)
        {
            self.probe_space();
        }
    }

    fn probe_space(&mut self) {
        let Some(probe_bytes) = self.space.as_ref().map(|w| w.probe_bytes) else {
            return;
        };
        let mark = self.mark();
        let result = self.probe(probe_bytes);
        match result {
            Ok(()) => {
                tracing::info!(
                    group = self.group(),
                    "log group has disk space again: taking writes"
                );
                self.space = None;
                *self.shared.no_space.lock() = None;
            }
            Err(e) if e.is_out_of_space() => {
                if let Err(e) = self.take_back(&mark) {
                    self.space = None;
                    *self.shared.no_space.lock() = None;
                    self.poison(e);
                    return;
                }
                tracing::debug!(group = self.group(), error = %e, "still no disk space");
                if let Some(w) = &mut self.space {
                    w.retry_at = self.clock.now() + Duration::from_millis(NO_SPACE_RETRY_MS);
                }
            }
            Err(e) => {
                self.space = None;
                *self.shared.no_space.lock() = None;
                self.poison(e);
            }
        }
    }

    /// Writes `bytes` zeros past the end of the active segment (starting
    /// one if there is none) and cuts them off again.
    fn probe(&mut self, bytes: usize) -> Result<(), StoreError> {
        if self.active.is_none() {
            self.open_segment()?;
            self.write_buf()?;
        }
        let a = self.active.as_ref().expect("opened");
        let path = segment::segment_path(&self.shared.dir, a.seq);
        let end = a.len + self.buf.len() as u64;
        a.file
            .write_all_at(&vec![0u8; bytes], end)
            .map_err(|e| StoreError::io("write", &path, e))?;
        a.file
            .set_len(end)
            .map_err(|e| StoreError::io("truncate", &path, e))
    }
}

fn source_of(e: &StoreError) -> String {
    std::error::Error::source(e).map_or_else(String::new, ToString::to_string)
}
