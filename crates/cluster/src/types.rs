//! The openraft type configuration berth uses. Private to this crate: the
//! rest of berth sees [`crate::ClusterNode`] and plain bytes.

use std::fmt;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A node's identity inside Raft: a number, stable for the node's life,
/// chosen by the operator's peer list.
pub type NodeId = u64;

/// One replicated command: opaque bytes that the [`crate::Apply`]
/// implementation decodes (metadata commands, a gathered batch of records).
///
/// Held as `Bytes`, so that the clones openraft makes of an entry (to
/// apply it, to send it to each follower) share the batch instead of
/// copying megabytes each time; or, for a large entry read back from the
/// log's segments, as where its frame is ([`InLog`]), read again only
/// when it is applied or sent. openraft gathers whole ranges of entries
/// (a start applies the log since the last snapshot in one batch): with
/// the bodies left on disk, that batch holds log ids, not the log.
/// Encoded as one byte string, as postcard encodes a `Vec<u8>`: raft.log
/// and the wire are unchanged.
#[derive(Clone)]
pub struct Command(Body);

#[derive(Clone)]
enum Body {
    Held(Bytes),
    InLog(Arc<InLog>),
}

/// A large entry left in the log's segment: the file (a handle, so a
/// purge or cut that removes the segment meanwhile does not take it
/// away), where its frame is, and the log id it must decode to.
pub(crate) struct InLog {
    pub(crate) file: Arc<std::fs::File>,
    pub(crate) path: std::path::PathBuf,
    /// Offset of its frame in `file`.
    pub(crate) at: u64,
    pub(crate) frame_len: usize,
    pub(crate) log_id: LogId,
}

impl Command {
    pub fn new(bytes: Bytes) -> Self {
        Self(Body::Held(bytes))
    }

    pub(crate) fn in_log(at: InLog) -> Self {
        Self(Body::InLog(Arc::new(at)))
    }

    /// The command's bytes, read from the log's segment if they were left
    /// there (the frame checked against its CRC and its log id).
    pub fn bytes(&self) -> io::Result<Bytes> {
        match &self.0 {
            Body::Held(b) => Ok(b.clone()),
            Body::InLog(at) => {
                let payload =
                    crate::log_frame::read_frame_payload(&at.file, &at.path, at.at, at.frame_len)?;
                let entry: Entry = postcard::from_bytes(&payload).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "Raft log entry at offset {} of {}: does not decode: {e}",
                            at.at,
                            at.path.display()
                        ),
                    )
                })?;
                match entry.payload {
                    openraft::EntryPayload::Normal(Command(Body::Held(b)))
                        if entry.log_id == at.log_id =>
                    {
                        Ok(b)
                    }
                    _ => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the Raft log frame at offset {} of {} no longer holds entry {}                              (the segment changed under a reader)",
                            at.at,
                            at.path.display(),
                            at.log_id
                        ),
                    )),
                }
            }
        }
    }

    /// Encoded size: its bytes, or its frame's length if left on disk.
    pub(crate) fn len(&self) -> usize {
        match &self.0 {
            Body::Held(b) => b.len(),
            Body::InLog(at) => at.frame_len,
        }
    }

    /// Bytes this command holds in memory.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        match &self.0 {
            Body::Held(b) => b.len(),
            Body::InLog(_) => 0,
        }
    }
}

impl Serialize for Command {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.bytes().map_err(serde::ser::Error::custom)?;
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Bytes::deserialize(d).map(Command::new)
    }
}

impl PartialEq for Command {
    fn eq(&self, other: &Self) -> bool {
        match (self.bytes(), other.bytes()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Command {}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Body::Held(b) => write!(f, "command({} bytes)", b.len()),
            Body::InLog(at) => write!(f, "command(in the log, frame of {} bytes)", at.frame_len),
        }
    }
}

openraft::declare_raft_types!(
    /// berth's Raft types: opaque commands, numeric node ids, nodes known by
    /// their peer address, snapshots as files (`snapshot_file`).
    pub TypeConfig:
        D = Command,
        R = (),
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Raft = openraft::Raft<TypeConfig>;

/// How many of `entries`, from the first, fit in about `target` encoded
/// bytes; at least one (a large entry goes alone).
pub(crate) fn entries_within<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    target: usize,
) -> (usize, usize) {
    /// Room for an entry's log id and framing, and for a membership.
    const OVERHEAD: usize = 64;
    const MEMBERSHIP: usize = 1024;
    let mut size = OVERHEAD;
    let mut count = 0;
    for (n, e) in entries.into_iter().enumerate() {
        let next = size
            + OVERHEAD
            + match &e.payload {
                openraft::EntryPayload::Normal(c) => c.len(),
                openraft::EntryPayload::Membership(_) => MEMBERSHIP,
                openraft::EntryPayload::Blank => 0,
            };
        if next > target && n > 0 {
            return (n, size);
        }
        size = next;
        count = n + 1;
    }
    (count, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_encodes_as_the_byte_list_it_always_was() {
        // raft.log written before commands were encoded as one byte string
        // must still read: postcard writes both the same way.
        let bytes: Vec<u8> = (0..=255).chain(0..=255).collect();
        let old = postcard::to_allocvec(&bytes).unwrap();
        let new = postcard::to_allocvec(&Command::new(Bytes::from(bytes.clone()))).unwrap();
        assert_eq!(old, new);
        assert_eq!(
            postcard::from_bytes::<Command>(&old).unwrap(),
            Command::new(Bytes::from(bytes))
        );
    }
}
