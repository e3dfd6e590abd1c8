//! Reclaiming space: deleting the sealed segments nothing needs any more,
//! and compacting mostly-dead ones (their live records copied forward as
//! `Relocate` records, one bounded step at a time).
//!
//! Invariants:
//! - A segment is deleted only after the records that moved its messages
//!   elsewhere are on stable storage, and the directory is synced after
//!   the unlinks.
//! - Neither retained checkpoint's replay position is ever deleted.

use super::*;

impl Writer {
    /// Deletes the sealed segments no live message and neither retained
    /// checkpoint needs. Their messages may have left them through
    /// compaction's `Relocate` records, which must be on stable storage
    /// before the deletion can be: a file system may make an unlink durable
    /// ahead of unsynced data, and a power loss would then leave index
    /// entries pointing at a missing segment. So the journal is synced
    /// first, and the directory after the unlinks.
    pub(super) fn delete_dead_segments(&mut self) -> Result<(), StoreError> {
        let n = self.checkpoints.len();
        if n < 2 {
            return Ok(());
        }
        let horizon = self.checkpoints[n - 2..]
            .iter()
            .map(|l| l.info.replay.seg)
            .min()
            .expect("two checkpoints");
        let dead: Vec<u32> = {
            let inner = self.shared.inner.lock();
            self.sealed
                .keys()
                .copied()
                .filter(|&s| s < horizon && inner.index.seg_live(s).count == 0)
                .collect()
        };
        if dead.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.write_buf().and_then(|()| self.sync()) {
            return Err(self.poison(e));
        }
        let mut deleted = 0;
        for seq in dead {
            let path = segment::segment_path(&self.shared.dir, seq);
            match self.storage.remove(&path) {
                Ok(()) => {
                    deleted += 1;
                    self.sealed.remove(&seq);
                    self.unmovable.remove(&seq);
                    self.shared.inner.lock().files.remove(&seq);
                    self.shared
                        .counters
                        .segments_deleted
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(group = self.group(), seq, "segment deleted");
                }
                Err(e) => {
                    tracing::warn!(group = self.group(), file = %path.display(), error = %e, "could not delete dead segment");
                }
            }
        }
        if deleted > 0 {
            // Not needed for safety (a resurrected dead segment is deleted
            // again), but space is only reclaimed for good once it is durable.
            self.storage
                .sync_dir(&self.shared.dir)
                .map_err(self.err("fsync dir", &self.shared.dir))?;
        }
        Ok(())
    }

    /// The oldest sealed segment that is mostly dead and still holds live
    /// records compaction can move.
    pub(super) fn compaction_candidate(&self) -> Option<u32> {
        self.compaction_candidate_below(u32::MAX)
    }

    /// [`Self::compaction_candidate`] among the segments numbered below
    /// `below`.
    pub(super) fn compaction_candidate_below(&self, below: u32) -> Option<u32> {
        let inner = self.shared.inner.lock();
        let pct = u64::from(self.cfg.compaction_live_percent_max);
        self.sealed
            .range(..below)
            .find(|(s, len)| {
                let live = inner.index.seg_live(**s);
                let stuck = self.unmovable.get(*s).map_or(0, |v| {
                    v.iter().filter(|(m, l)| inner.index.is_at(*m, *l)).count() as u64
                });
                live.count > stuck
                    && live.bytes * 100 < **len * pct
                    && !inner.index.segment_has_streams(**s)
            })
            .map(|(s, _)| *s)
    }

    /// Copies up to `bytes_max` of live records out of the candidate
    /// segment numbered below `below` into the active one (as `Relocate`
    /// records). A record that cannot be read or does not verify is
    /// reported and skipped for good.
    pub(super) fn compact_step(&mut self, bytes_max: usize, below: u32) -> Result<(), StoreError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        let Some(seq) = self.compaction_candidate_below(below) else {
            return Ok(());
        };
        let (file, live) = {
            let inner = self.shared.inner.lock();
            (
                inner.files.get(&seq).cloned(),
                inner.index.live_in_segment(seq),
            )
        };
        let Some(file) = file else { return Ok(()) };
        let mark = self.mark();
        let path = segment::segment_path(&self.shared.dir, seq);
        let mut copied = 0usize;
        let mut moved: Vec<(MsgId, Vec<QueueId>, Loc)> = Vec::new();
        for (msg, loc) in live {
            if copied >= bytes_max {
                break;
            }
            if self
                .unmovable
                .get(&seq)
                .is_some_and(|v| v.contains(&(msg, loc)))
            {
                continue;
            }
            let mut rec = vec![0u8; loc.len as usize];
            let payload = match file.read_exact_at(&mut rec, u64::from(loc.offset)) {
                Err(e) => Err(format!("read failed: {e}")),
                Ok(()) => record::message_payload(self.shared.salt, &rec, msg)
                    .map_err(|found| format!("record does not verify: {found:?}")),
            };
            let payload = match payload {
                Ok(payload) => payload,
                Err(why) => {
                    let queues = self.shared.inner.lock().index.queues_of(msg);
                    tracing::error!(group = self.group(), file = %path.display(), offset = loc.offset,
                        %msg, ?queues, "live record unreadable ({why}); left in place, compaction moves on");
                    self.unmovable.entry(seq).or_default().push((msg, loc));
                    self.shared
                        .counters
                        .unreadable_records
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let queues = self.shared.inner.lock().index.queues_of(msg);
            let new_loc = match self.encode(
                &Record::Relocate {
                    msg,
                    queues: queues.as_slice().into(),
                    payload,
                },
                &[],
            ) {
                Ok(l) => l,
                Err(e) => return Err(self.write_failed(&mark, e)),
            };
            moved.push((msg, queues, new_loc));
            copied += loc.len as usize;
        }
        if let Err(e) = self.write_buf() {
            return Err(self.write_failed(&mark, e));
        }
        let placed: Vec<(Record<'_>, Loc)> = moved
            .iter()
            .map(|(msg, queues, loc)| {
                let rec = Record::Relocate {
                    msg: *msg,
                    queues: queues.as_slice().into(),
                    payload: &[],
                };
                (rec, *loc)
            })
            .collect();
        let mut inner = self.shared.inner.lock();
        for (rec, loc) in &placed {
            inner.index.apply(rec, *loc);
        }
        drop(inner);
        self.note_facts(placed.iter().map(|(rec, loc)| (rec, *loc)));
        self.shared
            .counters
            .bytes_compacted
            .fetch_add(copied as u64, Ordering::Relaxed);
        tracing::debug!(
            group = self.group(),
            seq,
            messages = moved.len(),
            bytes = copied,
            "compacted"
        );
        Ok(())
    }
}
