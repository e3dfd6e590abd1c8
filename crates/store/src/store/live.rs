//! What the open store holds right now, listed: every metadata key with
//! its value and, per queue, the ids of its live messages. Replication
//! uses it to build a snapshot (with the bodies read back) and to make a
//! replica's store equal to a snapshot; it is not for the hot path: it
//! locks each group once and copies its lists.
//!
//! Invariants:
//! - The listing covers what the writers have applied when each group is
//!   locked; a caller that needs "everything requested before" flushes
//!   first ([`Store::flush`]).
//! - [`Store::read_within`] reads at most its byte bound (or one body,
//!   if the first is larger), judged by the index before anything is
//!   read: a copy of a backlog of large messages holds a few MB at a
//!   time, whatever their size.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::Store;
use crate::{MsgId, QueueId, StoreError};

/// The store's live state (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveState {
    pub metadata: BTreeMap<Bytes, Bytes>,
    /// Per queue, its live messages in id order.
    pub queues: BTreeMap<QueueId, Vec<MsgId>>,
    /// Per stream, the first offset kept and the offset after its newest
    /// record (its records are read with `Store::read_stream`).
    pub streams: BTreeMap<QueueId, (u64, u64)>,
}

impl Store {
    /// Lists every metadata key and every queue's live messages.
    #[must_use]
    pub fn live_state(&self) -> LiveState {
        let mut live = LiveState::default();
        for group in &self.groups {
            let inner = group.shared.inner.lock();
            for (k, v) in &inner.index.meta {
                live.metadata
                    .insert(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v));
            }
            for (q, st) in inner.index.streams() {
                if let Some(b) = st.bounds() {
                    live.streams.insert(q, b);
                }
            }
            for m in inner.index.iter_live() {
                for q in m.queues {
                    live.queues.entry(q).or_default().push(m.msg);
                }
            }
        }
        for msgs in live.queues.values_mut() {
            msgs.sort_unstable();
        }
        live
    }

    /// The bodies of the first of `msgs` (in `queue`) whose records hold
    /// at most `bytes_max` in all, at least one: as [`Store::read_many`]
    /// of that prefix, whose length is the answer's. A message not
    /// found counts for nothing and is answered `NotFound`.
    #[must_use]
    pub fn read_within(
        &self,
        queue: QueueId,
        msgs: &[MsgId],
        bytes_max: usize,
    ) -> Vec<Result<Bytes, StoreError>> {
        let take = {
            let group = &self.groups[self.group_of(queue) as usize];
            let inner = group.shared.inner.lock();
            let mut bytes = 0usize;
            msgs.iter()
                .take_while(|m| {
                    let len = inner.index.locate(queue, **m).map_or(0, |l| l.len as usize);
                    let first = bytes == 0;
                    bytes += len;
                    first || bytes <= bytes_max
                })
                .count()
        };
        self.read_many(queue, &msgs[..take])
    }
}
