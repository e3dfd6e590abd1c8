//! The writer's housekeeping: checkpoints (written by a helper thread from
//! an index rebuilt off the writer's path); reclaiming space is in
//! `reclaim.rs`.

use super::facts::FactOps;
use super::*;

/// Where a background checkpoint reports its outcome.
/// (the written file's size).
pub(super) type CheckpointResult = Receiver<Result<u64, StoreError>>;

/// How often the writer looks for a finished background checkpoint.
pub(super) const CHECKPOINT_POLL_MS: u64 = 2;

/// What a checkpoint's helper thread writes, and from what.
pub(super) enum IndexSource {
    /// A base from a copy taken on the writer's path, under the index
    /// lock: only when the journal alone cannot rebuild the index.
    Snapshot(Index),
    /// A base from the newest chain (`chain`, base first; empty: the start
    /// of the journal) and the journal after its newest link.
    Journal { chain: Vec<Link>, tail: Tail },
    /// A delta on `parent` from the journal after it.
    Delta { parent: Link, tail: Tail },
}

/// The journal after a checkpoint's parent: each segment with the offset
/// to read to, and the index ops of its records when the writer kept them
/// (see [`super::facts`]): then nothing is read.
pub(super) struct Tail {
    pub(super) segments: Vec<(u32, Arc<dyn StorageFile>, u64)>,
    pub(super) facts: Option<FactOps>,
}

impl IndexSource {
    pub(super) fn is_base(&self) -> bool {
        !matches!(self, IndexSource::Delta { .. })
    }

    /// The same source reading the journal, if this one has facts.
    fn read_instead(&self) -> Option<IndexSource> {
        let read = |tail: &Tail| Tail {
            segments: tail.segments.clone(),
            facts: None,
        };
        match self {
            IndexSource::Journal { chain, tail } if tail.facts.is_some() => {
                Some(IndexSource::Journal {
                    chain: chain.clone(),
                    tail: read(tail),
                })
            }
            IndexSource::Delta { parent, tail } if tail.facts.is_some() => {
                Some(IndexSource::Delta {
                    parent: *parent,
                    tail: read(tail),
                })
            }
            _ => None,
        }
    }
}

/// Where the journal after `chain`'s newest link starts, and the lsn of
/// the record before it (the journal's start and 0 for no chain).
fn chain_end(chain: &[Link]) -> (ReplayFrom, u64) {
    chain
        .last()
        .map_or((ReplayFrom::START, 0), |l| (l.info.replay, l.info.lsn))
}

/// The index at the newest link of `chain` (base first), as recovery
/// would load it; every file must read back as the link it was written as.
pub(crate) fn load_chain(
    storage: &dyn Storage,
    dir: &std::path::Path,
    group: u32,
    chain: &[Link],
) -> Result<Index, StoreError> {
    let mut index = Index::default();
    for (i, link) in chain.iter().enumerate() {
        let path = dir.join(checkpoint::checkpoint_name(link.no));
        let bytes = crate::manifest::read_all(storage, &path)?;
        let parsed = checkpoint::parse(group, bytes, &path)?;
        if parsed.info != link.info
            || parsed.kind != link.kind
            || (i == 0) != (link.kind == Kind::Base)
        {
            return Err(StoreError::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "checkpoint reads as {:?} {:?}, was written as {link:?}",
                    parsed.info, parsed.kind
                ),
            });
        }
        match parsed.kind {
            Kind::Base => index = parsed.load_base()?,
            Kind::Delta { .. } => parsed.apply_delta(&mut index)?,
        }
    }
    Ok(index)
}

/// Reads the journal from `from` through `segments` (each read to its
/// offset) and hands every record to `f` with its location; returns the
/// lsn of the last numbered record (`lsn` if none). The journal is
/// immutable up to there (synced, and no segment at or after the newest
/// checkpoint's replay position is deleted while a checkpoint is in
/// flight).
fn replay_journal(
    dir: &std::path::Path,
    salt: u32,
    from: ReplayFrom,
    mut lsn: u64,
    segments: Vec<(u32, Arc<dyn StorageFile>, u64)>,
    mut f: impl FnMut(&Record<'_>, Loc),
) -> Result<u64, StoreError> {
    for (seq, file, end) in segments {
        let path = segment::segment_path(dir, seq);
        let start = if seq == from.seg {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES as u64
        };
        let corrupt = |offset: u64, reason: String| StoreError::Corrupt {
            path: path.clone(),
            offset,
            reason: format!("journal does not replay for a checkpoint: {reason}"),
        };
        let len = end
            .checked_sub(start)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| corrupt(start, format!("range {start}..{end}")))?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, start)
            .map_err(|e| StoreError::io("read", &path, e))?;
        let mut at = 0;
        while at < buf.len() {
            let offset = start + at as u64;
            match record::decode(salt, &buf[at..]) {
                Decoded::Record {
                    lsn: l,
                    record,
                    len,
                } => {
                    let loc = Loc {
                        seg: seq,
                        offset: u32::try_from(offset)
                            .map_err(|e| corrupt(offset, e.to_string()))?,
                        len: u32::try_from(len).map_err(|e| corrupt(offset, e.to_string()))?,
                    };
                    f(&record, loc);
                    if !matches!(record, Record::Hole { .. }) {
                        lsn = l;
                    }
                    at += len;
                }
                Decoded::Incomplete { needed } => {
                    return Err(corrupt(offset, format!("record needs {needed} bytes")))
                }
                Decoded::Corrupt(c) => return Err(corrupt(offset, format!("{c:?}"))),
                Decoded::Unparseable { reason, .. } => return Err(corrupt(offset, reason)),
            }
        }
    }
    Ok(lsn)
}

fn ends_at(dir: &std::path::Path, lsn: u64, to: CheckpointInfo) -> Result<(), StoreError> {
    if lsn == to.lsn {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: dir.to_path_buf(),
        offset: 0,
        reason: format!(
            "journal replay for a checkpoint ended at lsn {lsn}, the checkpoint is at {}",
            to.lsn
        ),
    })
}

/// Builds the bytes of checkpoint `to` from `source` (on the helper
/// thread): a base costs what is live, a delta what the journal since its
/// parent holds.
///
/// In the store's unit tests, a checkpoint built from the writer's facts
/// is built again from the journal, and the two must be the same bytes (a
/// pair assertion: the facts stand for the journal). A journal that no
/// longer replays (damaged since it was written, as fault tests do) is no
/// mismatch: the facts describe what was written and synced, as the
/// snapshot of the index that such a checkpoint falls back to would.
pub(super) fn build_checkpoint(
    storage: &dyn Storage,
    dir: &std::path::Path,
    group: u32,
    salt: u32,
    source: IndexSource,
    to: CheckpointInfo,
) -> Result<Vec<u8>, StoreError> {
    let read = if cfg!(test) {
        source.read_instead()
    } else {
        None
    };
    let bytes = build(storage, dir, group, salt, source, to)?;
    if let Some(read) = read {
        if let Ok(again) = build(storage, dir, group, salt, read, to) {
            #[cfg(test)]
            super::facts::tests::note_pair_check(bytes == again);
            assert!(
                bytes == again,
                "group {group}: the checkpoint at {to:?} built from the writer's facts \
                 differs from the one the journal replays to"
            );
        }
    }
    Ok(bytes)
}

fn build(
    storage: &dyn Storage,
    dir: &std::path::Path,
    group: u32,
    salt: u32,
    source: IndexSource,
    to: CheckpointInfo,
) -> Result<Vec<u8>, StoreError> {
    match source {
        IndexSource::Snapshot(index) => Ok(checkpoint::encode(group, to, &index)),
        IndexSource::Journal { chain, tail } => {
            let (from, lsn) = chain_end(&chain);
            let mut index = load_chain(storage, dir, group, &chain)?;
            match tail.facts {
                // Applied as recovery applies a delta file: through its
                // parser, onto the chain's index.
                Some(FactOps { ops, lsn }) => {
                    ends_at(dir, lsn, to)?;
                    let (parent_no, parent_lsn) =
                        chain.last().map_or((0, 0), |l| (l.no, l.info.lsn));
                    let delta = ops.encode(group, to, parent_no, parent_lsn);
                    checkpoint::parse(group, delta, dir)?.apply_delta(&mut index)?;
                }
                None => {
                    let lsn = replay_journal(dir, salt, from, lsn, tail.segments, |r, loc| {
                        index.apply(r, loc);
                    })?;
                    ends_at(dir, lsn, to)?;
                }
            }
            Ok(checkpoint::encode(group, to, &index))
        }
        IndexSource::Delta { parent, tail } => {
            let delta = match tail.facts {
                Some(FactOps { ops, lsn }) => {
                    ends_at(dir, lsn, to)?;
                    ops
                }
                None => {
                    let mut delta = DeltaBuilder::new(0);
                    let lsn = replay_journal(
                        dir,
                        salt,
                        parent.info.replay,
                        parent.info.lsn,
                        tail.segments,
                        |r, loc| delta.push(r, loc),
                    )?;
                    ends_at(dir, lsn, to)?;
                    delta
                }
            };
            Ok(delta.encode(group, to, parent.no, parent.info.lsn))
        }
    }
}

/// Writes checkpoint `no` durably (see [`crate::storage::write_atomically`]).
pub(super) fn write_checkpoint(
    storage: &dyn Storage,
    dir: &std::path::Path,
    no: u64,
    bytes: &[u8],
) -> Result<(), StoreError> {
    crate::storage::write_atomically(
        storage,
        dir,
        CHECKPOINT_TMP_NAME,
        &checkpoint::checkpoint_name(no),
        bytes,
    )
}

/// The links of the chain that ends at `links[i]`, base first (empty if a
/// link of it is not among `links`).
pub(crate) fn chain_of(links: &[Link], i: usize) -> Vec<Link> {
    let mut chain = vec![links[i]];
    loop {
        match chain.last().expect("not empty").kind {
            Kind::Base => break,
            Kind::Delta {
                parent_no,
                parent_lsn,
            } => match links.iter().find(|l| l.no == parent_no) {
                Some(p) if p.info.lsn == parent_lsn => chain.push(*p),
                _ => return Vec::new(),
            },
        }
    }
    chain.reverse();
    chain
}

impl Writer {
    /// The replay position a checkpoint taken now would record.
    pub(super) fn position(&self) -> ReplayFrom {
        match &self.active {
            Some(a) => ReplayFrom {
                seg: a.seq,
                offset: a.len + self.buf.len() as u64,
            },
            None => ReplayFrom {
                seg: self.next_seq,
                offset: SEGMENT_HEADER_BYTES as u64,
            },
        }
    }

    /// Whether a checkpoint now would move the oldest retained one forward.
    pub(super) fn checkpoint_wanted(&self) -> bool {
        let n = self.checkpoints.len();
        n < 2 && self.next_lsn > 1
            || n >= 2 && self.checkpoints[n - 2].info.replay != self.position()
    }

    /// Whether the next checkpoint should be a base: there is no chain to
    /// extend, or its deltas add up to its base's size (so a base is
    /// rewritten after about as many changes as it lists: each change pays
    /// for its share of the rewrite once, whatever the depth), or the chain
    /// is at `CHECKPOINT_CHAIN_LINKS_MAX`.
    pub(super) fn base_due(&self) -> bool {
        let Some(i) = self.checkpoints.len().checked_sub(1) else {
            return true;
        };
        let chain = chain_of(&self.checkpoints, i);
        let Some(base) = chain.first() else {
            return true;
        };
        let deltas: u64 = chain[1..].iter().map(|l| l.bytes).sum();
        chain.len() >= CHECKPOINT_CHAIN_LINKS_MAX || deltas >= base.bytes
    }

    pub(super) fn housekeeping(&mut self) {
        if self.shared.poisoned.lock().is_some() {
            return;
        }
        let now = self.clock.now();
        let result = (|| {
            if self.dirty
                && self.cfg.sync == SyncMode::Interval
                && now >= self.last_sync + Duration::from_millis(self.cfg.sync_interval_ms)
            {
                self.sync()?;
            }
            if self
                .active
                .as_ref()
                .is_some_and(|a| a.len > SEGMENT_HEADER_BYTES as u64)
                && now >= self.last_write + Duration::from_millis(self.cfg.segment_idle_roll_ms)
            {
                self.seal()?;
            }
            if now >= self.last_write + Duration::from_millis(self.cfg.segment_idle_roll_ms) {
                self.release_idle_buffer();
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.poison(e);
            return;
        }
        let ckpt_due = self.journal_bytes_since_checkpoint >= self.cfg.checkpoint_journal_bytes
            || (self.checkpoint_wanted()
                && now
                    >= self.last_checkpoint
                        + Duration::from_millis(self.cfg.checkpoint_interval_ms));
        // A checkpoint still in flight when the next is due is waited for:
        // that keeps the journal since the older retained checkpoint within
        // 2 × checkpoint_journal_bytes (DURABILITY.md's space bound) even
        // when the helper thread is slow to be scheduled.
        let block = ckpt_due && self.checkpoint_in_flight.is_some();
        if let Err(e) = self.finish_checkpoint(block) {
            tracing::error!(group = self.group(), error = %e, "checkpoint failed; will retry");
        }
        if ckpt_due && self.checkpoint_in_flight.is_none() {
            if let Err(e) = self.start_checkpoint() {
                tracing::error!(group = self.group(), error = %e, "checkpoint failed; will retry");
                self.last_checkpoint = now;
            }
        }
        if !self.waiting_for_space()
            && self.compaction_candidate().is_some()
            && now >= self.last_compaction + Duration::from_millis(self.cfg.compaction_pause_ms)
        {
            if let Err(e) = self.compact_step(self.cfg.compaction_bytes_per_turn, u32::MAX) {
                tracing::error!(group = self.group(), error = %e, "compaction failed");
            }
            self.last_compaction = self.clock.now();
        }
    }

    /// Starts a checkpoint of the whole index at the current position. The
    /// journal is synced and the index snapshotted here; encoding, writing
    /// and fsyncing happen on a helper thread so commits are not held up.
    pub(super) fn start_checkpoint(&mut self) -> Result<(), StoreError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        if self.checkpoint_in_flight.is_some() {
            return Ok(());
        }
        // The journal the checkpoint points into must be durable first.
        if let Err(e) = self.write_buf().and_then(|()| self.sync()) {
            return Err(self.poison(e));
        }
        let info = CheckpointInfo {
            lsn: self.next_lsn - 1,
            replay: self.position(),
        };
        let facts = self.restart_facts(info.replay, info.lsn);
        let source = self.index_source(info, facts);
        self.note_live_at_checkpoint();
        let snapshot = matches!(source, IndexSource::Snapshot(_));
        let kind = match &source {
            IndexSource::Delta { parent, .. } => Kind::Delta {
                parent_no: parent.no,
                parent_lsn: parent.info.lsn,
            },
            _ => Kind::Base,
        };
        debug_assert_eq!(source.is_base(), kind == Kind::Base);
        if snapshot {
            self.shared
                .counters
                .checkpoint_snapshots
                .fetch_add(1, Ordering::Relaxed);
        }
        let no = self.next_checkpoint_no;
        self.next_checkpoint_no += 1;
        let (tx, rx) = mpsc::sync_channel(1);
        let storage = Arc::clone(&self.storage);
        let dir = self.shared.dir.clone();
        let (group, salt) = (self.group(), self.shared.salt);
        std::thread::Builder::new()
            .name(format!("berth-ckpt-{group}"))
            .spawn(move || {
                let result = build_checkpoint(storage.as_ref(), &dir, group, salt, source, info)
                    .and_then(|bytes| {
                        write_checkpoint(storage.as_ref(), &dir, no, &bytes)
                            .map(|()| bytes.len() as u64)
                    });
                if tx.send(result).is_err() {
                    tracing::debug!(group, no, "checkpoint finished after its writer stopped");
                }
            })
            .map_err(|e| StoreError::io("spawn checkpoint thread", &self.shared.dir, e))?;
        let link = Link {
            no,
            info,
            kind,
            bytes: 0,
        };
        self.checkpoint_in_flight = Some((link, rx, snapshot));
        self.last_checkpoint = self.clock.now();
        self.journal_bytes_since_checkpoint = 0;
        Ok(())
    }

    /// What the checkpoint at `to` is made from: a delta on the newest
    /// link, from the journal since it (no copy on this path); a base from
    /// the newest chain and the journal when [`Self::base_due`]; a
    /// snapshot when the journal cannot rebuild the index, or when it was
    /// drained since the last checkpoint and is small
    /// ([`Self::index_drained_since_checkpoint`]).
    pub(super) fn index_source(
        &self,
        to: CheckpointInfo,
        facts: Option<super::facts::Facts>,
    ) -> IndexSource {
        let snapshot = |w: &Self| IndexSource::Snapshot(w.shared.inner.lock().index.clone());
        if self.snapshot_next || self.index_drained_since_checkpoint() {
            return snapshot(self);
        }
        let chain = match self.checkpoints.len().checked_sub(1) {
            Some(i) => {
                let chain = chain_of(&self.checkpoints, i);
                if chain.is_empty() {
                    return snapshot(self);
                }
                chain
            }
            None => Vec::new(),
        };
        let from = chain.last().map_or(1, |l| l.info.replay.seg);
        let inner = self.shared.inner.lock();
        let mut segments = Vec::new();
        for seq in from..=to.replay.seg {
            let end = if seq == to.replay.seg {
                to.replay.offset
            } else if let Some(&len) = self.sealed.get(&seq) {
                len
            } else {
                drop(inner);
                return snapshot(self);
            };
            match inner.files.get(&seq) {
                Some(f) => segments.push((seq, Arc::clone(f), end)),
                // The position at the start of a segment not created yet.
                None if seq == to.replay.seg && end == SEGMENT_HEADER_BYTES as u64 => {}
                None => {
                    drop(inner);
                    return snapshot(self);
                }
            }
        }
        drop(inner);
        let (from, from_lsn) = chain_end(&chain);
        let tail = Tail {
            segments,
            facts: facts.and_then(|f| f.covering(from, from_lsn, to.lsn)),
        };
        match chain.last() {
            Some(&parent) if !self.base_due() => IndexSource::Delta { parent, tail },
            _ => IndexSource::Journal { chain, tail },
        }
    }

    /// Whether the index was drained since the last checkpoint: it now
    /// holds less than [`INDEX_DRAINED_FRACTION`] of the messages it held
    /// then and is small enough to copy on this path
    /// ([`INDEX_COPY_BYTES_MAX`]). A copy then costs less, in time and in
    /// memory, than a delta, which would list every removal (tens of MiB
    /// for a drained backlog of a million messages) to describe an index
    /// that is nearly empty.
    pub(super) fn index_drained_since_checkpoint(&self) -> bool {
        let inner = self.shared.inner.lock();
        let (live, bytes) = (inner.index.live_messages(), inner.index.heap_bytes());
        drop(inner);
        bytes <= INDEX_COPY_BYTES_MAX
            && live.saturating_mul(INDEX_DRAINED_FRACTION) < self.live_at_last_checkpoint
    }

    /// Remembers how many messages the index holds as a checkpoint starts.
    fn note_live_at_checkpoint(&mut self) {
        self.live_at_last_checkpoint = self.shared.inner.lock().index.live_messages();
    }

    /// Collects the checkpoint in flight, if it finished (or waiting for it
    /// with `block`): keeps it, drops the oldest beyond two, and deletes the
    /// segments that are no longer needed.
    pub(super) fn finish_checkpoint(&mut self, block: bool) -> Result<(), StoreError> {
        let Some((link, rx, snapshot)) = &self.checkpoint_in_flight else {
            return Ok(());
        };
        let result = if block {
            rx.recv().unwrap_or(Err(StoreError::Closed))
        } else {
            match rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => Err(StoreError::Closed),
            }
        };
        let (mut link, snapshot) = (*link, *snapshot);
        self.checkpoint_in_flight = None;
        let bytes = match result {
            Ok(bytes) => bytes,
            Err(e) => {
                // Whatever failed (the previous checkpoint unreadable, a
                // write), the next attempt does not depend on the journal
                // replaying.
                self.snapshot_next = true;
                return Err(e);
            }
        };
        link.bytes = bytes;
        let (no, info) = (link.no, link.info);
        if snapshot {
            self.snapshot_next = false;
        }
        self.checkpoints.push(link);
        // Its replay position may let older segments leave the cache.
        self.cache_check_due = true;
        self.shared
            .counters
            .checkpoints
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            group = self.group(),
            no,
            lsn = info.lsn,
            base = link.kind == Kind::Base,
            bytes,
            "checkpoint written"
        );
        // Kept: the chains of the two newest links (falling back to the
        // older one needs all of its chain), so everything from the base of
        // the second newest on.
        let keep_from = match self.checkpoints.len().checked_sub(2) {
            Some(i) => chain_of(&self.checkpoints, i)
                .first()
                .map_or(self.checkpoints[i].no, |b| b.no),
            None => 0,
        };
        while self.checkpoints.first().is_some_and(|l| l.no < keep_from) {
            let old = self.checkpoints.remove(0).no;
            let path = self.shared.dir.join(checkpoint::checkpoint_name(old));
            if let Err(e) = self.storage.remove(&path) {
                tracing::warn!(group = self.group(), file = %path.display(), error = %e, "could not remove old checkpoint");
            }
        }
        self.delete_dead_segments()
    }

    /// A checkpoint, start to finish (explicit requests and shutdown).
    pub(super) fn checkpoint(&mut self) -> Result<(), StoreError> {
        if let Err(e) = self.finish_checkpoint(true) {
            tracing::error!(group = self.group(), error = %e, "background checkpoint failed");
        }
        self.start_checkpoint()?;
        match self.finish_checkpoint(true) {
            // The journal did not replay (damaged since it was written):
            // the same checkpoint from a snapshot of the index instead.
            Err(e) if self.snapshot_next && self.shared.poisoned.lock().is_none() => {
                tracing::error!(group = self.group(), error = %e,
                    "checkpoint could not be rebuilt from the journal; writing it from a snapshot");
                self.start_checkpoint()?;
                self.finish_checkpoint(true)
            }
            other => other,
        }
    }
}
