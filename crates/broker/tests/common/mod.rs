//! What the broker's integration tests share: a restart from what a
//! `MemoryJournal` holds, as the real store would give it back.
#![allow(dead_code)] // each test binary uses part of it

use std::sync::Arc;
use std::time::Instant;

use berth_broker::durable::MemoryJournal;
use berth_broker::{Broker, Recovered, RestoreReport, StoredBody};

/// How a restart hands back each stored message's body.
#[derive(Clone, Copy, Debug)]
pub enum Bodies {
    /// The payload itself (as the journal hands back one it has read).
    InMemory,
    /// Its size only, the body left on disk (what a restart of the real
    /// store gives).
    OnDisk,
}

/// What `j` gives back after a restart: definitions, streams, and the
/// messages of every queue that has any (a store keeps no entry for a
/// queue without messages).
pub fn recovered(j: &MemoryJournal, bodies: Bodies) -> Recovered {
    let lists = j.messages.lock();
    let lists = lists.iter().filter(|(_, m)| !m.is_empty());
    // On disk, a queue's messages come back as a store gives them: ids
    // and sizes only (`Recovered::paged`).
    let size = |p: &bytes::Bytes| u32::try_from(p.len()).expect("a test payload fits in u32");
    let (messages, paged) = match bodies {
        Bodies::InMemory => (
            lists
                .map(|(q, m)| {
                    let list = m
                        .iter()
                        .map(|(id, p)| (*id, StoredBody::Payload(p.clone())));
                    (*q, list.collect())
                })
                .collect(),
            Default::default(),
        ),
        Bodies::OnDisk => (
            Default::default(),
            lists
                .map(|(q, m)| (*q, m.iter().map(|(id, p)| (*id, size(p))).collect()))
                .collect(),
        ),
    };
    Recovered {
        streams: j.stored_streams(),
        meta: j
            .meta
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        messages,
        paged,
    }
}

/// "Crash": a new broker over `journal`, restored from what it holds with
/// the ids a restart would pick, and its restore report.
pub fn restart(
    journal: &Arc<MemoryJournal>,
    bodies: Bodies,
    now: Instant,
) -> (Arc<Broker>, RestoreReport) {
    let r = recovered(journal, bodies);
    let (next_msg, next_queue) = r.next_ids();
    let broker = Broker::with_journal(["/"], journal.clone(), next_msg, next_queue);
    let report = broker.restore(r, now);
    (broker, report)
}
