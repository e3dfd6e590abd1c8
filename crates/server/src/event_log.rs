//! The `[event_log]` section and the wiring of the broker's lifecycle
//! events to the store's per-group event files.
//!
//! The broker encodes events (it knows queues, vhosts, connections and
//! users); the store frames, stamps and writes them per log group. This
//! module joins the two: a [`berth_broker::durable::EventSink`] over
//! [`berth_store::event_log::EventLog`], with the broker's clock.

use std::path::PathBuf;
use std::sync::Arc;

use berth_broker::clock::{Clock, SystemClock};
use berth_broker::durable::EventSink;
use berth_store::event_log::{EventLog, EventLogConfig};
use serde::Deserialize;

use crate::config::ConfigError;

/// `[event_log]`: message lifecycle events (see docs/OPERATIONS.md,
/// "Event log"). Flags carry an `event-log-` prefix, as `[tls]`'s carry
/// `tls-` (`event_log.file_bytes_max` ↔ `--event-log-file-bytes-max`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventLogSection {
    /// Record lifecycle events. Off by default.
    pub enabled: bool,
    /// Merge the groups' events into one time-ordered combined log every
    /// this many seconds (0 = never).
    pub merge_interval_s: u64,
    /// A group's event file is sealed and a new one begun before it would
    /// exceed this.
    pub file_bytes_max: u64,
    /// Oldest event files of a group (and of the combined log) are removed
    /// while its files together exceed this.
    pub retained_bytes_max: u64,
    /// Event files last written longer ago than this are removed (0 = no
    /// age limit).
    pub retention_s: u64,
    /// Events not yet written, per group; past it events are dropped (and
    /// counted in the log) rather than slow a publisher down.
    pub buffer_bytes_max: u64,
}

impl Default for EventLogSection {
    fn default() -> Self {
        Self {
            enabled: false,
            merge_interval_s: 0,
            file_bytes_max: 16 * 1024 * 1024,
            retained_bytes_max: 256 * 1024 * 1024,
            retention_s: 7 * 24 * 3600,
            buffer_bytes_max: 4 * 1024 * 1024,
        }
    }
}

impl EventLogSection {
    fn store_config(&self, group_dirs: Vec<PathBuf>, merged_dir: PathBuf) -> EventLogConfig {
        EventLogConfig {
            group_dirs,
            merged_dir,
            file_bytes_max: self.file_bytes_max,
            retained_bytes_max: self.retained_bytes_max,
            retention_s: self.retention_s,
            buffer_bytes_max: usize::try_from(self.buffer_bytes_max).unwrap_or(usize::MAX),
            merge_interval_s: self.merge_interval_s,
        }
    }

    /// Checks the bounds (the store's rules, which name the keys).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = self.store_config(vec![PathBuf::new()], PathBuf::new());
        c.validate().map_err(|e| ConfigError::Invalid {
            key: "event_log",
            value: format!(
                "file_bytes_max={} retained_bytes_max={} buffer_bytes_max={}",
                self.file_bytes_max, self.retained_bytes_max, self.buffer_bytes_max
            ),
            why: e.to_string(),
        })
    }
}

/// The broker's events into the store's event log.
struct Sink(Arc<EventLog>);

impl EventSink for Sink {
    fn append(&self, key: u64, payload: &[u8]) {
        self.0.append(key, payload);
    }
}

/// Starts the event log if `event_log.enabled`: one writer per log group
/// (files beside the group's journal), the merge thread if asked, and
/// hands the broker its sink. Returns the log, to be closed at shutdown.
pub fn start(
    config: &crate::Config,
    groups: u32,
    broker: &berth_broker::Broker,
) -> Result<Option<Arc<EventLog>>, crate::ServerError> {
    let section = &config.event_log;
    if !section.enabled {
        return Ok(None);
    }
    let dirs = &config.store.data_dirs;
    let group_dirs = (0..groups)
        .map(|g| dirs[g as usize % dirs.len()].join(format!("group-{g:04}")))
        .collect();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let log = EventLog::open(
        section.store_config(group_dirs, dirs[0].clone()),
        Arc::new(move || clock.unix_time_us()),
    )
    .map_err(|source| crate::ServerError::Store { source })?;
    let log = Arc::new(log);
    broker.set_event_sink(Arc::new(Sink(Arc::clone(&log))));
    tracing::info!(
        groups,
        merge_interval_s = section.merge_interval_s,
        "event log on"
    );
    Ok(Some(log))
}
