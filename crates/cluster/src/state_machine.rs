//! The seam between Raft and what it replicates: openraft's state machine
//! calls [`Apply`] with each committed command, and snapshots are whatever
//! [`Apply::snapshot`] returns, kept durable in `raft.snapshot`.
//!
//! Invariants:
//! - Commands reach [`Apply::apply`] in log order (commands gathered into
//!   one entry share its index, in the order they were proposed), each
//!   once per process life; after a restart they are applied again from the last
//!   snapshot on, and the application's state starts from that snapshot
//!   ([`Apply::restore`]) or, with none, from empty ([`Apply::start_empty`]).
//! - A snapshot is reported built or installed only once `raft.snapshot`
//!   holding it is durable: openraft may purge the log behind it.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::batch;
use crate::error::ClusterError;
use crate::log_file::{Loaded, Writer, SNAPSHOT_FILE};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

/// What a cluster replicates, seen from the application's side.
pub trait Apply: Send + Sync + 'static {
    /// Applies one committed command (`index` is its Raft log index); it
    /// shares the entry's memory (a slice of it, not a copy).
    fn apply(&self, index: u64, command: Bytes);
    /// The application's whole state, as of the last applied command.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the application's state by a snapshot's.
    fn restore(&self, snapshot: &[u8]);
    /// At a start with no snapshot: the log will be applied from its first
    /// entry, so the application starts from its empty state.
    fn start_empty(&self);
}

#[derive(Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

pub(crate) struct StateMachine {
    app: Arc<dyn Apply>,
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    writer: Writer,
    snapshots_built: u64,
}

impl StateMachine {
    pub(crate) fn from_loaded(
        dir: &Path,
        loaded: &Loaded,
        writer: Writer,
        app: Arc<dyn Apply>,
    ) -> Result<Self, ClusterError> {
        let stored: Option<StoredSnapshot> = loaded
            .snapshot
            .as_deref()
            .map(postcard::from_bytes)
            .transpose()
            .map_err(|e| ClusterError::Undecodable {
                path: dir.join(SNAPSHOT_FILE),
                detail: e.to_string(),
            })?;
        let (last_applied, membership) = match &stored {
            Some(s) => {
                app.restore(&s.data);
                (s.meta.last_log_id, s.meta.last_membership.clone())
            }
            None => {
                app.start_empty();
                (None, StoredMembership::default())
            }
        };
        Ok(Self {
            app,
            last_applied,
            membership,
            current: Arc::new(Mutex::new(stored)),
            writer,
            snapshots_built: 0,
        })
    }
}

/// Writes `raft.snapshot` and waits until it is durable.
async fn persist(writer: &Writer, stored: &StoredSnapshot) -> Result<(), StorageError> {
    let signature = Some(stored.meta.signature());
    let payload = postcard::to_allocvec(stored)
        .map_err(|e| StorageIOError::write_snapshot(signature.clone(), &e))?;
    let (tx, rx) = oneshot::channel();
    writer.replace(
        SNAPSHOT_FILE,
        &payload,
        Box::new(move |r| {
            let _ = tx.send(r); // a dropped waiter only means shutdown
        }),
    );
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the Raft log writer has stopped")))
        .map_err(|e| StorageIOError::write_snapshot(signature, &e).into())
}

fn to_snapshot(s: StoredSnapshot) -> Snapshot<TypeConfig> {
    Snapshot {
        meta: s.meta,
        snapshot: Box::new(Cursor::new(s.data)),
    }
}

pub(crate) struct SnapshotBuilder {
    stored: StoredSnapshot,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    writer: Writer,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        persist(&self.writer, &self.stored).await?;
        *self.current.lock() = Some(self.stored.clone());
        Ok(to_snapshot(self.stored.clone()))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => {
                    let commands = batch::decode(&command.0).map_err(|e| {
                        StorageIOError::apply(
                            entry.log_id,
                            &std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                        )
                    })?;
                    for c in commands {
                        self.app.apply(entry.log_id.index, command.0.slice_ref(c));
                    }
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m)
                }
            }
            replies.push(());
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        let id = match self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.snapshots_built),
            None => format!("none-{}", self.snapshots_built),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: id,
        };
        SnapshotBuilder {
            stored: StoredSnapshot {
                meta,
                data: self.app.snapshot(),
            },
            current: self.current.clone(),
            writer: self.writer.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        persist(&self.writer, &stored).await?;
        self.app.restore(&stored.data);
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        *self.current.lock() = Some(stored);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.current.lock().clone().map(to_snapshot))
    }
}
