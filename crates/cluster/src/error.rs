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
    #[error("the file {path} does not decode ({detail}); it was written by another berth version or damaged")]
    Undecodable { path: PathBuf, detail: String },
    #[error("the cluster settings are invalid: {0}")]
    Config(String),
    #[error("the Raft engine refused to start: {0}")]
    Engine(String),
}
