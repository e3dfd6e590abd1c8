//! berth-store: the durable log under berth's queues. It knows nothing of
//! AMQP: it stores opaque message payloads for opaque queue ids, opaque
//! metadata blobs, and gives them back after a restart.
//!
//! See docs/FORMAT.md for every byte on disk and docs/DURABILITY.md for what
//! a completion promises.
//!
//! Invariants:
//! - All file I/O goes through [`storage::Storage`].
//! - A group's state is a deterministic function of its checkpoint and its
//!   journal: nothing else is needed to rebuild it (ready for replication).
//! - Each queue belongs to exactly one group, a pure function of its id and
//!   the group count recorded in the manifest ([`group_of`]).

pub mod advice;
pub mod append_buf;
pub mod backup;
pub mod checkpoint;
pub mod clock;
pub mod completion;
pub mod decision;
#[cfg(target_os = "linux")]
mod direct;
pub mod error;
/// Test doubles (a fault-injecting storage): tests only, `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod group_reader;
pub mod histogram;
/// Test doubles (a storage whose files tests watch): `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub mod hooked;
pub mod index;
pub mod inspect;
pub mod limits;
mod loc;
pub mod manifest;
pub mod overlay;
pub mod payload;
pub mod record;
pub mod recovery;
mod report;
pub mod reshape;
pub mod segment;
pub mod storage;
mod store;
pub mod stream_index;
mod writer;

pub use error::StoreError;
pub use limits::{StoreConfig, SyncMode, PAYLOAD_BYTES_MAX};
pub use payload::Payload;
pub use report::DamageReport;
pub use store::{
    GroupStats, LiveState, Recovered, RecoveredMessage, RecoveredStream, RecoveryStats, Store,
    Ticket,
};
pub use writer::Done;

use std::fmt;

/// A queue, as the caller names it. Chosen by the caller (the broker keeps
/// the name → id mapping in its metadata); `u64::MAX` is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u64);

/// A message. Allocated by [`Store::next_msg_id`]-style counters so that ids
/// grow in publish order and are never reused across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u64);

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

impl fmt::Display for MsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}", self.0)
    }
}

/// The group a queue lives in: splitmix64 of the id, modulo the group count.
/// Mixing first spreads sequential and hashed ids alike. Persistent
/// semantics: changing this function breaks existing stores.
pub fn group_of(queue: QueueId, groups: u32) -> u32 {
    let mut z = queue.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    u32::try_from(z % u64::from(groups)).expect("below a u32")
}
