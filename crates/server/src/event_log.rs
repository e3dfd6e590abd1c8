//! The wiring of the broker's lifecycle events to the store's per-group
//! event files, as the `[event_log]` section asks.
//!
//! The broker encodes events (it knows queues, vhosts, connections and
//! users); the store frames, stamps and writes them per log group. This
//! module joins the two: a [`berth_broker::durable::EventSink`] over
//! [`berth_events::writer::EventLog`], with the broker's clock.

use std::path::PathBuf;
use std::sync::Arc;

use berth_broker::clock::{Clock, SystemClock};
use berth_broker::durable::EventSink;
use berth_events::writer::{EventLog, EventLogConfig};

use crate::config::EventLogSection;

impl EventLogSection {
    /// The store's event log configuration for these groups' directories;
    /// also how the settings check the section (the store's rules name
    /// the keys).
    pub(crate) fn store_config(
        &self,
        group_dirs: Vec<PathBuf>,
        merged_dir: PathBuf,
    ) -> EventLogConfig {
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
