//! One table of every setting berth has: its `berth.toml` key, its flag,
//! its type and where it lives in [`Config`], its default with the unit,
//! its check and one line of doc. The embedded defaults
//! ([`Config::default`]), the reading of `berth.toml`
//! ([`Config::from_toml`]), the `BERTH_*` environment variables
//! ([`env::apply`]), the checks ([`Config::validate`]), the flags of
//! `berth serve` (built by the cli from [`all`]) and the settings part of
//! docs/CONFIG.md (rendered by [`docs::markdown`]) all come from it: adding
//! a setting is one entry here and the code that uses its field. The
//! file's static shovels (`[shovels.NAME]`) are not settings (no flag, no
//! default): [`shovels`] reads them, beside the table.
//!
//! Naming rule (documented in docs/CONFIG.md): every key `section.key_name`
//! has the flag `--key-name` (underscores become dashes, the section is not
//! part of the flag; key names are unique across sections). A list key named
//! in the plural takes a repeatable flag named in the singular:
//! `store.data_dirs` ↔ `--data-dir DIR --data-dir DIR2` (the plural is an
//! alias). `[tls]`, `[event_log]` and `[cluster]` flags keep their section
//! as a prefix (`--tls-cert-file`, `--cluster-node-id`).
//! Units are the last word of a name (`heartbeat_s`, `frame_size_bytes_max`).
//!
//! Invariants:
//! - Keys and flags are unique (tested), and every key's section is one of
//!   [`SECTIONS`].
//! - The committed docs/CONFIG.md shows exactly this table (tested).
//! - Checks that involve two settings are in [`check_together`]; every
//!   other check is on its setting's entry.

mod cluster;
mod docs;
pub mod env;
mod file;
mod limits;
mod net;
pub mod shovels;
pub mod slot;
mod store;
pub mod value;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::config::{Auth, Cluster, Config, ConfigError, EventLogSection, Limits, Log};
use crate::config::{Management, Net, Store, Tls};
pub use docs::markdown;
use slot::Slot;

/// One setting: everything about it that is not the code that uses it.
pub struct Setting {
    /// `section.key_name`, as written in `berth.toml`.
    pub key: &'static str,
    /// The flag of `berth serve`, without its leading dashes.
    pub flag: &'static str,
    /// What the flag's value is, in `--help` and the docs (`BYTES`,
    /// `ADDR:PORT`); empty for a switch, which takes none.
    pub value_name: &'static str,
    /// What the default means, after its value in the docs (`64 MiB`,
    /// `off`); empty if the value says it all.
    pub default_note: &'static str,
    /// One line of doc: docs/CONFIG.md's meaning column and `--help`.
    pub doc: &'static str,
    /// Its field in [`Config`], its type, default and check.
    pub slot: &'static dyn Slot,
}

impl Setting {
    /// The `[section]` it is written under in `berth.toml`.
    pub fn section(&self) -> &'static str {
        self.key.split_once('.').map_or(self.key, |(s, _)| s)
    }

    /// Its name within the section.
    pub fn name(&self) -> &'static str {
        self.key.split_once('.').map_or(self.key, |(_, n)| n)
    }
}

/// The sections of `berth.toml`, in the order the docs list them.
pub const SECTIONS: &[&str] = &[
    "net",
    "management",
    "store",
    "limits",
    "auth",
    "tls",
    "event_log",
    "cluster",
    "log",
];

/// Every setting, section by section in the order of [`SECTIONS`].
pub fn all() -> impl Iterator<Item = &'static Setting> {
    [
        net::NET,
        net::MANAGEMENT,
        store::STORE,
        limits::LIMITS,
        limits::AUTH,
        net::TLS,
        store::EVENT_LOG,
        cluster::CLUSTER,
        limits::LOG,
    ]
    .into_iter()
    .flatten()
}

/// The setting written `key` (`section.key_name`).
pub fn find(key: &str) -> Option<&'static Setting> {
    all().find(|s| s.key == key)
}

impl Default for Config {
    /// The embedded configuration: every setting at its table default.
    fn default() -> Self {
        let mut config = Config {
            net: Net::default(),
            store: Store::default(),
            limits: Limits::default(),
            auth: Auth::default(),
            tls: Tls::default(),
            log: Log::default(),
            management: Management::default(),
            event_log: EventLogSection::default(),
            cluster: Cluster::default(),
            shovels: Vec::new(),
        };
        for setting in all() {
            setting.slot.set_default(&mut config);
        }
        config
    }
}

impl Config {
    /// Reads a `berth.toml`; keys it omits keep their defaults.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Reads `berth.toml` text over the defaults; an unknown section or
    /// key is an error (a typo must not leave a default in place silently).
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        let mut config = Config::default();
        file::read(text, &mut config)?;
        Ok(config)
    }

    /// Checks what the types cannot: ranges, addresses, non-empty lists,
    /// and settings that only make sense together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for setting in all() {
            setting
                .slot
                .check(self)
                .map_err(|refusal| ConfigError::Invalid {
                    key: setting.key,
                    value: refusal.value,
                    why: refusal.why,
                })?;
        }
        check_together(self)?;
        // The certificate files of static shovels' amqps:// URIs, read
        // at start as a PUT reads a dynamic one's.
        for def in &self.shovels {
            crate::shovel::check_files(def).map_err(|why| ConfigError::Shovel {
                name: def.name.clone(),
                why: shovels::in_file_terms(&def.name, &why),
            })?;
        }
        Ok(())
    }
}

/// The checks that involve more than one setting.
fn check_together(c: &Config) -> Result<(), ConfigError> {
    let invalid = |key: &'static str, value: String, why: String| {
        Err(ConfigError::Invalid { key, value, why })
    };
    if c.tls.fail_if_no_peer_cert && !c.tls.verify_peer {
        return invalid(
            "tls.fail_if_no_peer_cert",
            "true".into(),
            "needs tls.verify_peer = true (and tls.ca_file)".into(),
        );
    }
    // Every message accepted must fit in one store record: body,
    // properties (one content-header frame at most) and names.
    let stored_max = c.limits.message_size_bytes_max
        + u64::from(c.limits.frame_size_bytes_max)
        + berth_broker::limits::MESSAGE_PAYLOAD_NAMES_BYTES_MAX;
    if stored_max > u64::from(berth_store::PAYLOAD_BYTES_MAX) {
        return invalid(
            "limits.message_size_bytes_max",
            c.limits.message_size_bytes_max.to_string(),
            format!(
                "with limits.frame_size_bytes_max = {} a message could need {stored_max} bytes in \
                 the store, which holds at most {} per message; lower one of the two",
                c.limits.frame_size_bytes_max,
                berth_store::PAYLOAD_BYTES_MAX
            ),
        );
    }
    if let Err((key, value, why)) = cluster::check_together(&c.cluster, &c.tls) {
        return invalid(key, value, why);
    }
    // The event log's bounds are the store's rules, which name the keys.
    let e = &c.event_log;
    if let Err(err) = e
        .store_config(vec![PathBuf::new()], PathBuf::new())
        .validate()
    {
        return invalid(
            "event_log",
            format!(
                "file_bytes_max={} retained_bytes_max={} buffer_bytes_max={}",
                e.file_bytes_max, e.retained_bytes_max, e.buffer_bytes_max
            ),
            err.to_string(),
        );
    }
    Ok(())
}
