//! The group writer's active segment: opening it (a prepared file or a
//! new one), writing the encoded batch to it, fdatasync, cutting it back
//! to what was written after a failed write, and sealing it at a roll;
//! and the running size of the fdatasyncs that decides whether preparing
//! the next segment pays.
//!
//! Invariants:
//! - Nothing is reported durable before the fdatasync that covers it
//!   returned; a failed write or fdatasync poisons the group (no retry
//!   that could report lost bytes as written).
//! - A segment is sealed only once everything written to it is synced.

use super::*;

/// The segment being appended to.
pub(super) struct Active {
    pub(super) seq: u32,
    pub(super) file: Arc<dyn StorageFile>,
    /// Bytes written to the file.
    pub(super) len: u64,
}

impl Writer {
    pub(super) fn open_segment(&mut self) -> Result<(), StoreError> {
        let seq = self.next_seq;
        let path = segment::segment_path(&self.shared.dir, seq);
        let prepared = if self.use_prepared {
            self.prepared.take()
        } else {
            None
        };
        self.awaiting_prepared = self.use_prepared && prepared.is_none();
        self.use_prepared = false;
        let file = match prepared {
            Some(file) => {
                // Zeros to the segment size, already fdatasynced: only its
                // name changes. Its header is written with its first records.
                let from = segment::prepared_segment_path(&self.shared.dir);
                self.storage
                    .rename(&from, &path)
                    .map_err(self.err("rename", &from))?;
                file
            }
            None => self
                .storage
                .create(&path)
                .map_err(self.err("create", &path))?,
        };
        let file = if self.cfg.direct_appends {
            self.storage
                .appends(&path, file)
                .map_err(self.err("open for direct appends", &path))?
        } else {
            file
        };
        // The entry must be durable before any record in it is completed.
        self.storage
            .sync_dir(&self.shared.dir)
            .map_err(self.err("fsync dir", &self.shared.dir))?;
        self.next_seq += 1;
        self.prepare_next();
        self.buf.place(0);
        self.buf
            .extend_from_slice(&segment::encode_header(self.group(), seq));
        self.shared
            .inner
            .lock()
            .files
            .insert(seq, Arc::clone(&file));
        self.active = Some(Active { seq, file, len: 0 });
        tracing::debug!(group = self.group(), seq, "segment opened");
        Ok(())
    }

    /// Starts preparing the segment after the active one (off this
    /// thread), unless preparation is off or the recent fdatasyncs were
    /// large enough that its zeros would cost more than they save.
    pub(super) fn prepare_next(&mut self) {
        if self.cfg.segment_prepare && self.sync_bytes_avg <= crate::limits::PREPARE_SYNC_BYTES_MAX
        {
            self.prepared.start(self.cfg.segment_size_bytes);
        }
    }

    /// Cuts a prepared segment's unwritten zeros off (and with `sync`,
    /// fdatasyncs the new size), so that the file ends at its last record,
    /// as one that grew does. Everything buffered must be written first.
    pub(super) fn cut_to_written(&self, a: &Active, sync: bool) -> Result<(), StoreError> {
        debug_assert!(self.buf.is_empty(), "cut past buffered bytes");
        let path = segment::segment_path(&self.shared.dir, a.seq);
        let size = a.file.len().map_err(|e| StoreError::io("stat", &path, e))?;
        if size > a.len {
            a.file
                .set_len(a.len)
                .map_err(|e| StoreError::io("truncate", &path, e))?;
            if sync {
                a.file
                    .sync_data()
                    .map_err(|e| StoreError::io("fdatasync", &path, e))?;
            }
        }
        Ok(())
    }

    pub(super) fn write_buf(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let a = self
            .active
            .as_mut()
            .expect("buffered bytes belong to a segment");
        // The path is only made for an error: this runs for every batch.
        let (dir, seq) = (&self.shared.dir, a.seq);
        a.file
            .append(&mut self.buf, a.len)
            .map_err(|e| StoreError::io("write", segment::segment_path(dir, seq), e))?;
        a.len += self.buf.len() as u64;
        self.shared
            .counters
            .write_buffer_bytes
            .store(self.buf.capacity() as u64, Ordering::Relaxed);
        self.journal_bytes_since_checkpoint += self.buf.len() as u64;
        self.unsynced_bytes += self.buf.len() as u64;
        self.shared
            .counters
            .bytes_written
            .fetch_add(self.buf.len() as u64, Ordering::Relaxed);
        self.buf.clear();
        self.dirty = true;
        self.last_write = self.clock.now();
        Ok(())
    }

    /// Gives the encode buffer's memory back once the group is idle: it
    /// grows to a batch's size (up to `batch_bytes_max`) and is reused
    /// while writes come, so that a busy writer does not fault in fresh
    /// pages for every batch; a quiet one holds nothing.
    pub(super) fn release_idle_buffer(&mut self) {
        self.storage.release_idle_memory();
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf.release();
            self.shared
                .counters
                .write_buffer_bytes
                .store(0, Ordering::Relaxed);
        }
    }

    pub(super) fn sync(&mut self) -> Result<(), StoreError> {
        let Some(a) = &self.active else { return Ok(()) };
        if !self.dirty {
            return Ok(());
        }
        let started = self.clock.now();
        let (dir, seq) = (&self.shared.dir, a.seq);
        a.file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", segment::segment_path(dir, seq), e))?;
        let us = u64::try_from(
            self.clock
                .now()
                .saturating_duration_since(started)
                .as_micros(),
        )
        .unwrap_or(u64::MAX);
        self.gather.sync_took(us);
        let c = &self.shared.counters;
        c.syncs.fetch_add(1, Ordering::Relaxed);
        c.sync_us_total.fetch_add(us, Ordering::Relaxed);
        c.sync_latency_us.0.observe(us);
        if self.buf.is_empty() {
            // Every record numbered so far is written, and now synced.
            c.durable_lsn
                .fetch_max(self.next_lsn - 1, Ordering::Release);
        }
        self.dirty = false;
        self.last_sync = self.clock.now();
        self.sync_bytes_avg = sync_bytes_avg_next(self.sync_bytes_avg, self.unsynced_bytes);
        self.unsynced_bytes = 0;
        // Syncs small again after bulk writes: prepare from now on.
        self.prepare_next();
        Ok(())
    }

    /// fdatasyncs and closes the active segment; the next write opens a new one.
    pub(super) fn seal(&mut self) -> Result<(), StoreError> {
        self.write_buf()?;
        self.sync()?;
        if let Some(a) = &self.active {
            // Before the next segment takes a record: a crash between the
            // two leaves zeros only at the end of the newest segment.
            self.cut_to_written(a, true)?;
        }
        if let Some(a) = self.active.take() {
            tracing::debug!(
                group = self.group(),
                seq = a.seq,
                bytes = a.len,
                "segment sealed"
            );
            self.sealed.insert(a.seq, a.len);
            self.cache_check_due = true;
        }
        Ok(())
    }
}

/// The next value of `Writer::sync_bytes_avg` after an fdatasync of
/// `synced` bytes: each byte moves the average by 1 / `PREPARE_SYNC_AVG_BYTES`
/// of the way to the size of its fdatasync. Both are capped at that
/// window, beyond which every fdatasync counts as bulk.
fn sync_bytes_avg_next(avg: u64, synced: u64) -> u64 {
    let window = crate::limits::PREPARE_SYNC_AVG_BYTES;
    let b = synced.min(window);
    let avg = avg.min(window);
    // avg + (b - avg) * b / window, in integers: at most 2^44, no overflow.
    (avg * (window - b) + b * b) / window
}

#[cfg(test)]
mod tests {
    use super::sync_bytes_avg_next;
    use crate::limits::{PREPARE_SYNC_AVG_BYTES, PREPARE_SYNC_BYTES_MAX};

    fn after(mut avg: u64, syncs: usize, bytes: u64) -> u64 {
        for _ in 0..syncs {
            avg = sync_bytes_avg_next(avg, bytes);
        }
        avg
    }

    #[test]
    fn bulk_syncs_raise_the_average_and_a_few_small_ones_do_not_lower_it() {
        // 8 MiB in fdatasyncs of 200 KB (a bulk publish): well above.
        let bulk = after(0, 40, 200 * 1024);
        assert!(bulk > 2 * PREPARE_SYNC_BYTES_MAX, "{bulk}");
        // 1 MiB of acks in fdatasyncs of 2 KB: still above.
        let drained = after(bulk, 512, 2048);
        assert!(drained > PREPARE_SYNC_BYTES_MAX, "{drained}");
        // A steady stream of small fdatasyncs brings it down.
        let small = after(drained, 10_000, 4096);
        assert!(small < PREPARE_SYNC_BYTES_MAX / 4, "{small}");
        // One fdatasync beyond the window counts as the whole window.
        assert_eq!(sync_bytes_avg_next(0, u64::MAX), PREPARE_SYNC_AVG_BYTES);
    }
}
