//! Step 2 of a reshape: copies the old store into staging directories laid
//! out for the new shape, then reopens the copy and checks it against the
//! old store.
//!
//! Invariants:
//! - The old store is only read: it is opened through an
//!   [`OverlayStorage`], so its recovery decides as at any start but
//!   whatever it repairs (a torn tail, a damaged range, an unfinished
//!   checkpoint) is repaired in memory, for the copy, never in its files.
//! - A message keeps its id; a message in several queues is written once
//!   per group of its queues, as a publish does.
//! - The copy's message id high-water mark is at least the old one's, so
//!   ids stay unique across the reshape.
//! - The copy has a new record salt, never 0: every record it holds was
//!   written afresh under it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use rand::Rng;

use super::{ReshapePlan, STAGING_DIR};
use crate::error::StoreError;
use crate::manifest::Manifest;
use crate::overlay::OverlayStorage;
use crate::storage::Storage;
use crate::store::{Recovered, Store, Ticket};
use crate::{MsgId, QueueId, StoreConfig, SyncMode};

/// Messages read and written per round (bounds the memory a copy holds).
const COPY_MESSAGES_PER_ROUND: usize = 256;

/// The old store's checkpoint interval and idle roll during a copy: a
/// week, i.e. never (its view is read, not written).
const OLD_STORE_IDLE_MS: u64 = 7 * 24 * 3_600 * 1_000;

/// A queue id the store reserves for a reshape: a message published to it
/// and removed at once carries the old store's message id high-water mark
/// into the copy when the newest messages were already acked.
pub const HIGH_WATER_QUEUE: QueueId = QueueId(u64::MAX - 1);

/// What the copy held.
#[derive(Debug, Clone, Default)]
pub struct CopyReport {
    pub queues: u64,
    pub messages: u64,
    pub payload_bytes: u64,
    pub metadata_keys: u64,
    /// Damaged ranges the old store's recovery found (their messages are
    /// not in the copy; their bytes stay in the old store).
    pub damaged_ranges: usize,
}

fn mismatch(what: String) -> StoreError {
    StoreError::Reshape(format!(
        "reshape aborted, the old store is untouched and in use: the copy does not match it ({what}); \
         this is a bug, please report it with the output of berth store scan"
    ))
}

/// Copies and verifies; on success the staging directories hold the new
/// store, closed.
pub fn copy_and_verify(
    plan: &ReshapePlan,
    base: &StoreConfig,
    storage: Arc<dyn Storage>,
) -> Result<CopyReport, StoreError> {
    let staging: Vec<PathBuf> = plan.new_dirs.iter().map(|d| d.join(STAGING_DIR)).collect();
    let dir_count = u32::try_from(staging.len())
        .map_err(|e| StoreError::Config(format!("too many data_dirs: {e}")))?;
    for dir in &staging {
        super::remove_staging(storage.as_ref(), dir)?;
    }
    crate::manifest::create_group_dirs(storage.as_ref(), &staging, plan.new_groups)?;
    // The copy is a new store: a new secret (a version-1 store's first),
    // under which the copy writes every record afresh. Drawn here, not in
    // the plan, so planning stays a pure function of what is on disk.
    let record_salt: u32 = rand::rng().random_range(1..=u32::MAX);
    for (i, dir) in staging.iter().enumerate() {
        let m = Manifest {
            group_count: plan.new_groups,
            dir_count,
            dir_index: u32::try_from(i).expect("checked"),
            store_id: plan.store_id,
            record_salt,
        };
        m.write(storage.as_ref(), dir)?;
    }
    let mut old_cfg = base.clone();
    old_cfg.data_dirs.clone_from(&plan.old_dirs);
    old_cfg.log_groups = plan.old_groups;
    // Nothing is written to the old store, so nothing to reclaim or
    // checkpoint in its view (which would only cost memory).
    old_cfg.compaction_live_percent_max = 0;
    old_cfg.checkpoint_journal_bytes = u64::MAX;
    old_cfg.checkpoint_interval_ms = OLD_STORE_IDLE_MS;
    old_cfg.segment_idle_roll_ms = OLD_STORE_IDLE_MS;
    old_cfg.segment_prepare = false;
    let view: Arc<dyn Storage> = Arc::new(OverlayStorage::new(Arc::clone(&storage)));
    let (old, old_rec) = Store::open_with(old_cfg, view)?;
    let mut new_cfg = base.clone();
    new_cfg.data_dirs.clone_from(&staging);
    new_cfg.log_groups = plan.new_groups;
    // One fdatasync per group at the end instead of one per batch.
    new_cfg.sync = SyncMode::Never;
    let (new, _) = Store::open_with(new_cfg.clone(), Arc::clone(&storage))?;

    let mut report = CopyReport {
        damaged_ranges: old_rec.damage.len(),
        ..CopyReport::default()
    };
    for (k, v) in &old_rec.metadata {
        new.put_meta(k.clone(), v.clone(), None);
        report.metadata_keys += 1;
    }
    let mut queues_of: BTreeMap<MsgId, Vec<QueueId>> = BTreeMap::new();
    for (q, msgs) in &old_rec.queues {
        for m in msgs {
            queues_of.entry(m.msg).or_default().push(*q);
        }
    }
    // Payload length of every message copied, checked on the reread copy.
    let mut copied: BTreeMap<MsgId, usize> = BTreeMap::new();
    for (q, msgs) in &old_rec.queues {
        report.queues += 1;
        for chunk in msgs.chunks(COPY_MESSAGES_PER_ROUND) {
            let ids: Vec<MsgId> = chunk.iter().map(|m| m.msg).collect();
            let mut tickets = Vec::new();
            for (id, payload) in ids.iter().zip(old.read_many(*q, &ids)) {
                if copied.contains_key(id) {
                    continue;
                }
                let payload = payload?;
                copied.insert(*id, payload.len());
                report.messages += 1;
                report.payload_bytes += payload.len() as u64;
                let (done, ticket) = Ticket::new();
                new.publish(*id, &queues_of[id], payload, Some(done));
                tickets.push(ticket);
            }
            for t in tickets {
                t.wait()?;
            }
        }
    }
    // Streams: every kept record, at its offset, in order.
    for (q, rs) in &old_rec.streams {
        report.queues += 1;
        if rs.first > 0 {
            new.trim(*q, rs.first, None);
        }
        let mut from = rs.first;
        loop {
            let batch = old.read_stream(*q, from, COPY_MESSAGES_PER_ROUND, 8 << 20)?;
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            let mut tickets = Vec::with_capacity(batch.len());
            for (offset, payload) in batch {
                report.messages += 1;
                report.payload_bytes += payload.len() as u64;
                let (done, ticket) = Ticket::new();
                new.append(*q, offset, payload, Some(done));
                tickets.push(ticket);
            }
            for t in tickets {
                t.wait()?;
            }
            from = last + 1;
        }
    }
    let hw = old_rec.next_msg_id.0 - 1;
    if copied.last_key_value().is_none_or(|(m, _)| m.0 < hw) && hw > 0 {
        let (done, ticket) = Ticket::new();
        new.publish(MsgId(hw), &[HIGH_WATER_QUEUE], Bytes::new(), Some(done));
        ticket.wait()?;
        new.purge(HIGH_WATER_QUEUE, None);
    }
    let (done, ticket) = Ticket::new();
    new.flush(done);
    ticket.wait()?;
    new.close()?;
    old.close()?;

    // Reopen the copy as the next start will, and compare.
    let (new, new_rec) = Store::open_with(new_cfg, Arc::clone(&storage))?;
    compare(&old_rec, &new_rec)?;
    for (q, msgs) in &new_rec.queues {
        for chunk in msgs.chunks(COPY_MESSAGES_PER_ROUND) {
            let ids: Vec<MsgId> = chunk.iter().map(|m| m.msg).collect();
            for (id, r) in ids.iter().zip(new.read_many(*q, &ids)) {
                let len = r?.len();
                if copied.get(id) != Some(&len) {
                    return Err(mismatch(format!(
                        "message {id} of queue {q}: {len} bytes in the copy, {:?} copied",
                        copied.get(id)
                    )));
                }
            }
        }
    }
    new.close()?;
    Ok(report)
}

fn compare(old: &Recovered, new: &Recovered) -> Result<(), StoreError> {
    let bounds = |r: &Recovered| -> Vec<(QueueId, u64, u64)> {
        r.streams
            .iter()
            .map(|(q, s)| (*q, s.first, s.end))
            .collect()
    };
    if bounds(old) != bounds(new) {
        return Err(mismatch(format!(
            "streams {:?} in the old store, {:?} in the copy",
            bounds(old),
            bounds(new)
        )));
    }
    if old.metadata != new.metadata {
        return Err(mismatch(format!(
            "{} metadata keys in the old store, {} in the copy",
            old.metadata.len(),
            new.metadata.len()
        )));
    }
    let old_q: Vec<_> = old.queues.keys().collect();
    let new_q: Vec<_> = new.queues.keys().collect();
    if old_q != new_q {
        return Err(mismatch(format!(
            "{} queues with messages in the old store, {} in the copy",
            old_q.len(),
            new_q.len()
        )));
    }
    for (q, msgs) in &old.queues {
        let copy = &new.queues[q];
        let same = msgs.len() == copy.len() && msgs.iter().zip(copy).all(|(a, b)| a.msg == b.msg);
        if !same {
            return Err(mismatch(format!(
                "queue {q}: {} messages in the old store, {} in the copy",
                msgs.len(),
                copy.len()
            )));
        }
    }
    if new.next_msg_id < old.next_msg_id {
        return Err(mismatch(format!(
            "next message id {} in the old store, {} in the copy",
            old.next_msg_id, new.next_msg_id
        )));
    }
    Ok(())
}
