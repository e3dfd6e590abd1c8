//! berth's configuration: embedded defaults, an optional `berth.toml`, and
//! command-line flags on top.
//!
//! Naming rule (documented in docs/CONFIG.md): every key `section.key_name`
//! has the flag `--key-name` (underscores become dashes, the section is not
//! part of the flag; key names are unique across sections). A list key named
//! in the plural takes a repeatable flag named in the singular:
//! `store.data_dirs` ↔ `--data-dir DIR --data-dir DIR2`. Units are the last
//! word of a name (`heartbeat_s`, `frame_size_bytes_max`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::limits;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub net: Net,
    pub store: Store,
    pub limits: Limits,
    pub auth: Auth,
    pub tls: Tls,
    pub log: Log,
    pub management: Management,
    pub event_log: crate::event_log::EventLogSection,
}

/// `[management]`: the HTTP management side.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Management {
    /// A RabbitMQ definitions file imported at startup (RabbitMQ's
    /// `load_definitions`); none by default.
    pub load_definitions: Option<PathBuf>,
}

/// `[tls]`: certificates for AMQPS (`net.amqps_listen`). Flags carry a
/// `tls-` prefix (`tls.cert_file` ↔ `--tls-cert-file`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Tls {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) client certificates are verified against.
    pub ca_file: Option<PathBuf>,
    /// Ask clients for a certificate and verify it against `ca_file`
    /// (RabbitMQ's `verify_peer`); needed for `EXTERNAL`.
    pub verify_peer: bool,
    /// With `verify_peer`: refuse clients without a certificate.
    pub fail_if_no_peer_cert: bool,
    /// What of a client certificate names the `EXTERNAL` user (RabbitMQ's
    /// `ssl_cert_login_from`).
    pub cert_login_from: crate::cert_login::LoginFrom,
    /// With `subject_alternative_name`: which SAN type counts.
    pub cert_login_san_type: crate::cert_login::SanType,
    /// With `subject_alternative_name`: 0-based index among SANs of that type.
    pub cert_login_san_index: u32,
}

impl Tls {
    /// How `EXTERNAL` names the user of a client certificate.
    pub fn cert_login(&self) -> crate::cert_login::CertLogin {
        crate::cert_login::CertLogin {
            from: self.cert_login_from,
            san_type: self.cert_login_san_type,
            san_index: self.cert_login_san_index,
        }
    }
}

/// `[net]`: listeners and connection timing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Net {
    /// AMQP listen addresses. Port 0 picks a free port.
    pub amqp_listen: Vec<String>,
    /// HTTP listen addresses for the management API subset and `/metrics`.
    /// Empty (the default) = off, as RabbitMQ's management plugin is off
    /// until enabled; e.g. `["0.0.0.0:15672"]`.
    pub http_listen: Vec<String>,
    /// AMQPS (AMQP over TLS) listen addresses; empty = off; 5671 by
    /// convention. Needs `tls.cert_file` and `tls.key_file`.
    pub amqps_listen: Vec<String>,
    /// HTTPS listen addresses for the same API as `http_listen`, with the
    /// `[tls]` certificate; empty = off; 15671 by RabbitMQ's convention.
    pub https_listen: Vec<String>,
    /// Heartbeat interval the server proposes in `connection.tune` (0 = off).
    pub heartbeat_s: u16,
    /// Time a client has to complete the AMQP handshake.
    pub handshake_timeout_ms: u64,
}

/// When the store calls `fdatasync` (see docs/DURABILITY.md): the store's
/// own setting, spelled `always`, `interval` or `never` in `berth.toml`.
pub use berth_store::SyncMode;

/// Reads [`SyncMode`] from its lowercase name.
fn deserialize_sync_mode<'de, D>(d: D) -> Result<SyncMode, D::Error>
where
    D: serde::Deserializer<'de>,
{
    const NAMES: &[&str] = &["always", "interval", "never"];
    let name = String::deserialize(d)?;
    match name.as_str() {
        "always" => Ok(SyncMode::Always),
        "interval" => Ok(SyncMode::Interval),
        "never" => Ok(SyncMode::Never),
        _ => Err(serde::de::Error::unknown_variant(&name, NAMES)),
    }
}

/// `[store]`: where and how data is kept.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Store {
    pub data_dirs: Vec<PathBuf>,
    /// Independent journals (each with its own files, writer and fsync).
    /// Only used when a store is created; an existing store keeps its count.
    /// 0 = one per core, between 2 and 16.
    pub log_groups: u32,
    #[serde(deserialize_with = "deserialize_sync_mode")]
    pub sync: SyncMode,
    /// fdatasync period in `sync = "interval"`.
    pub sync_interval_ms: u64,
    /// Cap on the extra gathering pause of group commit (taken only when
    /// several committers are active; a lone committer never waits).
    pub commit_delay_us_max: u64,
    /// Size at which a journal segment is sealed and a new one started.
    pub segment_size_bytes: u64,
    /// Journal bytes a group writes between two checkpoints of its index:
    /// smaller means a shorter replay at restart and earlier reclamation,
    /// for more checkpoint writes.
    pub checkpoint_journal_bytes: u64,
    /// Ready messages per queue whose bodies stay in memory; bodies beyond
    /// it leave memory once written to the store (transient ones as paging
    /// copies, dropped at restart) and are read back on delivery.
    pub queue_resident_messages_max: usize,
    /// Open even if segments holding live messages are missing, dropping
    /// those messages (reported). Off: such a store refuses to start.
    pub accept_missing_segments: bool,
    /// Rewrite an existing store whose group count or data directories
    /// differ from the configuration (without it such a store refuses to
    /// start and says what would change). See docs/OPERATIONS.md.
    pub reshape: bool,
}

/// `[limits]`: every bound the broker enforces, with units in the names.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest frame the server accepts and proposes (`frame_max`).
    pub frame_size_bytes_max: u32,
    /// Channels per connection (`channel_max`).
    pub channels_per_connection_max: u16,
    /// Largest message body accepted.
    pub message_size_bytes_max: u64,
    /// Server-wide consumer acknowledgement timeout (0 = none).
    pub consumer_timeout_ms: u64,
    /// Output buffered for one connection before its consumers are paused.
    pub connection_output_bytes_max: usize,
    /// Open connections (0 = no limit besides file descriptors).
    pub connections_max: usize,
    /// Message bytes held in memory above which publishing connections are
    /// blocked (`connection.blocked`) until consumers drain them. 0 = 40% of
    /// the machine's RAM, as RabbitMQ's default.
    pub memory_high_watermark_bytes: u64,
    /// Queues per vhost (RabbitMQ's `max-queues` vhost limit).
    pub queues_max: usize,
    /// Exchanges per vhost, the standard `amq.*` ones included.
    pub exchanges_max: usize,
    /// Bindings whose source is one exchange.
    pub bindings_per_exchange_max: usize,
    /// Consumers per channel (RabbitMQ's `consumer_max_per_channel`).
    pub consumers_per_channel_max: usize,
    /// Free space on every data directory's filesystem below which
    /// publishers are blocked (RabbitMQ's `disk_free_limit`).
    pub disk_free_bytes_min: u64,
}

/// `[auth]`: the defaults a new store starts with, and login rules. Users,
/// vhosts and permissions themselves are stored in the store (managed over
/// HTTP or with `berth user|vhost|permissions`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// Vhosts created at startup if missing (the first is the one the
    /// default user gets permissions on).
    pub vhosts: Vec<String>,
    /// User created (administrator, all permissions on the first vhost)
    /// when a store is new, as RabbitMQ's `default_user`. Empty = none.
    pub default_user: String,
    /// Its password (`default_pass`).
    pub default_pass: String,
    /// Users that may only connect from a loopback address.
    pub loopback_users: Vec<String>,
    /// Failed logins per second from one address answered at once; each
    /// one beyond waits `LOGIN_FAILURE_DELAY_MS` (slows password guessing
    /// without delaying anyone else).
    pub login_failures_per_s_max: u32,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter.
    pub log_level: String,
}

impl Default for Net {
    fn default() -> Self {
        Self {
            amqp_listen: vec!["0.0.0.0:5672".into(), "[::]:5672".into()],
            http_listen: Vec::new(),
            https_listen: Vec::new(),
            amqps_listen: Vec::new(),
            heartbeat_s: limits::DEFAULT_HEARTBEAT_S,
            handshake_timeout_ms: limits::DEFAULT_HANDSHAKE_TIMEOUT_MS,
        }
    }
}

impl Default for Store {
    fn default() -> Self {
        // The store's tunables have their defaults in the store.
        let store = berth_store::StoreConfig::new("./berth-data");
        Self {
            data_dirs: store.data_dirs,
            log_groups: 0,
            sync: store.sync,
            sync_interval_ms: store.sync_interval_ms,
            commit_delay_us_max: store.commit_delay_us_max,
            segment_size_bytes: store.segment_size_bytes,
            checkpoint_journal_bytes: store.checkpoint_journal_bytes,
            queue_resident_messages_max: berth_broker::limits::RESIDENT_MESSAGES_MAX_DEFAULT,
            accept_missing_segments: store.accept_missing_segments,
            reshape: false,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            frame_size_bytes_max: limits::DEFAULT_FRAME_SIZE_BYTES_MAX,
            channels_per_connection_max: limits::DEFAULT_CHANNELS_PER_CONNECTION_MAX,
            message_size_bytes_max: limits::DEFAULT_MESSAGE_SIZE_BYTES_MAX,
            consumer_timeout_ms: limits::DEFAULT_CONSUMER_TIMEOUT_MS,
            connection_output_bytes_max: limits::DEFAULT_CONNECTION_OUTPUT_BYTES_MAX,
            connections_max: 0,
            memory_high_watermark_bytes: 0,
            queues_max: berth_broker::limits::QUEUES_MAX_DEFAULT,
            exchanges_max: berth_broker::limits::EXCHANGES_MAX_DEFAULT,
            bindings_per_exchange_max: berth_broker::limits::BINDINGS_PER_EXCHANGE_MAX_DEFAULT,
            consumers_per_channel_max: berth_broker::limits::CONSUMERS_PER_CHANNEL_MAX_DEFAULT,
            disk_free_bytes_min: limits::DEFAULT_DISK_FREE_BYTES_MIN,
        }
    }
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            vhosts: vec!["/".into()],
            default_user: "guest".into(),
            default_pass: "guest".into(),
            loopback_users: vec!["guest".into()],
            login_failures_per_s_max: limits::DEFAULT_LOGIN_FAILURES_PER_S_MAX,
        }
    }
}

impl Default for Log {
    fn default() -> Self {
        Self {
            log_level: "info".into(),
        }
    }
}

/// A configuration problem, said so the operator knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid setting {key} = {value:?}: {why}")]
    Invalid {
        key: &'static str,
        value: String,
        why: String,
    },
}

impl Limits {
    /// The counts the broker enforces.
    pub fn count_limits(&self) -> berth_broker::limits::CountLimits {
        berth_broker::limits::CountLimits {
            queues_max: self.queues_max,
            exchanges_max: self.exchanges_max,
            bindings_per_exchange_max: self.bindings_per_exchange_max,
            consumers_per_channel_max: self.consumers_per_channel_max,
        }
    }

    /// The memory watermark in bytes, resolving 0 to 40% of RAM.
    pub fn memory_high_watermark(&self) -> u64 {
        if self.memory_high_watermark_bytes > 0 {
            return self.memory_high_watermark_bytes;
        }
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(limits::MEMORY_TOTAL_BYTES_FALLBACK, |kb| kb * 1024);
        total / 10 * limits::MEMORY_HIGH_WATERMARK_TENTHS_OF_RAM
    }
}

impl Config {
    /// The store's configuration from the `[store]` section.
    pub fn store_config(&self) -> berth_store::StoreConfig {
        let mut c = berth_store::StoreConfig::new(self.store.data_dirs[0].clone());
        c.data_dirs.clone_from(&self.store.data_dirs);
        if self.store.log_groups > 0 {
            c.log_groups = self.store.log_groups;
        }
        c.sync = self.store.sync;
        c.sync_interval_ms = self.store.sync_interval_ms;
        c.commit_delay_us_max = self.store.commit_delay_us_max;
        c.segment_size_bytes = self.store.segment_size_bytes;
        c.accept_missing_segments = self.store.accept_missing_segments;
        c.checkpoint_journal_bytes = self.store.checkpoint_journal_bytes;
        c
    }

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

    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks values serde cannot: ranges, addresses, non-empty lists.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, value: String, why: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                why: why.to_owned(),
            })
        };
        if self.net.amqp_listen.is_empty() {
            return invalid(
                "net.amqp_listen",
                "[]".into(),
                "at least one address is needed",
            );
        }
        for a in &self.net.amqp_listen {
            if a.parse::<SocketAddr>().is_err() {
                return invalid(
                    "net.amqp_listen",
                    a.clone(),
                    "expected ADDRESS:PORT, e.g. 0.0.0.0:5672 or [::1]:5672",
                );
            }
        }
        for a in &self.net.amqps_listen {
            if a.parse::<SocketAddr>().is_err() {
                return invalid(
                    "net.amqps_listen",
                    a.clone(),
                    "expected ADDRESS:PORT, e.g. 0.0.0.0:5671",
                );
            }
        }
        for a in &self.net.https_listen {
            if a.parse::<SocketAddr>().is_err() {
                return invalid(
                    "net.https_listen",
                    a.clone(),
                    "expected ADDRESS:PORT, e.g. 0.0.0.0:15671",
                );
            }
        }
        if self.tls.fail_if_no_peer_cert && !self.tls.verify_peer {
            return invalid(
                "tls.fail_if_no_peer_cert",
                "true".into(),
                "needs tls.verify_peer = true (and tls.ca_file)",
            );
        }
        for a in &self.net.http_listen {
            if a.parse::<SocketAddr>().is_err() {
                return invalid(
                    "net.http_listen",
                    a.clone(),
                    "expected ADDRESS:PORT, e.g. 0.0.0.0:15672",
                );
            }
        }
        if self.limits.frame_size_bytes_max < berth_protocol::frame::FRAME_MIN_SIZE {
            return invalid(
                "limits.frame_size_bytes_max",
                self.limits.frame_size_bytes_max.to_string(),
                "must be at least 4096 (the AMQP minimum)",
            );
        }
        // Every message accepted must fit in one store record: body,
        // properties (one content-header frame at most) and names.
        let stored_max = self.limits.message_size_bytes_max
            + u64::from(self.limits.frame_size_bytes_max)
            + berth_broker::limits::MESSAGE_PAYLOAD_NAMES_BYTES_MAX;
        if stored_max > u64::from(berth_store::PAYLOAD_BYTES_MAX) {
            return invalid(
                "limits.message_size_bytes_max",
                self.limits.message_size_bytes_max.to_string(),
                &format!(
                    "with limits.frame_size_bytes_max = {} a message could need {stored_max} bytes in \
                     the store, which holds at most {} per message; lower one of the two",
                    self.limits.frame_size_bytes_max,
                    berth_store::PAYLOAD_BYTES_MAX
                ),
            );
        }
        if self.limits.channels_per_connection_max == 0 {
            return invalid(
                "limits.channels_per_connection_max",
                "0".into(),
                "must be at least 1",
            );
        }
        if self.store.data_dirs.is_empty() {
            return invalid(
                "store.data_dirs",
                "[]".into(),
                "at least one directory is needed",
            );
        }
        if self.store.checkpoint_journal_bytes < limits::CHECKPOINT_JOURNAL_BYTES_MIN {
            return invalid(
                "store.checkpoint_journal_bytes",
                self.store.checkpoint_journal_bytes.to_string(),
                "must be at least 65536 (a checkpoint per few records would do nothing but checkpoint)",
            );
        }
        if self.auth.vhosts.is_empty() {
            return invalid("auth.vhosts", "[]".into(), "at least one vhost is needed");
        }
        self.event_log.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_the_embedded_defaults() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
        Config::default().validate().unwrap();
    }

    #[test]
    fn every_message_the_limits_accept_fits_in_one_store_record() {
        let c = Config::default();
        let needed = c.limits.message_size_bytes_max
            + u64::from(c.limits.frame_size_bytes_max)
            + berth_broker::limits::MESSAGE_PAYLOAD_NAMES_BYTES_MAX;
        assert!(
            needed <= u64::from(c.store_config().payload_bytes_max),
            "a {} byte message needs {needed} bytes, the store holds {}",
            c.limits.message_size_bytes_max,
            c.store_config().payload_bytes_max
        );
        let mut c = Config::default();
        c.limits.message_size_bytes_max = 200 << 20;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("limits.message_size_bytes_max") && e.contains("lower one"),
            "{e}"
        );
    }

    #[test]
    fn keys_override_defaults_section_by_section() {
        let c = Config::from_toml(
            "[net]\namqp_listen = [\"127.0.0.1:0\"]\n[limits]\nconsumer_timeout_ms = 5\n",
        )
        .unwrap();
        assert_eq!(c.net.amqp_listen, vec!["127.0.0.1:0"]);
        assert_eq!(c.net.heartbeat_s, 60);
        assert_eq!(c.limits.consumer_timeout_ms, 5);
    }

    #[test]
    fn unknown_keys_are_an_error_not_silently_ignored() {
        let e = Config::from_toml("[net]\nheartbeat = 5\n").unwrap_err();
        assert!(e.to_string().contains("heartbeat"), "{e}");
    }

    #[test]
    fn bad_listen_address_is_reported_with_the_key() {
        let mut c = Config::default();
        c.net.amqp_listen = vec!["localhost".into()];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("net.amqp_listen"), "{e}");
    }

    #[test]
    fn sync_mode_is_read_by_its_lowercase_name() {
        let c = Config::from_toml("[store]\nsync = \"interval\"\n").unwrap();
        assert_eq!(c.store.sync, SyncMode::Interval);
        let e = Config::from_toml("[store]\nsync = \"sometimes\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
    }

    #[test]
    fn frame_max_below_the_amqp_minimum_is_refused() {
        let mut c = Config::default();
        c.limits.frame_size_bytes_max = 100;
        assert!(c.validate().is_err());
    }

    #[test]
    fn checkpoint_journal_bytes_reaches_the_store_and_has_a_floor() {
        let c = Config::from_toml("[store]\ncheckpoint_journal_bytes = 1048576\n").unwrap();
        c.validate().unwrap();
        assert_eq!(c.store_config().checkpoint_journal_bytes, 1_048_576);
        let mut c = Config::default();
        c.store.checkpoint_journal_bytes = 4096;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("store.checkpoint_journal_bytes"), "{e}");
    }
}
