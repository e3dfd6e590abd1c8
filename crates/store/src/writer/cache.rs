//! Dropping sealed segments from the page cache once they are cold
//! (`StoreConfig::segment_cache_bytes`): a deep backlog would otherwise
//! keep taking memory for cache that nobody reads soon, and on a virtual
//! machine whose free memory goes back to its host, fresh memory costs
//! the writer ~10x more CPU per byte to fill than pages it reuses
//! (docs/BENCHMARKS.md, "What slows a deep fill").
//!
//! Invariants:
//! - Only sealed segments are dropped, after their fdatasync: the pages
//!   are clean, so the advice frees them; a read afterwards reads the disk
//!   and returns the same bytes.
//! - A segment is dropped once at least `segment_cache_bytes` of the
//!   group's journal were written after it, and only when it lies wholly
//!   before the newest checkpoint's replay position, so no checkpoint
//!   (which reads the journal since the newest one) reads it back.
//! - Each segment is advised at most once, in seq order; segments that
//!   were on disk when the store opened are left alone (the process that
//!   wrote them dropped what it did).
//! - Dropping is advice: a failure is logged and changes nothing else; it
//!   never fails a write or poisons the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Writer;
use crate::segment;

impl Writer {
    /// Drops from the page cache every sealed segment that has become
    /// cold since the last call. Runs between batches (after completions),
    /// when a seal or a checkpoint may have made one cold.
    pub(super) fn drop_cold_segments(&mut self) {
        if !std::mem::take(&mut self.cache_check_due) || self.cfg.segment_cache_bytes == 0 {
            return;
        }
        let Some(replay_seg) = self.checkpoints.last().map(|l| l.info.replay.seg) else {
            return;
        };
        let cold: Vec<(u32, u64)> = {
            let candidates: Vec<(u32, u64)> = self
                .sealed
                .range(self.cache_drop_next..)
                .map(|(&s, &len)| (s, len))
                .collect();
            let mut after: u64 = self.active.as_ref().map_or(0, |a| a.len)
                + candidates.iter().map(|&(_, len)| len).sum::<u64>();
            candidates
                .into_iter()
                .take_while(|&(seq, len)| {
                    after -= len;
                    seq < replay_seg && after >= self.cfg.segment_cache_bytes
                })
                .collect()
        };
        for (seq, len) in cold {
            let file = self.shared.inner.lock().files.get(&seq).map(Arc::clone);
            if let Some(file) = file {
                if let Err(e) = file.drop_cache(0, len) {
                    let path = segment::segment_path(&self.shared.dir, seq);
                    tracing::warn!(group = self.group(), file = %path.display(), error = %e,
                        "could not drop a sealed segment from the page cache");
                }
                self.shared
                    .counters
                    .segments_uncached
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.cache_drop_next = seq + 1;
        }
    }
}
