//! Errors a cluster node reports to its operator: each says what was wrong
//! and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot use the cluster directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the Raft log {path} is damaged at byte {offset} (a complete frame whose checksum does not \
         match): entries this node acknowledged may be lost, so it must not vote or lead. Remove \
         the node from the cluster (`berth cluster remove-node`), delete its cluster directory \
         and add it again so it catches up from the others"
    )]
    DamagedLog { path: PathBuf, offset: u64 },
    #[error("the file {path} does not decode ({detail}); it was written by another berth version or damaged")]
    Undecodable { path: PathBuf, detail: String },
    #[error("the cluster settings are invalid: {0}")]
    Config(String),
    #[error("the Raft engine refused to start: {0}")]
    Engine(String),
}
