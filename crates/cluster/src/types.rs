//! The openraft type configuration berth uses. Private to this crate: the
//! rest of berth sees [`crate::ClusterNode`] and plain bytes.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A node's identity inside Raft: a number, stable for the node's life,
/// chosen by the operator's peer list.
pub type NodeId = u64;

/// One replicated command: opaque bytes that the [`crate::Apply`]
/// implementation decodes (metadata commands, a gathered batch of records).
///
/// `Bytes`, so that the clones openraft makes of an entry it reads back
/// (to apply it, to send it to each follower) share the batch instead of
/// copying megabytes each time. Encoded as one byte string, as postcard
/// encodes a `Vec<u8>`: raft.log and the wire are unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(pub Bytes);

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command({} bytes)", self.0.len())
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
                openraft::EntryPayload::Normal(c) => c.0.len(),
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
        let new = postcard::to_allocvec(&Command(Bytes::from(bytes.clone()))).unwrap();
        assert_eq!(old, new);
        assert_eq!(
            postcard::from_bytes::<Command>(&old).unwrap(),
            Command(Bytes::from(bytes))
        );
    }
}
