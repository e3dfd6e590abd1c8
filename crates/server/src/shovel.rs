//! Shovels, as RabbitMQ's `rabbitmq_shovel` defines them: each one a
//! task that consumes from a source broker and publishes to a destination
//! broker over AMQP 0-9-1, restarted after a failure. Dynamic ones are
//! kept on disk with the definitions and started again with the broker;
//! static ones come from the config file at each start (docs/SHOVELS.md).
//!
//! [`definition`] checks a definition (pure), [`saved`] keeps them on
//! disk, [`link`] is one run of one shovel, [`status`] what the API shows;
//! this file is the set of shovels and the task that restarts each.
//!
//! Invariants:
//! - A change (put, delete, a shovel deleting itself) is on disk before
//!   the running set changes and before the API answers it.
//! - Static shovels are never written to `shovels.json`, and the API
//!   cannot replace, delete or restart one (its key has an empty vhost,
//!   which no vhost of the API has; each method also checks the kind).
//! - One task per shovel; a failing shovel waits and retries on its own
//!   and never delays another (each has its own connections and timers).
//! - A stopped shovel closes its connections, so what it had not
//!   acknowledged goes back to its source queue.

pub mod definition;
mod link;
pub mod saved;
pub mod status;
pub mod tls;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::limits::SHOVEL_RECONNECT_DELAY_MS_MAX;
use definition::{Definition, Kind};
use link::{Ended, Run, SharedStatus};
use saved::{Entry, SavedError};
use status::{State, Status};

type Key = (String, String);

/// A shovel that is running (or waiting to run again).
struct Running {
    def: Arc<Definition>,
    status: SharedStatus,
    /// Sending `true` (or dropping it) stops the shovel's task.
    stop: watch::Sender<bool>,
}

/// Every shovel of this broker.
pub struct Shovels {
    /// Where `shovels.json` lives (none: kept in memory only, for tests).
    dir: Option<PathBuf>,
    /// This node's name (`shovelled-by`, `node` in the status).
    node: String,
    /// The shovels, by vhost and name; file writes happen under this lock
    /// so the file and the map change in the same order.
    running: Mutex<BTreeMap<Key, Running>>,
    /// Itself, for the tasks (a shovel deletes itself when done).
    me: Weak<Shovels>,
}

/// A shovel as the API lists it.
pub struct Listed {
    pub def: Arc<Definition>,
    pub status: Status,
}

impl Shovels {
    /// Starts the static shovels of the config file (`statics`, already
    /// checked), then loads the saved dynamic shovels from `dir` and starts
    /// them. A saved definition this berth no longer accepts is logged and
    /// left out.
    pub fn start(
        dir: Option<PathBuf>,
        node: String,
        statics: Vec<Definition>,
    ) -> Result<Arc<Self>, SavedError> {
        let entries = match &dir {
            Some(d) => saved::load(d)?,
            None => Vec::new(),
        };
        let shovels = Arc::new_cyclic(|me| Shovels {
            dir,
            node,
            running: Mutex::default(),
            me: me.clone(),
        });
        let mut running = shovels.running.lock();
        for def in statics {
            debug_assert!(def.kind == Kind::Static && def.vhost.is_empty());
            let key = (def.vhost.clone(), def.name.clone());
            running.insert(key, shovels.spawn(def));
        }
        for e in entries {
            match definition::parse(&e.vhost, &e.name, &e.value) {
                Ok(def) => {
                    let key = (e.vhost, e.name);
                    running.insert(key, shovels.spawn(def));
                }
                Err(why) => tracing::error!(vhost = %e.vhost, shovel = %e.name,
                    "saved shovel not started: {}", why.trim()),
            }
        }
        if !running.is_empty() {
            tracing::info!(shovels = running.len(), "shovels started");
        }
        drop(running);
        Ok(shovels)
    }

    /// Adds or replaces a shovel; `true` when it is new. An unchanged
    /// definition keeps its running task (as RabbitMQ does).
    pub fn put(&self, def: Definition) -> Result<bool, SavedError> {
        assert!(
            def.kind == Kind::Dynamic,
            "only the API puts, and only dynamic shovels"
        );
        let mut running = self.running.lock();
        let key = (def.vhost.clone(), def.name.clone());
        let existed = running.get(&key).map(|r| r.def.value == def.value);
        if existed == Some(true) {
            return Ok(false);
        }
        let mut entries = entries_of(&running);
        entries.retain(|e| (e.vhost.as_str(), e.name.as_str()) != (&key.0[..], &key.1[..]));
        entries.push(Entry {
            vhost: def.vhost.clone(),
            name: def.name.clone(),
            value: def.value.clone(),
        });
        self.save(entries)?;
        if let Some(old) = running.remove(&key) {
            let _task_gone_already = old.stop.send(true);
        }
        running.insert(key, self.spawn(def));
        Ok(existed.is_none())
    }

    /// Deletes a dynamic shovel; `false` when there was none.
    pub fn delete(&self, vhost: &str, name: &str) -> Result<bool, SavedError> {
        let mut running = self.running.lock();
        let key = (vhost.to_owned(), name.to_owned());
        if !running
            .get(&key)
            .is_some_and(|r| r.def.kind == Kind::Dynamic)
        {
            return Ok(false);
        }
        let mut entries = entries_of(&running);
        entries.retain(|e| !(e.vhost == vhost && e.name == name));
        self.save(entries)?;
        if let Some(old) = running.remove(&key) {
            let _task_gone_already = old.stop.send(true);
        }
        Ok(true)
    }

    /// Stops a dynamic shovel and starts it again (its definition
    /// unchanged); `false` when there is none.
    pub fn restart(&self, vhost: &str, name: &str) -> bool {
        let mut running = self.running.lock();
        let key = (vhost.to_owned(), name.to_owned());
        if !running
            .get(&key)
            .is_some_and(|r| r.def.kind == Kind::Dynamic)
        {
            return false;
        }
        let Some(old) = running.remove(&key) else {
            return false;
        };
        let _task_gone_already = old.stop.send(true);
        let def = Definition::clone(&old.def);
        running.insert(key, self.spawn(def));
        true
    }

    /// A dynamic shovel's definition.
    pub fn get(&self, vhost: &str, name: &str) -> Option<Arc<Definition>> {
        let running = self.running.lock();
        let key = (vhost.to_owned(), name.to_owned());
        running
            .get(&key)
            .filter(|r| r.def.kind == Kind::Dynamic)
            .map(|r| Arc::clone(&r.def))
    }

    /// Every shovel (of `vhost` if given: dynamic ones only), sorted by
    /// vhost and name; the static ones (empty vhost) come first.
    pub fn list(&self, vhost: Option<&str>) -> Vec<Listed> {
        let running = self.running.lock();
        running
            .values()
            .filter(|r| vhost.is_none_or(|v| r.def.vhost == v))
            .map(|r| Listed {
                def: Arc::clone(&r.def),
                status: r.status.lock().clone(),
            })
            .collect()
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Stops every shovel's task (the broker stops); the definitions stay.
    pub fn stop_all(&self) {
        for r in self.running.lock().values() {
            let _task_gone_already = r.stop.send(true);
        }
    }

    fn save(&self, entries: Vec<Entry>) -> Result<(), SavedError> {
        match &self.dir {
            Some(d) => saved::save(d, entries),
            None => Ok(()),
        }
    }

    fn spawn(&self, def: Definition) -> Running {
        let def = Arc::new(def);
        let status = Arc::new(Mutex::new(Status::new(State::Starting)));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(supervise(
            self.me.clone(),
            Arc::clone(&def),
            Arc::clone(&status),
            stopped,
        ));
        Running { def, status, stop }
    }

    /// `src-delete-after` was reached: the shovel deletes itself, unless
    /// it was replaced meanwhile.
    fn finished(&self, def: &Arc<Definition>) {
        let same = {
            let running = self.running.lock();
            let key = (def.vhost.clone(), def.name.clone());
            running.get(&key).is_some_and(|r| Arc::ptr_eq(&r.def, def))
        };
        if !same {
            return;
        }
        if def.kind == Kind::Static {
            // Nothing on disk: it stops until the next start of berth
            // (which starts it again from the config file).
            tracing::info!(shovel = %def.name,
                "static shovel moved what delete_after asked for and stops");
            self.running
                .lock()
                .remove(&(def.vhost.clone(), def.name.clone()));
            return;
        }
        tracing::info!(vhost = %def.vhost, shovel = %def.name,
            "shovel moved what src-delete-after asked for and deletes itself");
        if let Err(e) = self.delete(&def.vhost, &def.name) {
            tracing::error!(vhost = %def.vhost, shovel = %def.name, error = %e,
                "a finished shovel could not be deleted from disk; it stays (and starts again after a restart)");
        }
    }
}

/// Reads the certificate files every `amqps://` URI of `def` names, so a
/// wrong path or a key that does not fit is refused when the shovel is
/// defined (a 400 naming the URI key and the parameter), not found at
/// its first connection.
pub fn check_files(def: &Definition) -> Result<(), String> {
    let ends = [("src-uri", &def.src_uris), ("dest-uri", &def.dest_uris)];
    for (key, uris) in ends {
        for uri in uris {
            if let Some(p) = tls::Params::of(key, uri)? {
                p.client_config(key)?;
            }
        }
    }
    Ok(())
}

fn entries_of(running: &BTreeMap<Key, Running>) -> Vec<Entry> {
    running
        .values()
        .filter(|r| r.def.kind == Kind::Dynamic)
        .map(|r| Entry {
            vhost: r.def.vhost.clone(),
            name: r.def.name.clone(),
            value: r.def.value.clone(),
        })
        .collect()
}

/// The wait before attempt `failures + 1`: `reconnect-delay`, doubled per
/// consecutive failure up to `SHOVEL_RECONNECT_DELAY_MS_MAX` (or
/// `reconnect-delay` if that is larger).
pub fn backoff_ms(reconnect_delay_ms: u64, failures: u32) -> u64 {
    let cap = SHOVEL_RECONNECT_DELAY_MS_MAX.max(reconnect_delay_ms);
    reconnect_delay_ms
        .saturating_mul(1u64 << failures.min(16))
        .min(cap)
}

/// Runs one shovel until it is stopped or done, waiting after each
/// failure.
async fn supervise(
    shovels: Weak<Shovels>,
    def: Arc<Definition>,
    status: SharedStatus,
    mut stop: watch::Receiver<bool>,
) {
    let node = shovels
        .upgrade()
        .map_or_else(String::new, |s| s.node.clone());
    let mut remaining = None;
    let mut failures = 0u32;
    let mut first_uri = 0usize;
    loop {
        status.lock().set(State::Starting);
        let ended = Run {
            def: &def,
            status: &status,
            stop: &mut stop,
            node: &node,
            first_uri,
            remaining: &mut remaining,
        }
        .run()
        .await;
        match ended {
            Ended::Stopped => return,
            Ended::Done => {
                if let Some(s) = shovels.upgrade() {
                    s.finished(&def);
                }
                return;
            }
            Ended::Failed(why) => {
                let mut st = status.lock();
                if matches!(st.state, State::Running { .. }) {
                    failures = 0;
                }
                st.set(State::Terminated {
                    reason: why.clone(),
                });
            }
        }
        if def.reconnect_delay_ms == 0 {
            tracing::warn!(vhost = %def.vhost, shovel = %def.name,
                "shovel terminated and not restarted (reconnect-delay is 0)");
            return;
        }
        let wait_ms = backoff_ms(def.reconnect_delay_ms, failures);
        if let State::Terminated { reason } = &status.lock().state {
            tracing::warn!(vhost = %def.vhost, shovel = %def.name, retry_in_ms = wait_ms,
                "shovel terminated: {reason}");
        }
        failures = failures.saturating_add(1);
        first_uri = first_uri.wrapping_add(1);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_delay_and_stops_at_the_cap() {
        assert_eq!(backoff_ms(1_000, 0), 1_000);
        assert_eq!(backoff_ms(1_000, 1), 2_000);
        assert_eq!(backoff_ms(1_000, 4), 16_000);
        assert_eq!(backoff_ms(1_000, 5), SHOVEL_RECONNECT_DELAY_MS_MAX);
        assert_eq!(backoff_ms(1_000, u32::MAX), SHOVEL_RECONNECT_DELAY_MS_MAX);
        // A delay above the cap is kept as given.
        assert_eq!(backoff_ms(60_000, 3), 60_000);
    }
}
