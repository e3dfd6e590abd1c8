//! The disk free alarm (RabbitMQ's `disk_free_limit`): while the free
//! space on any data directory's filesystem is below
//! `limits.disk_free_bytes_min`, publishing connections are blocked
//! (`connection.blocked`, then not read), exactly as under the memory
//! alarm; they are read again once space returns.
//!
//! Invariants:
//! - The alarm only stops new publishes from being read: nothing already
//!   confirmed, stored or queued is touched, and consumers, acks and `get`
//!   keep working (they free space).
//! - A data directory whose free space cannot be measured counts as full
//!   (and is logged once per change), so a failing disk never looks
//!   healthy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::limits;

/// Whether the disk free alarm is on.
#[derive(Debug, Default)]
pub struct DiskAlarm {
    on: AtomicBool,
}

impl DiskAlarm {
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn set(&self, on: bool) -> bool {
        self.on.swap(on, Ordering::Relaxed) != on
    }
}

/// Bytes available to the broker (not root's reserve) on the filesystem
/// holding `dir`.
pub fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// The smallest free space over `dirs`, or why one could not be measured.
pub(crate) fn lowest_free_bytes(dirs: &[PathBuf]) -> Result<u64, (PathBuf, std::io::Error)> {
    let mut lowest = u64::MAX;
    for d in dirs {
        lowest = lowest.min(free_bytes(d).map_err(|e| (d.clone(), e))?);
    }
    Ok(lowest)
}

/// Measures the data directories every [`limits::DISK_CHECK_MS`] and sets
/// the alarm, until shutdown. `bytes_min = 0` turns the alarm off.
pub fn spawn_watch(
    alarm: Arc<DiskAlarm>,
    dirs: Vec<PathBuf>,
    bytes_min: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    if bytes_min == 0 {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::DISK_CHECK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => check(&alarm, &dirs, bytes_min),
                _ = shutdown.changed() => break,
            }
        }
    });
}

fn check(alarm: &DiskAlarm, dirs: &[PathBuf], bytes_min: u64) {
    match lowest_free_bytes(dirs) {
        Ok(free) => {
            let low = free < bytes_min;
            if alarm.set(low) {
                if low {
                    tracing::warn!(
                        free_bytes = free,
                        disk_free_bytes_min = bytes_min,
                        "disk free alarm: blocking publishers until space returns"
                    );
                } else {
                    tracing::info!(
                        free_bytes = free,
                        disk_free_bytes_min = bytes_min,
                        "disk free alarm cleared: publishers resume"
                    );
                }
            }
        }
        Err((dir, e)) => {
            if alarm.set(true) {
                tracing::error!(dir = %dir.display(), error = %e, "disk free alarm: cannot measure free space; blocking publishers");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_follows_free_space_and_a_missing_dir_counts_as_full() {
        let alarm = DiskAlarm::default();
        let here = vec![std::env::temp_dir()];
        check(&alarm, &here, 1);
        assert!(!alarm.is_on());
        check(&alarm, &here, u64::MAX);
        assert!(alarm.is_on());
        check(&alarm, &here, 1);
        assert!(!alarm.is_on());
        check(&alarm, &[PathBuf::from("/nonexistent/berth-disk-test")], 1);
        assert!(alarm.is_on());
    }
}
