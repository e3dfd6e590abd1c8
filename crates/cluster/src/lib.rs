//! berth-cluster: replication of berth's state across nodes with Raft.
//!
//! The consensus protocol is `openraft`'s (never a home-made one); this crate
//! supplies what openraft leaves to its user — the durable log and vote
//! ([`log_store`]), the state machine seam ([`Apply`]), and an authenticated
//! transport between nodes ([`transport`]) — and wraps them in one handle,
//! [`ClusterNode`], whose API has no openraft type in it, so that openraft's
//! version can move without touching the broker.
//!
//! Invariants:
//! - A log append is reported flushed to openraft only after the bytes were
//!   fdatasynced (openraft issue #2118): the report is made by the log's
//!   writer thread, after `sync_data` returned `Ok`.
//! - No fdatasync runs on a tokio worker thread: the log's file I/O is owned
//!   by one dedicated thread per log.
//! - An fdatasync or write error is never retried or ignored: it fails the
//!   log, openraft stops the node, and the node must be restarted (its
//!   durable state is then re-read from disk).
//! - No peer joins without proving knowledge of the cluster secret (HMAC
//!   challenge in both directions); the secret never crosses the wire.

mod batch;
mod error;
pub mod identity;
pub mod limits;
pub mod log_file;
mod log_frame;
mod log_noise;
mod log_reader;
pub mod log_segments;
pub mod log_store;
mod meeting;
mod node;
mod probation;
mod report;
mod report_collect;
pub mod snapshot_file;
mod standing;
mod state_machine;
mod status;
pub mod sync_gate;
pub mod transport;
mod types;
pub mod untrusted;

pub use error::ClusterError;
pub use log_noise::is_peer_retry_noise;
pub use node::{ClusterNode, NodeConfig, ProposeError, Reply, ReplyBatch};
pub use report::{LocalAlarms, MemberReport};
pub use state_machine::{Apply, Resume, SnapshotSource, WriteSnapshot};
pub use status::{ClusterStatus, MemberStatus, Role};
pub use sync_gate::SyncGate;
pub use tokio_rustls::rustls;
pub use transport::PeerTls;
pub use types::NodeId;
