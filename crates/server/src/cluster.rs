//! berth as a member of a replicated cluster (docs/CLUSTERING.md): the
//! leader serves every client, and every journal write of its broker is a
//! command in the Raft log ([`replicated`]), confirmed once a majority has
//! fdatasynced it; every member applies committed commands to its own
//! store ([`replica`]); a follower turns clients away naming the leader
//! ([`redirect`]; its HTTP side is `http::follower`); [`member`] opens the replica, starts
//! Raft and follows the member's role; each member reports its
//! [`alarms`] to the leader.
//!
//! Invariants:
//! - Nothing here runs unless `cluster.node_id` is set: a single node
//!   never touches Raft.

pub mod alarms;
pub mod command;
pub mod member;
pub mod peers;
pub mod redirect;
pub mod replica;
pub mod replicated;
pub mod view;

/// For the binary's log filter (`berth_cluster::log_noise`).
pub use berth_cluster::is_peer_retry_noise;
