//! The shovel definitions on disk: one small JSON file beside the store,
//! `<data_dirs[0]>/shovels.json` (docs/FORMAT.md), read at startup and
//! replaced whole on every change.
//!
//! RabbitMQ keeps shovels with its other runtime parameters in its schema
//! database; berth keeps them in this file rather than in the journal's
//! metadata records, so a cluster does not replicate them yet (a cluster
//! member refuses shovels, docs/SHOVELS.md).
//!
//! Invariants:
//! - The file is replaced whole: written to a temporary file, fdatasynced,
//!   renamed over the old one and the directory synced, so a crash leaves
//!   the old or the new file, never a torn one.
//! - A change is on disk before the API answers it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const FILE_NAME: &str = "shovels.json";

/// The file's version this code writes and reads.
const VERSION: u32 = 1;

/// One shovel as stored: where it lives and its definition as given.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub vhost: String,
    pub name: String,
    pub value: Value,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    shovels: Vec<Entry>,
}

/// Why the file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a shovel file berth can read: {why}")]
    Parse { path: PathBuf, why: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The shovels saved in `dir` (none when there is no file yet).
pub fn load(dir: &Path) -> Result<Vec<Entry>, SavedError> {
    let path = dir.join(FILE_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SavedError::Read { path, source }),
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|e| SavedError::Parse {
        path: path.clone(),
        why: e.to_string(),
    })?;
    if file.version != VERSION {
        return Err(SavedError::Parse {
            path,
            why: format!("version {} (this berth reads {VERSION})", file.version),
        });
    }
    Ok(file.shovels)
}

/// Replaces the file in `dir` with `shovels`, durably.
pub fn save(dir: &Path, shovels: Vec<Entry>) -> Result<(), SavedError> {
    let path = dir.join(FILE_NAME);
    let file = File {
        version: VERSION,
        shovels,
    };
    let bytes = serde_json::to_vec_pretty(&file).expect("JSON values always encode");
    let write = || -> std::io::Result<()> {
        let tmp = dir.join(format!("{FILE_NAME}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    // A write waits for the disk: off the async reactor, as the journal's
    // metadata writes are.
    let r = tokio::runtime::Handle::try_current()
        .ok()
        .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
        .map_or_else(write, |_| tokio::task::block_in_place(write));
    r.map_err(|source| SavedError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_shovels_read_back_and_a_missing_file_is_none() {
        let dir = berth_testdir::TestDir::new("shovels-saved");
        assert!(load(dir.path()).unwrap().is_empty());
        let e = Entry {
            vhost: "/".into(),
            name: "s".into(),
            value: serde_json::json!({"src-uri": "amqp://h", "src-queue": "q"}),
        };
        save(dir.path(), vec![e.clone()]).unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![e]);
    }

    #[test]
    fn a_file_of_another_version_is_an_error_not_an_empty_list() {
        let dir = berth_testdir::TestDir::new("shovels-version");
        std::fs::write(
            dir.path().join(FILE_NAME),
            br#"{"version": 9, "shovels": []}"#,
        )
        .unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
    }
}
