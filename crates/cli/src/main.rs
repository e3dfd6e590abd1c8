//! The `berth` binary: the broker (`berth serve`) and the operator's tools.

use std::process::ExitCode;

use berth_server::Config;
use clap::{Parser, Subcommand};

use crate::exit::EXIT_UNREADABLE;
use crate::serve_args::ServeArgs;

mod admin;
mod backup_cmd;
mod cluster_cmd;
mod compact_cmd;
mod events_cmd;
mod exit;
mod health_cmd;
mod heap_trim;
mod https_client;
mod log_filter;
mod malloc_tune;
mod sd_notify;
mod serve_args;
mod status;
mod store_cmd;
mod stream_scan;

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
    /// A cluster's members and leader; add or remove a member (through the
    /// leader's HTTP API; see docs/CLUSTERING.md).
    Cluster(cluster_cmd::ClusterArgs),
    /// Exit 0 if the broker answers as a single node, a cluster's leader
    /// or a follower (`--ready`: a follower must know a leader); for
    /// container health checks and Kubernetes probes (packaging/).
    Health(health_cmd::HealthArgs),
}

#[derive(Subcommand)]
enum ListVerb {
    /// One page, filtered and sorted by the broker.
    List(status::ListArgs),
}

fn init_logging(level: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .map_err(|e| format!("invalid log level {level:?}: {e}"))?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let quiet = log_filter::QuietPeerRetries::unless_named_in(&filter.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .finish()
        .with(quiet)
        .init();
    Ok(())
}

fn serve(args: ServeArgs) -> ExitCode {
    let mut config = match &args.config {
        Some(path) => match Config::from_file(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("berth: {e}");
                return ExitCode::from(EXIT_UNREADABLE);
            }
        },
        None => Config::default(),
    };
    // Variables override the file; flags override both (docs/CONFIG.md).
    let unknown_vars = match berth_server::settings::env::apply(&mut config, std::env::vars_os()) {
        Ok(unknown) => unknown,
        Err(e) => {
            eprintln!("berth: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    args.apply(&mut config);
    // Before any thread starts (config parsing above is single-threaded).
    malloc_tune::fix_malloc_settings(config.cluster.node_id.is_some());
    if let Err(e) = init_logging(&config.log.log_level) {
        eprintln!("berth: {e}");
        return ExitCode::from(EXIT_UNREADABLE);
    }
    for var in unknown_vars {
        tracing::warn!(
            "ignored the environment variable {var}: it names no setting (see docs/CONFIG.md)"
        );
    }
    heap_trim::spawn();
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
        // Before the ready line: a SIGTERM right after it must stop the
        // broker cleanly, not kill it by the default action.
        let stop = StopSignals::install();
        let running = match berth_server::start(config).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("berth: {e}");
                return ExitCode::FAILURE;
            }
        };
        sd_notify::notify("READY=1");
        stop.wait().await;
        sd_notify::notify("STOPPING=1");
        tracing::info!("shutting down");
        running.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// SIGTERM and SIGINT, caught from before the broker starts.
struct StopSignals(Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>);

impl StopSignals {
    fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Self(Some((term, int))),
            _ => {
                tracing::warn!("cannot install signal handlers; stop berth with SIGKILL");
                Self(None)
            }
        }
    }

    async fn wait(self) {
        let Some((mut term, mut int)) = self.0 else {
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
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
        Command::Cluster(a) => admin_result(cluster_cmd::run(&a)),
        Command::Health(a) => health_cmd::run(&a),
        Command::Bench(args) => match berth_bench::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("berth bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
