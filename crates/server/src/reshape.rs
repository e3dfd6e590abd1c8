//! Startup side of a reshape: finishes or discards an interrupted one,
//! refuses a store whose shape differs from the configuration unless
//! `store.reshape` is on, and then checks free space before rewriting it.
//! The mechanics (and their crash safety) are in `berth_store::reshape`.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use berth_store::reshape::{self, Interrupted};
use berth_store::storage::OsStorage;
use berth_store::{StoreConfig, StoreError};

use crate::ServerError;

fn store_err(source: StoreError) -> ServerError {
    ServerError::Store { source }
}

/// Runs before the store opens; returns once the store on disk has the
/// configured shape (or is new).
pub fn apply(config: &crate::Config, sc: &StoreConfig) -> Result<(), ServerError> {
    let dirs = &config.store.data_dirs;
    match reshape::finish_interrupted(&OsStorage, dirs).map_err(store_err)? {
        Interrupted::None => {}
        Interrupted::Finished { old_kept } => tracing::warn!(
            old_kept = ?old_kept,
            "finished a reshape a crash interrupted after its commit: the new store is in use; the old one is kept aside (delete it when satisfied)"
        ),
        Interrupted::Discarded { staging } => tracing::warn!(
            staging = ?staging,
            "discarded a reshape a crash interrupted before its commit: the store as it was before is in use"
        ),
    }
    let wanted_groups = (config.store.log_groups > 0).then_some(config.store.log_groups);
    let Some(plan) = reshape::plan(&OsStorage, dirs, wanted_groups).map_err(store_err)? else {
        return Ok(());
    };
    if !config.store.reshape {
        return Err(store_err(StoreError::Reshape(format!(
            "the store's shape differs from the configuration: {}. Start with --reshape \
             (store.reshape = true) to do it, or configure the store's shape back",
            plan.describe()
        ))));
    }
    reshape::check_free_space(&plan, &crate::disk::free_bytes).map_err(store_err)?;
    tracing::info!(
        old_groups = plan.old_groups,
        new_groups = plan.new_groups,
        old_dirs = plan.old_dirs.len(),
        new_dirs = plan.new_dirs.len(),
        bytes_needed = plan.bytes_needed(),
        "reshaping the store"
    );
    let started = Instant::now();
    let now_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let r = reshape::run(&plan, sc, Arc::new(OsStorage), now_unix_s).map_err(store_err)?;
    if r.copy.damaged_ranges > 0 {
        tracing::warn!(
            damaged_ranges = r.copy.damaged_ranges,
            old_kept = ?r.old_kept,
            "the old store had damaged journal ranges: their messages are not in the new store; \
             the damaged bytes are still in the old store kept aside (berth store verify \
             --data-dir on it names them)"
        );
    }
    tracing::info!(
        queues = r.copy.queues,
        messages = r.copy.messages,
        payload_bytes = r.copy.payload_bytes,
        metadata_keys = r.copy.metadata_keys,
        ms = started.elapsed().as_millis(),
        old_kept = ?r.old_kept,
        "reshaped the store: copied, verified and switched; the old store is kept aside (delete it when satisfied)"
    );
    Ok(())
}
