//! Error values of the store. Every error that comes from the disk keeps its
//! cause (`#[source]`) and names the file it concerns.
//!
//! Invariants:
//! - No variant is produced by discarding an underlying error; the cause is
//!   either kept as `#[source]` or described in the message.
//! - `StoreError` is `Clone` (I/O causes are shared through `Arc`), because
//!   one failed fsync must be reported to every waiter of its batch.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong in the store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    /// The group saw a failed write or fsync earlier and refuses writes
    /// until the store is reopened (recovery decides what is on disk).
    #[error("log group {group} is poisoned and refuses writes")]
    Poisoned {
        group: u32,
        #[source]
        cause: Arc<StoreError>,
    },
    /// A write found the disk full (ENOSPC, EDQUOT) before it reached
    /// fdatasync. Its batch was taken back (nothing of it is on disk, no
    /// waiter of it succeeds), and the group refuses writes until a probe
    /// finds space again, every `retry_ms`; then it takes writes again by
    /// itself. Not a poisoning: no fsync failed.
    #[error(
        "log group {group} has no space left for this write (nothing of it was stored): \
         free space on the file system holding {} (or raise its quota); the group \
         checks every {retry_ms} ms and takes writes again by itself",
        dir.display()
    )]
    NoSpace {
        group: u32,
        dir: PathBuf,
        retry_ms: u64,
        #[source]
        cause: Arc<StoreError>,
    },
    /// A group's writer thread died (a bug: it panicked). Its group is
    /// poisoned; this is the cause every waiter sees.
    #[error("the writer thread of log group {group} died: {reason}")]
    WriterDied { group: u32, reason: String },
    /// Bytes on disk do not pass their checksum or do not parse.
    #[error("corrupt data in {path} at offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// Recovery met a case its decision table maps to `Fail`.
    #[error("recovery of group {group} stopped at {path} offset {offset}: {reason}")]
    Recovery {
        group: u32,
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The store was written by an unknown format version.
    #[error("{path} has format version {found}; this build reads version {expected}")]
    FormatVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    /// The message is not (or no longer) in the store.
    #[error("message {msg} not found in queue {queue}")]
    NotFound { queue: u64, msg: u64 },
    /// A request the store refuses as given.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Bad configuration.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A reshape (rewriting the store for another group count or set of
    /// data directories) is needed, refused, or failed; the message says
    /// what and what to do.
    #[error("{0}")]
    Reshape(String),
    /// The store is shutting down.
    #[error("store is closed")]
    Closed,
}

impl StoreError {
    /// Whether this is a `write` or `create` that found no space (ENOSPC)
    /// or no quota (EDQUOT) left: the one failure a group may take back
    /// and recover from. A failed fdatasync is never one, whatever its
    /// errno: after it, what the page cache holds is unknown.
    pub(crate) fn is_out_of_space(&self) -> bool {
        match self {
            StoreError::Io { op, source, .. } => {
                matches!(*op, "write" | "create")
                    && matches!(
                        source.kind(),
                        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                    )
            }
            _ => false,
        }
    }

    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}
