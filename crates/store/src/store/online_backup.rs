//! A backup of the open store (`POST /api/berth/store/backup`, `berth
//! store backup --online`): the same copy as `berth store backup`, its cut
//! taken while the store runs.

use std::path::Path;

use super::Store;
use crate::backup::{self, BackupReport};
use crate::error::StoreError;
use crate::inspect::Layout;

impl Store {
    /// Backs the running store up into the empty or absent directory
    /// `out` (see [`crate::backup`]); publishers keep going.
    pub fn backup(
        &self,
        out: &Path,
        broker_version: &str,
        created_unix_s: u64,
        progress: &dyn Fn(u64),
    ) -> Result<BackupReport, StoreError> {
        let storage = self.storage.as_ref();
        let layout = Layout::open(storage, &self.data_dirs)?;
        backup::backup_with_cut(
            storage,
            &layout,
            out,
            broker_version,
            created_unix_s,
            progress,
            &|| backup::cut(storage, &layout),
        )
    }
}
