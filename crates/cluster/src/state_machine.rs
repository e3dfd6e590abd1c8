//! The seam between Raft and what it replicates: openraft's state machine
//! calls [`Apply`] with each committed command, and snapshots are files
//! (`snapshot_file`) whose data [`Apply::capture`] writes, streamed to
//! followers chunk by chunk and restored from the file as a stream.
//!
//! Invariants:
//! - Commands reach [`Apply::apply`] in log order (commands gathered into
//!   one entry share its index, in the order they were proposed), each
//!   once per process life; after a restart they are applied again from the last
//!   snapshot on, and the application's state starts from that snapshot
//!   ([`Apply::restore`]) or, with none, from empty ([`Apply::start_empty`]),
//!   unless the application shows its own durable state holds the
//!   snapshot and replays what it already holds ([`Apply::resume`]).
//! - A snapshot is reported built or installed only once `raft.snapshot`
//!   holding it is durable: openraft may purge the log behind it.
//! - Building a snapshot does not hold up applying: only
//!   [`Apply::capture`] runs on the apply path; the data is written by a
//!   blocking thread of its own while later commands are applied.
//! - No snapshot is ever held whole in memory: it is written, sent,
//!   received, checked and restored through buffers of bounded size.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;

use crate::batch;
use crate::error::ClusterError;
use crate::snapshot_file::{self, Checked, Meta, INCOMING_FILE};
pub use crate::snapshot_file::{SnapshotSource, WriteSnapshot};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

/// What a cluster replicates, seen from the application's side.
pub trait Apply: Send + Sync + 'static {
    /// Applies one committed command (`index` is its Raft log index); it
    /// shares the entry's memory (a slice of it, not a copy).
    fn apply(&self, index: u64, command: Bytes);
    /// Called on the apply path, as of the last applied entry (`at`, its
    /// log index): takes what a snapshot of the state then needs, cheaply
    /// (no message bodies), and returns the job that writes the
    /// snapshot's data. The job runs on a thread of its own while later
    /// commands are applied; it may find that they removed what it
    /// captured, and must then leave it out (applying those commands
    /// again after the snapshot removes nothing more), but it must never
    /// write what was added after the capture.
    fn capture(&self, at: u64) -> WriteSnapshot;
    /// Replaces the application's state by a snapshot's, taken at log
    /// index `at`; `snapshot` may be read more than once, each time from
    /// its start.
    fn restore(&self, snapshot: &dyn SnapshotSource, at: u64);
    /// At a start with no snapshot: the log will be applied from its first
    /// entry, so the application starts from its empty state.
    fn start_empty(&self);
    /// At a start: the state must become the last snapshot's (or empty,
    /// with none), and every entry after it is then applied again. An
    /// application whose own state is durable may keep it instead, if it
    /// knows it holds at least the snapshot's, and skip the writes it
    /// already holds when the entries up to `from.log_last` come again.
    fn resume(&self, from: Resume<'_>) {
        match from.snapshot {
            Some((s, at)) => self.restore(s, at),
            None => self.start_empty(),
        }
    }

    /// A snapshot's data, taken now (as of log index `at`), in memory (for
    /// tests and tools: the replication path never holds a snapshot whole).
    fn snapshot_to_vec(&self, at: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        (self.capture(at))(&mut out)?;
        Ok(out)
    }
}

/// Where a node starts from (see [`Apply::resume`]).
pub struct Resume<'a> {
    /// The last snapshot and the log index it was taken at.
    pub snapshot: Option<(&'a dyn SnapshotSource, u64)>,
    /// The index of the last entry of this node's log (0 with none): no
    /// write of an entry after it can be in the application's state.
    pub log_last: u64,
    /// The log was found damaged, or is still catching up after that
    /// (probation): it may have lost entries the application applied, so
    /// `log_last` bounds nothing.
    pub log_damaged: bool,
}

pub(crate) struct StateMachine {
    app: Arc<dyn Apply>,
    dir: PathBuf,
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
    current: Arc<Mutex<Option<Checked>>>,
    snapshots_built: u64,
}

impl StateMachine {
    /// `log_last` and `log_damaged`: see [`Resume`].
    pub(crate) fn from_loaded(
        dir: &Path,
        app: Arc<dyn Apply>,
        log_last: Option<u64>,
        log_damaged: bool,
    ) -> Result<Self, ClusterError> {
        let loaded = snapshot_file::load(dir)?;
        let (last_applied, membership) = match &loaded {
            Some(s) => (s.meta.last_log_id, s.meta.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        app.resume(Resume {
            snapshot: loaded.as_ref().map(|s| {
                (
                    s as &dyn SnapshotSource,
                    s.meta.last_log_id.map_or(0, |l| l.index),
                )
            }),
            log_last: log_last.unwrap_or(0),
            log_damaged,
        });
        Ok(Self {
            app,
            dir: dir.to_path_buf(),
            last_applied,
            membership,
            current: Arc::new(Mutex::new(loaded)),
            snapshots_built: 0,
        })
    }
}

fn io_error(meta: &Meta, e: &io::Error, reading: bool) -> StorageError {
    let signature = Some(meta.signature());
    if reading {
        StorageIOError::read_snapshot(signature, e).into()
    } else {
        StorageIOError::write_snapshot(signature, e).into()
    }
}

async fn open(checked: &Checked) -> Result<Snapshot<TypeConfig>, StorageError> {
    let file = tokio::fs::File::open(&checked.path)
        .await
        .map_err(|e| io_error(&checked.meta, &e, true))?;
    Ok(Snapshot {
        meta: checked.meta.clone(),
        snapshot: Box::new(file),
    })
}

pub(crate) struct SnapshotBuilder {
    meta: Meta,
    /// Taken by the one build (a lock only so the builder is `Sync`).
    write: Mutex<Option<WriteSnapshot>>,
    dir: PathBuf,
    current: Arc<Mutex<Option<Checked>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let write = self.write.lock().take().ok_or_else(|| {
            io_error(
                &self.meta,
                &io::Error::other("a snapshot builder used twice"),
                false,
            )
        })?;
        let (dir, meta, current) = (self.dir.clone(), self.meta.clone(), self.current.clone());
        let started = std::time::Instant::now();
        let built = tokio::task::spawn_blocking(move || -> io::Result<Option<Checked>> {
            let file = snapshot_file::build(&dir, &meta, write)?;
            let checked = snapshot_file::check(&file).map_err(io::Error::other)?;
            snapshot_file::publish(&dir, &file, checked, &current)
        })
        .await
        .map_err(|e| io_error(&self.meta, &io::Error::other(e), false))?
        .map_err(|e| io_error(&self.meta, &e, false))?;
        // A newer snapshot was installed meanwhile: offer that one.
        let checked = match built {
            Some(c) => c,
            None => self.current.lock().clone().ok_or_else(|| {
                io_error(
                    &self.meta,
                    &io::Error::other("no snapshot is current"),
                    true,
                )
            })?,
        };
        tracing::info!(
            index = ?checked.meta.last_log_id.map(|l| l.index),
            bytes = std::fs::metadata(&checked.path).map_or(0, |m| m.len()),
            took = ?started.elapsed(),
            "snapshot built"
        );
        open(&checked).await
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
                    let bytes = command
                        .bytes()
                        .map_err(|e| StorageIOError::apply(entry.log_id, &e))?;
                    let commands = batch::decode(&bytes).map_err(|e| {
                        StorageIOError::apply(
                            entry.log_id,
                            &std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                        )
                    })?;
                    for c in commands {
                        self.app.apply(entry.log_id.index, bytes.slice_ref(c));
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
        let at = self.last_applied.map_or(0, |l| l.index);
        SnapshotBuilder {
            meta,
            write: Mutex::new(Some(self.app.capture(at))),
            dir: self.dir.clone(),
            current: self.current.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.dir.join(INCOMING_FILE);
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        snapshot
            .flush()
            .await
            .map_err(|e| io_error(meta, &e, false))?;
        let file = snapshot.into_std().await;
        let (dir, current, wanted) = (self.dir.clone(), self.current.clone(), meta.clone());
        let installed = tokio::task::spawn_blocking(move || -> io::Result<Option<Checked>> {
            file.sync_data()?;
            drop(file);
            let path = dir.join(INCOMING_FILE);
            let checked = snapshot_file::check(&path).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the snapshot received ({}) is damaged: {e}", path.display()),
                )
            })?;
            if checked.meta != wanted {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the snapshot received is {} where {} was announced",
                        checked.meta.snapshot_id, wanted.snapshot_id
                    ),
                ));
            }
            snapshot_file::publish(&dir, &path, checked, &current)
        })
        .await
        .map_err(|e| io_error(meta, &io::Error::other(e), false))?
        .map_err(|e| io_error(meta, &e, false))?;
        let Some(checked) = installed else {
            // This member holds a newer snapshot already: nothing to do.
            return Ok(());
        };
        self.app
            .restore(&checked, meta.last_log_id.map_or(0, |l| l.index));
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self.current.lock().clone();
        match current {
            Some(c) => open(&c).await.map(Some),
            None => Ok(None),
        }
    }
}
