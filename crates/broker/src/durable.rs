//! What the broker asks of durable storage, and how it encodes what it
//! stores there.
//!
//! The broker persists: durable exchanges, durable queues, bindings whose
//! both ends are durable, vhosts, users, permissions and policies (as
//! metadata commands, see [`crate::meta`]), and persistent messages routed
//! to durable queues (as journal records). [`Journal`] is the seam: the
//! server implements it over `berth-store`; tests use [`MemoryJournal`].
//!
//! One file per idea: the seam and its contract (`journal.rs`), its error
//! (`error.rs`), completions (`completion.rs`), the shared ids and
//! deferred removals (`durability.rs`), journals without a disk
//! (`memory.rs`), the message payload encoding (`payload.rs`), a delayed
//! message's (`delayed_payload.rs`), a delayed retry's count and wait
//! (`retry_mark.rs`).
//!
//! Invariants:
//! - A message's publish record is handed to the journal before the message
//!   is enqueued, so its removal (ack) can never be journaled before it.
//! - Metadata calls return only once the change is durable, so a
//!   `declare-ok` means the definition survives a crash; a metadata write
//!   that fails fails the operation.

mod completion;
mod delayed_payload;
mod durability;
mod error;
mod journal;
mod memory;
mod payload;
mod placement;
mod retry_mark;
mod stored_stream;

pub use completion::{all_of, complete, split_done, Done};
pub use delayed_payload::{decode_delayed, due_of, encode_delayed, DUE_BYTES};
pub use durability::{Durability, PAGING_BIT};
pub use error::JournalError;
pub use journal::{EventSink, Journal};
pub use memory::{MemoryJournal, MetaWrite, NoJournal};
pub use payload::{
    decode_message, encode_message, times_of, MessageHead, MessageParts, NameTooLong,
    StoredMessage, StoredTimes, MESSAGE_HEAD_BYTES_MAX, TIMES_BYTES,
};
pub use placement::Placement;
pub use retry_mark::{
    decode_retry_mark, encode_retry_mark, retry_id, retry_id_of, RetryMark, RETRY_BIT,
    RETRY_MARK_BYTES,
};
pub use stored_stream::StoredStream;

// The metadata key namespace lives with the metadata commands; these stay
// here for the store tools, which name queue ids by their definitions.
pub use crate::meta::{queue_id_of, split_key};
