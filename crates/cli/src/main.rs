//! The `berth` binary: the broker (`berth serve`) and the operator's tools.

use std::path::PathBuf;
use std::process::ExitCode;

mod admin;

use berth_server::Config;
use clap::{Args, Parser, Subcommand};

mod backup_cmd;
mod compact_cmd;
mod events_cmd;
mod https_client;
mod status;
mod store_cmd;

#[derive(Parser)]
#[command(name = "berth", version, about = "A durable AMQP 0-9-1 message broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the broker. With no options it uses the embedded defaults
    /// (AMQP on port 5672, data in ./berth-data, guest/guest from localhost).
    Serve(Box<ServeArgs>),
    /// Rerun the seed experiments against berth or any AMQP 0-9-1 broker,
    /// optionally side by side with another (--vs), with statistics.
    Bench(Box<berth_bench::BenchArgs>),
    /// The store's tools: scan, verify, backup, restore, compact (see docs/OPERATIONS.md).
    Store(store_cmd::StoreArgs),
    /// Message lifecycle events of a store's log groups, merged in time
    /// order (`--follow` merges live); see docs/OPERATIONS.md.
    Events(events_cmd::EventsArgs),
    /// A running broker at a glance, through its management API: totals,
    /// rates, alarms, store groups and the top queues.
    Status(status::ListArgs),
    /// Queues of a running broker (through its management API).
    Queues {
        #[command(subcommand)]
        verb: ListVerb,
    },
    /// Exchanges of a running broker.
    Exchanges {
        #[command(subcommand)]
        verb: ListVerb,
    },
    /// Connections of a running broker.
    Connections {
        #[command(subcommand)]
        verb: ListVerb,
    },
    /// Manage users of a running broker (through its HTTP API).
    User(admin::UserArgs),
    /// Manage vhosts of a running broker (through its HTTP API).
    Vhost(admin::VhostArgs),
    /// Manage permissions of a running broker (through its HTTP API).
    Permissions(admin::PermissionsArgs),
}

#[derive(Subcommand)]
enum ListVerb {
    /// One page, filtered and sorted by the broker.
    List(status::ListArgs),
}

/// Every flag overrides the `berth.toml` key of the same name
/// (`section.key_name` ↔ `--key-name`; see docs/CONFIG.md).
#[derive(Args, Debug, Default)]
struct ServeArgs {
    /// Read settings from this TOML file (optional; defaults are embedded).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// net.amqp_listen: address to accept AMQP on, ADDR:PORT (repeatable;
    /// port 0 picks a free port).
    #[arg(long = "amqp-listen", value_name = "ADDR:PORT")]
    amqp_listen: Vec<String>,
    /// net.http_listen: address for the management API subset and /metrics,
    /// ADDR:PORT (repeatable; off unless given).
    #[arg(long = "http-listen", value_name = "ADDR:PORT")]
    http_listen: Vec<String>,
    /// management.load_definitions: a RabbitMQ definitions file (JSON) to
    /// import at startup.
    #[arg(long = "load-definitions", value_name = "FILE")]
    load_definitions: Option<PathBuf>,
    /// net.amqps_listen: address to accept AMQP over TLS on, ADDR:PORT
    /// (repeatable; off unless given; needs --tls-cert-file, --tls-key-file).
    #[arg(long = "amqps-listen", value_name = "ADDR:PORT")]
    amqps_listen: Vec<String>,
    /// net.https_listen: address for the management API over TLS, ADDR:PORT
    /// (repeatable; off unless given; needs --tls-cert-file, --tls-key-file).
    #[arg(long = "https-listen", value_name = "ADDR:PORT")]
    https_listen: Vec<String>,
    /// tls.cert_login_from: what names the EXTERNAL user: common_name,
    /// distinguished_name or subject_alternative_name.
    #[arg(long, value_name = "FROM")]
    tls_cert_login_from: Option<berth_server::cert_login::LoginFrom>,
    /// tls.cert_login_san_type: dns, email, uri or other_name.
    #[arg(long, value_name = "TYPE")]
    tls_cert_login_san_type: Option<berth_server::cert_login::SanType>,
    /// tls.cert_login_san_index: 0-based index among SANs of that type.
    #[arg(long, value_name = "N")]
    tls_cert_login_san_index: Option<u32>,
    /// tls.cert_file: the server certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// tls.key_file: the server's private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// tls.ca_file: CA certificates client certificates are verified against.
    #[arg(long, value_name = "FILE")]
    tls_ca_file: Option<PathBuf>,
    /// tls.verify_peer: ask for and verify client certificates.
    #[arg(long, value_name = "BOOL")]
    tls_verify_peer: Option<bool>,
    /// tls.fail_if_no_peer_cert: refuse clients without a certificate.
    #[arg(long, value_name = "BOOL")]
    tls_fail_if_no_peer_cert: Option<bool>,
    /// net.heartbeat_s: heartbeat interval proposed to clients (0 = off).
    #[arg(long, value_name = "SECONDS")]
    heartbeat_s: Option<u16>,
    /// net.handshake_timeout_ms: time a client has to finish the handshake.
    #[arg(long, value_name = "MS")]
    handshake_timeout_ms: Option<u64>,
    /// store.data_dirs: data directory (repeatable).
    #[arg(long = "data-dir", value_name = "DIR")]
    data_dir: Vec<PathBuf>,
    /// store.log_groups: independent journals, used when a store is created
    /// (0 = one per core, 2..16).
    #[arg(long, value_name = "N")]
    log_groups: Option<u32>,
    /// store.sync: always (confirm after fdatasync), interval (after write;
    /// fdatasync every sync_interval_ms), never (fdatasync on segment seal
    /// and shutdown). See docs/DURABILITY.md.
    #[arg(long, value_name = "MODE", value_parser = ["always", "interval", "never"])]
    sync: Option<String>,
    /// store.sync_interval_ms: fdatasync period with --sync interval.
    #[arg(long, value_name = "MS")]
    sync_interval_ms: Option<u64>,
    /// store.commit_delay_us_max: cap on group commit's gathering pause.
    #[arg(long, value_name = "US")]
    commit_delay_us_max: Option<u64>,
    /// store.segment_size_bytes: journal segment size.
    #[arg(long, value_name = "BYTES")]
    segment_size_bytes: Option<u64>,
    /// store.checkpoint_journal_bytes: journal bytes between two
    /// checkpoints of a group's index (smaller: faster restart).
    #[arg(long, value_name = "BYTES")]
    checkpoint_journal_bytes: Option<u64>,
    /// store.queue_resident_messages_max: ready messages per queue kept in
    /// memory; bodies beyond it are written to disk and read back on delivery.
    #[arg(long, value_name = "N")]
    queue_resident_messages_max: Option<usize>,
    /// store.accept_missing_segments: start even if segments holding live
    /// messages are missing, dropping those messages (they are listed in
    /// the log). Use only after restoring from backup failed.
    #[arg(long)]
    accept_missing_segments: bool,
    /// store.reshape: rewrite an existing store whose log group count or
    /// data directories differ from the configuration (needs free space
    /// about the store's size; the old store is kept aside).
    #[arg(long)]
    reshape: bool,
    /// limits.frame_size_bytes_max: largest frame accepted and proposed.
    #[arg(long, value_name = "BYTES")]
    frame_size_bytes_max: Option<u32>,
    /// limits.channels_per_connection_max: channel_max proposed to clients.
    #[arg(long, value_name = "N")]
    channels_per_connection_max: Option<u16>,
    /// limits.message_size_bytes_max: largest message body accepted.
    #[arg(long, value_name = "BYTES")]
    message_size_bytes_max: Option<u64>,
    /// limits.consumer_timeout_ms: unacked deliveries older than this close
    /// their channel with 406 (0 = never).
    #[arg(long, value_name = "MS")]
    consumer_timeout_ms: Option<u64>,
    /// limits.connection_output_bytes_max: output buffered per connection
    /// before its consumers are paused.
    #[arg(long, value_name = "BYTES")]
    connection_output_bytes_max: Option<usize>,
    /// limits.connections_max: open connections allowed (0 = no limit).
    #[arg(long, value_name = "N")]
    connections_max: Option<usize>,
    /// limits.memory_high_watermark_bytes: message bytes in memory above
    /// which publishers are blocked (0 = 40% of RAM).
    #[arg(long, value_name = "BYTES")]
    memory_high_watermark_bytes: Option<u64>,
    /// limits.queues_max: queues per vhost.
    #[arg(long, value_name = "N")]
    queues_max: Option<usize>,
    /// limits.exchanges_max: exchanges per vhost (amq.* included).
    #[arg(long, value_name = "N")]
    exchanges_max: Option<usize>,
    /// limits.bindings_per_exchange_max: bindings from one exchange.
    #[arg(long, value_name = "N")]
    bindings_per_exchange_max: Option<usize>,
    /// limits.consumers_per_channel_max: consumers on one channel.
    #[arg(long, value_name = "N")]
    consumers_per_channel_max: Option<usize>,
    /// limits.disk_free_bytes_min: free disk space below which publishers
    /// are blocked.
    #[arg(long, value_name = "BYTES")]
    disk_free_bytes_min: Option<u64>,
    /// auth.vhosts: a virtual host to serve (repeatable).
    #[arg(long = "vhost", value_name = "NAME")]
    vhost: Vec<String>,
    /// auth.default_user: user created with a new store (empty = none).
    #[arg(long, value_name = "NAME")]
    default_user: Option<String>,
    /// auth.default_pass: that user's password.
    #[arg(long, value_name = "PASSWORD")]
    default_pass: Option<String>,
    /// auth.loopback_users: a user allowed to log in from localhost only
    /// (repeatable; "none" for nobody).
    #[arg(long = "loopback-user", value_name = "NAME")]
    loopback_user: Vec<String>,
    /// auth.login_failures_per_s_max: failed logins per second from one
    /// address answered at once; beyond, each waits 200 ms.
    #[arg(long, value_name = "N")]
    login_failures_per_s_max: Option<u32>,
    /// log.log_level: error, warn, info, debug, trace, or a tracing filter.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    #[command(flatten)]
    event_log: events_cmd::EventLogFlags,
}

impl ServeArgs {
    fn apply(self, c: &mut Config) {
        fn set<T>(slot: &mut T, v: Option<T>) {
            if let Some(v) = v {
                *slot = v;
            }
        }
        fn set_list<T>(slot: &mut Vec<T>, v: Vec<T>) {
            if !v.is_empty() {
                *slot = v;
            }
        }
        self.event_log.apply(c);
        set_list(&mut c.net.amqp_listen, self.amqp_listen);
        set_list(&mut c.net.http_listen, self.http_listen);
        if self.load_definitions.is_some() {
            c.management.load_definitions = self.load_definitions;
        }
        set_list(&mut c.net.amqps_listen, self.amqps_listen);
        if self.tls_cert_file.is_some() {
            c.tls.cert_file = self.tls_cert_file;
        }
        if self.tls_key_file.is_some() {
            c.tls.key_file = self.tls_key_file;
        }
        if self.tls_ca_file.is_some() {
            c.tls.ca_file = self.tls_ca_file;
        }
        set(&mut c.tls.verify_peer, self.tls_verify_peer);
        set_list(&mut c.net.https_listen, self.https_listen);
        set(&mut c.tls.cert_login_from, self.tls_cert_login_from);
        set(&mut c.tls.cert_login_san_type, self.tls_cert_login_san_type);
        set(
            &mut c.tls.cert_login_san_index,
            self.tls_cert_login_san_index,
        );
        set(
            &mut c.tls.fail_if_no_peer_cert,
            self.tls_fail_if_no_peer_cert,
        );
        set(&mut c.net.heartbeat_s, self.heartbeat_s);
        set(&mut c.net.handshake_timeout_ms, self.handshake_timeout_ms);
        set_list(&mut c.store.data_dirs, self.data_dir);
        set(&mut c.store.log_groups, self.log_groups);
        set(
            &mut c.store.sync,
            self.sync.map(|s| match s.as_str() {
                "interval" => berth_server::config::SyncMode::Interval,
                "never" => berth_server::config::SyncMode::Never,
                _ => berth_server::config::SyncMode::Always,
            }),
        );
        set(&mut c.store.sync_interval_ms, self.sync_interval_ms);
        set(&mut c.store.commit_delay_us_max, self.commit_delay_us_max);
        set(&mut c.store.segment_size_bytes, self.segment_size_bytes);
        set(
            &mut c.store.checkpoint_journal_bytes,
            self.checkpoint_journal_bytes,
        );
        set(
            &mut c.store.queue_resident_messages_max,
            self.queue_resident_messages_max,
        );
        if self.accept_missing_segments {
            c.store.accept_missing_segments = true;
        }
        if self.reshape {
            c.store.reshape = true;
        }
        set(
            &mut c.limits.frame_size_bytes_max,
            self.frame_size_bytes_max,
        );
        set(
            &mut c.limits.channels_per_connection_max,
            self.channels_per_connection_max,
        );
        set(
            &mut c.limits.message_size_bytes_max,
            self.message_size_bytes_max,
        );
        set(&mut c.limits.consumer_timeout_ms, self.consumer_timeout_ms);
        set(
            &mut c.limits.connection_output_bytes_max,
            self.connection_output_bytes_max,
        );
        set(&mut c.limits.connections_max, self.connections_max);
        set(
            &mut c.limits.memory_high_watermark_bytes,
            self.memory_high_watermark_bytes,
        );
        set(&mut c.limits.queues_max, self.queues_max);
        set(&mut c.limits.exchanges_max, self.exchanges_max);
        set(
            &mut c.limits.bindings_per_exchange_max,
            self.bindings_per_exchange_max,
        );
        set(
            &mut c.limits.consumers_per_channel_max,
            self.consumers_per_channel_max,
        );
        set(&mut c.limits.disk_free_bytes_min, self.disk_free_bytes_min);
        set_list(&mut c.auth.vhosts, self.vhost);
        set(&mut c.auth.default_user, self.default_user);
        set(&mut c.auth.default_pass, self.default_pass);
        set(
            &mut c.auth.login_failures_per_s_max,
            self.login_failures_per_s_max,
        );
        if self.loopback_user.iter().any(|u| u == "none") {
            c.auth.loopback_users.clear();
        } else {
            set_list(&mut c.auth.loopback_users, self.loopback_user);
        }
        set(&mut c.log.log_level, self.log_level);
    }
}

fn init_logging(level: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .map_err(|e| format!("invalid log level {level:?}: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    Ok(())
}

fn serve(args: ServeArgs) -> ExitCode {
    let mut config = match &args.config {
        Some(path) => match Config::from_file(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("berth: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    args.apply(&mut config);
    if let Err(e) = init_logging(&config.log.log_level) {
        eprintln!("berth: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let running = match berth_server::start(config).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("berth: {e}");
                return ExitCode::FAILURE;
            }
        };
        wait_for_signal().await;
        tracing::info!("shutting down");
        running.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop berth with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn admin_result(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => serve(*args),
        Command::Store(args) => store_cmd::run(args),
        Command::Events(args) => events_cmd::run(args),
        Command::Status(args) => status::status(&args),
        Command::Queues {
            verb: ListVerb::List(a),
        } => status::list(status::Kind::Queues, &a),
        Command::Exchanges {
            verb: ListVerb::List(a),
        } => status::list(status::Kind::Exchanges, &a),
        Command::Connections {
            verb: ListVerb::List(a),
        } => status::list(status::Kind::Connections, &a),
        Command::User(a) => admin_result(admin::user(&a)),
        Command::Vhost(a) => admin_result(admin::vhost(&a)),
        Command::Permissions(a) => admin_result(admin::permissions(&a)),
        Command::Bench(args) => match berth_bench::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("berth bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
