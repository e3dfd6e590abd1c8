//! A backup of the open store (`POST /api/berth/store/backup`, `berth
//! store backup --online`): the same copy as `berth store backup`, its cut
//! taken while every group's writer is paused, so the cut is one instant
//! for the whole store.
//!
//! Invariants:
//! - The cut (every group's files listed, opened and measured) is taken
//!   only while every writer is paused ([`CutBarrier`]): a message moved
//!   between groups (its copy durable in one before its Remove is written
//!   in the other) is in the backup in at least one of them.
//! - Writers are paused for the cut only, not for the copy: the handles
//!   opened at the cut stay readable however the files change afterwards.

use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::backup::{self, BackupReport, CutFile};
use crate::error::StoreError;
use crate::inspect::Layout;
use crate::writer::pause::{CutBarrier, ReleaseOnDrop};
use crate::writer::Cmd;

impl Store {
    /// Backs the running store up into the empty or absent directory
    /// `out` (see [`crate::backup`]); publishers keep going, except for
    /// the cut itself (reported as [`BackupReport::pause`]).
    pub fn backup(
        &self,
        out: &Path,
        broker_version: &str,
        created_unix_s: u64,
        progress: &dyn Fn(u64),
    ) -> Result<BackupReport, StoreError> {
        let storage = self.storage.as_ref();
        let layout = Layout::open(storage, &self.data_dirs)?;
        let pause = Cell::new(None);
        let mut report = backup::backup_with_cut(
            storage,
            &layout,
            out,
            broker_version,
            created_unix_s,
            progress,
            &|| {
                let (files, held) = self.cut_paused(&layout)?;
                pause.set(Some(held));
                Ok(files)
            },
        )?;
        report.pause = pause.get();
        Ok(report)
    }

    /// Pauses every group's writer, takes the cut, lets them go; returns
    /// the cut and how long the first writer to pause was held.
    fn cut_paused(&self, layout: &Layout) -> Result<(Vec<CutFile>, Duration), StoreError> {
        let barrier = Arc::new(CutBarrier::new(self.group_count()));
        let release = ReleaseOnDrop(&barrier);
        for g in &self.groups {
            if let Some(e) = g.shared.poison_error() {
                return Err(e);
            }
            if g.tx.send(Cmd::Pause(Arc::clone(&barrier))).is_err() {
                return Err(StoreError::Closed);
            }
        }
        barrier.wait_all_paused()?;
        let files = backup::cut(self.storage.as_ref(), layout)?;
        let held = barrier.release();
        drop(release);
        barrier.check_held()?;
        tracing::info!(
            groups = self.group_count(),
            files = files.len(),
            pause_us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX),
            "backup cut taken with every log group paused"
        );
        Ok((files, held))
    }
}
