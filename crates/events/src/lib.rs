//! The event log (`[event_log]`, docs/OPERATIONS.md): what happened to
//! which message in which queue, kept in per-log-group files beside the
//! store's, read back by `berth events`. It is not part of the store's
//! log: no message depends on it, and the store does not know it exists.
//!
//! - [`file`]: the event file format and its readers, the k-way merge of
//!   several groups' files into one time order.
//! - [`writer`]: one thread per log group appending that group's events,
//!   rotating and retiring files by size and age; the optional merger.
//!
//! Its files go through the store's storage seam
//! ([`berth_store::storage::Storage`]), so tests can inject faults as
//! they do for the store.

pub mod file;
pub mod writer;

/// How long a group's event writer, woken by the first pending event,
/// gathers more before it writes (unless half its buffer fills first).
/// Events are not a promise to any client, so this delays nothing a
/// client waits for; it turns one `write(2)` and one thread wake-up per
/// event into one per batch at low concurrency.
pub const EVENT_GATHER_MS: u64 = 10;
