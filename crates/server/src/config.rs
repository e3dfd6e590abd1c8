//! berth's configuration as the rest of the server reads it: one struct
//! per `berth.toml` section, one field per key.
//!
//! This module holds the values only. What each key is called, its flag,
//! default, check and doc are written once, in the settings table
//! (the `settings` module), which also builds `Config::default`, reads
//! `berth.toml` ([`Config::from_toml`]) and checks a configuration
//! ([`Config::validate`]).
//!
//! Invariants:
//! - Every field is a setting of the table (kept by review: a field with
//!   no entry would keep its blank value; the settings tests check every
//!   entry's default, flag name and docs).
//! - A section's own `Default` is blank (zeros, empty lists, off): only
//!   [`Config::default`] has the embedded defaults, so that they have one
//!   home.

use std::path::PathBuf;

use crate::limits;

/// The whole configuration; [`Config::default`] is the embedded one.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub net: Net,
    pub store: Store,
    pub limits: Limits,
    pub auth: Auth,
    pub tls: Tls,
    pub log: Log,
    pub management: Management,
    pub event_log: EventLogSection,
    pub cluster: Cluster,
    /// Static shovels (`[shovels.NAME]`, docs/SHOVELS.md), checked as
    /// they were read; not settings of the table (no flag, no default).
    pub shovels: Vec<crate::shovel::definition::Definition>,
}

/// `[management]`: the HTTP management side.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Management {
    /// A RabbitMQ definitions file imported at startup (RabbitMQ's
    /// `load_definitions`); none by default.
    pub load_definitions: Option<PathBuf>,
}

/// `[tls]`: certificates for AMQPS (`net.amqps_listen`). Flags carry a
/// `tls-` prefix (`tls.cert_file` ↔ `--tls-cert-file`).
#[derive(Debug, Clone, Default, PartialEq)]
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
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// MQTT (3.1.1 and 5.0) listen addresses; empty = off, as RabbitMQ's
    /// MQTT plugin is off until enabled; 1883 by convention.
    pub mqtt_listen: Vec<String>,
    /// RabbitMQ stream protocol listen addresses; empty = off, as
    /// RabbitMQ's `rabbitmq_stream` plugin is off until enabled; 5552 by
    /// convention.
    pub stream_listen: Vec<String>,
    /// MQTT over TLS listen addresses (the `[tls]` certificate); empty =
    /// off; 8883 by convention.
    pub mqtts_listen: Vec<String>,
    /// MQTT over WebSocket (`/ws`) listen addresses; empty = off; 15675
    /// by RabbitMQ's Web MQTT convention.
    pub mqtt_ws_listen: Vec<String>,
    /// Heartbeat interval the server proposes in `connection.tune` (0 = off).
    pub heartbeat_s: u16,
    /// Time a client has to complete the AMQP handshake.
    pub handshake_timeout_ms: u64,
    /// Time a client has to complete the TLS handshake (AMQPS, HTTPS).
    pub tls_handshake_timeout_ms: u64,
}

/// When the store calls `fdatasync` (see docs/DURABILITY.md): the store's
/// own setting, spelled `always`, `interval` or `never` in `berth.toml`.
pub use berth_store::SyncMode;

/// `[store]`: where and how data is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    pub data_dirs: Vec<PathBuf>,
    /// Independent journals (each with its own files, writer and fsync).
    /// Only used when a store is created; an existing store keeps its count.
    /// 0 = one per core, between 2 and 16.
    pub log_groups: u32,
    pub sync: SyncMode,
    /// fdatasync period in `sync = "interval"`.
    pub sync_interval_ms: u64,
    /// Cap on the extra gathering pause of group commit (taken only when
    /// several committers are active; a lone committer never waits).
    pub commit_delay_us_max: u64,
    /// Size at which a journal segment is sealed and a new one started.
    pub segment_size_bytes: u64,
    /// Write each group's next segment ahead (zeros, fdatasynced) while
    /// its fdatasyncs are small, so a sync into it writes no inode.
    pub segment_prepare: bool,
    /// Append to each group's active segment past the page cache
    /// (`O_DIRECT`) where the file system allows it, and read messages
    /// back from the journal and write prepared segments' zeros past it
    /// too.
    pub direct_appends: bool,
    /// Bytes of each group's newest journal left in the page cache; older
    /// sealed segments are dropped from it (0: never).
    pub segment_cache_bytes: u64,
    /// Journal bytes a group writes between two checkpoints of its index:
    /// smaller means a shorter replay at restart and earlier reclamation,
    /// for more checkpoint writes.
    pub checkpoint_journal_bytes: u64,
    /// Ready messages per queue whose bodies stay in memory; bodies beyond
    /// it leave memory once written to the store (transient ones as paging
    /// copies, dropped at restart) and are read back on delivery.
    pub queue_resident_messages_max: usize,
    /// Body bytes per queue that stay in memory, whatever the count above
    /// allows (large messages page out sooner).
    pub queue_resident_bytes_max: u64,
    /// Open even if segments holding live messages are missing, dropping
    /// those messages (reported). Off: such a store refuses to start.
    pub accept_missing_segments: bool,
    /// Rewrite an existing store whose group count or data directories
    /// differ from the configuration (without it such a store refuses to
    /// start and says what would change). See docs/OPERATIONS.md.
    pub reshape: bool,
}

/// `[limits]`: every bound the broker enforces, with units in the names.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Messages one delayed exchange holds in memory only (transient, or
    /// of a non-durable exchange).
    pub delayed_in_memory_per_exchange_max: usize,
    /// Free space on every data directory's filesystem below which
    /// publishers are blocked (RabbitMQ's `disk_free_limit`).
    pub disk_free_bytes_min: u64,
}

/// `[auth]`: the defaults a new store starts with, and login rules. Users,
/// vhosts and permissions themselves are stored in the store (managed over
/// HTTP or with `berth user|vhost|permissions`).
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Login budget of one source address (`crate::throttle`): this many
    /// at once, then this many per second.
    pub login_failures_per_s_max: u32,
    /// Login mechanisms offered, in this order (`EXTERNAL` only on a TLS
    /// connection whose certificate names a user).
    pub mechanisms: Vec<crate::mechanism::Mechanism>,
}

/// `[cluster]`: replication over Raft (docs/CLUSTERING.md). With no
/// `node_id` berth runs as one node, exactly as without the section.
/// Flags carry a `cluster-` prefix (`cluster.peers` ↔ `--cluster-peer`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cluster {
    /// This node's name; set, it makes berth a cluster member.
    pub node_id: Option<String>,
    /// `HOST:PORT` of the listener for the other members.
    pub listen: Option<String>,
    /// Every member, this one included, as `NAME@HOST:PORT`.
    pub peers: Vec<String>,
    /// A file holding the cluster's shared secret (every member the same).
    pub secret_file: Option<PathBuf>,
    /// This member joins an existing cluster (`berth cluster add-node`)
    /// and never forms one of its own.
    pub join: bool,
    /// The shortest election timeout; the longest is twice it.
    pub election_timeout_ms: u64,
    /// An fdatasync of the Raft log running longer fences the node.
    pub sync_stall_ms_max: u64,
    /// Mutual TLS between members with the `[tls]` certificate and key.
    pub tls: bool,
    /// The CA that signs members' certificates (cluster TLS trusts only
    /// it); unset, `tls.ca_file`.
    pub tls_ca_file: Option<PathBuf>,
}

/// `[log]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter.
    pub log_level: String,
}

impl Default for Store {
    /// Blank, as every section's (see the module doc); `SyncMode` has no
    /// `Default` of its own, so this one is written out.
    fn default() -> Self {
        Self {
            data_dirs: Vec::new(),
            log_groups: 0,
            sync: SyncMode::Always,
            sync_interval_ms: 0,
            commit_delay_us_max: 0,
            segment_size_bytes: 0,
            segment_prepare: false,
            direct_appends: false,
            segment_cache_bytes: 0,
            checkpoint_journal_bytes: 0,
            queue_resident_messages_max: 0,
            queue_resident_bytes_max: 0,
            accept_missing_segments: false,
            reshape: false,
        }
    }
}

/// `[event_log]`: message lifecycle events (see docs/OPERATIONS.md,
/// "Event log"). Flags carry an `event-log-` prefix, as `[tls]`'s carry
/// `tls-` (`event_log.file_bytes_max` ↔ `--event-log-file-bytes-max`).
/// The `event_log` module turns it into the store's event log.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// `why` names the key (`shovels.NAME.destination.uris: ...`).
    #[error("invalid static shovel [shovels.{name}]: {why}")]
    Shovel { name: String, why: String },
    #[error("invalid environment variable {var}={value:?}: {why}")]
    Env {
        var: String,
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
            delayed_in_memory_per_exchange_max: self.delayed_in_memory_per_exchange_max,
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
        c.segment_prepare = self.store.segment_prepare;
        c.direct_appends = self.store.direct_appends;
        c.segment_cache_bytes = self.store.segment_cache_bytes;
        c.accept_missing_segments = self.store.accept_missing_segments;
        c.checkpoint_journal_bytes = self.store.checkpoint_journal_bytes;
        c
    }
}
