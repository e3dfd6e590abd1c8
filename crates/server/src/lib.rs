//! The networked broker: AMQP listeners, the accept loop, timers, and
//! graceful shutdown.
//!
//! Invariants:
//! - The broker logs exactly one `berth ready amqp=ADDR[,ADDR...]` line once
//!   every listener is bound, so scripts can find the ports it picked.
//! - On shutdown every connection is sent `connection.close 320` and given a
//!   bounded time to go.

pub mod auth;
pub mod cert_login;
pub mod config;
pub mod connection;
pub mod disk;
pub mod event_log;
pub mod http;
mod https;
pub mod journal;
pub mod limits;
pub mod memory;
pub mod outbound;
pub mod registry;
pub mod reshape;
pub mod settings;
pub mod stats;
pub mod stream;
pub mod tls;
mod tls_side;

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use config::Config;
use connection::Shared;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot listen on {addr}: {source} (is another broker running there? use --amqp-listen to choose another address)")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Startup(String),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot open the store: {source}")]
    Store {
        #[source]
        source: berth_store::StoreError,
    },
    #[error("data directory {path} is in use by another berth process (lock file {path}/berth.lock); stop it or choose another --data-dir")]
    DataDirLocked { path: PathBuf },
}

/// A running server's handle: where it listens and how to stop it.
pub struct Running {
    pub amqp_addrs: Vec<SocketAddr>,
    pub amqps_addrs: Vec<SocketAddr>,
    pub http_addrs: Vec<SocketAddr>,
    journal: Arc<journal::StoreJournal>,
    /// For the removals still waiting at shutdown (dead-lettering).
    broker: Arc<berth_broker::Broker>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    _locks: Vec<File>,
}

impl Running {
    /// Asks every connection to close and waits (bounded) for the server to
    /// stop.
    pub async fn shutdown(self) {
        let _receivers_may_be_gone = self.shutdown.send(true);
        let wait = Duration::from_millis(limits::SHUTDOWN_GRACE_MS + limits::SHUTDOWN_SLACK_MS);
        if tokio::time::timeout(wait, self.task).await.is_err() {
            tracing::warn!("shutdown grace period ran out; exiting with connections still open");
        }
        // Everything written reaches the disk before we exit: first what
        // is pending, then the removals that waited for it (a dead-lettered
        // message leaves its queue once its copy is durable).
        for round in ["store flushed", "waiting removals flushed"] {
            self.broker.flush_removals();
            let (done, ticket) = berth_store::Ticket::new();
            self.journal.store.flush(done);
            match tokio::task::spawn_blocking(move || ticket.wait()).await {
                Ok(Ok(())) => tracing::info!("{round}"),
                Ok(Err(e)) => tracing::error!(error = %e, "final store flush failed"),
                Err(e) => tracing::error!(error = %e, "final store flush did not run"),
            }
        }
        if let Some(events) = self.journal.events.get().cloned() {
            match tokio::task::spawn_blocking(move || events.close()).await {
                Ok(()) => tracing::info!("event log closed"),
                Err(e) => tracing::error!(error = %e, "closing the event log did not finish"),
            }
        }
    }
}

/// Raises the open-file soft limit to the hard limit so thousands of
/// connections work without tuning.
fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
}

/// Locks every data directory (`berth.lock`, an advisory exclusive lock
/// the kernel drops when the process dies), as `berth serve` does; the
/// offline store tools take the same lock.
pub fn lock_data_dirs(dirs: &[PathBuf]) -> Result<Vec<File>, ServerError> {
    let mut locks = Vec::new();
    for d in dirs {
        std::fs::create_dir_all(d).map_err(|source| ServerError::DataDir {
            path: d.clone(),
            source,
        })?;
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(d.join("berth.lock"))
            .map_err(|source| ServerError::DataDir {
                path: d.clone(),
                source,
            })?;
        match f.try_lock() {
            Ok(()) => locks.push(f),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(ServerError::DataDirLocked { path: d.clone() })
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(ServerError::DataDir {
                    path: d.clone(),
                    source,
                })
            }
        }
    }
    Ok(locks)
}

fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    let err = |source| ServerError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let domain = socket2::Domain::for_address(sa);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(err)?;
    if sa.is_ipv6() {
        // [::] and 0.0.0.0 are listed separately; keep them independent.
        s.set_only_v6(true).map_err(err)?;
    }
    s.set_reuse_address(true).map_err(err)?;
    s.set_nonblocking(true).map_err(err)?;
    s.bind(&sa.into()).map_err(err)?;
    s.listen(limits::LISTEN_BACKLOG_CONNECTIONS).map_err(err)?;
    TcpListener::from_std(s.into()).map_err(err)
}

/// Imports a RabbitMQ definitions file (`management.load_definitions`).
fn load_definitions(
    broker: &berth_broker::Broker,
    path: &std::path::Path,
) -> Result<(), ServerError> {
    let fail = |why: String| {
        ServerError::Startup(format!(
            "cannot load definitions from {}: {why} (fix the file or drop --load-definitions)",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let defs: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
    let report = http::import_definitions(broker, &defs, None).map_err(fail)?;
    tracing::info!(
        queues = report.queues,
        exchanges = report.exchanges,
        bindings = report.bindings,
        users = report.access.users,
        permissions = report.access.permissions,
        not_imported = report.not_imported.len(),
        "definitions loaded from {}",
        path.display()
    );
    Ok(())
}

/// Starts the server: binds, logs the ready line, serves until shut down.
pub async fn start(config: Config) -> Result<Running, ServerError> {
    config.validate()?;
    raise_nofile_limit();
    let locks = lock_data_dirs(&config.store.data_dirs)?;
    let mut listeners = Vec::new();
    for a in &config.net.amqp_listen {
        match bind(a) {
            Ok(l) => listeners.push(l),
            // A host without IPv6 still serves IPv4 with the default config.
            Err(e) if a.starts_with("[::]") && config.net.amqp_listen.len() > 1 => {
                tracing::warn!("skipping {a}: {e}");
            }
            Err(e) => return Err(e),
        }
    }
    let amqp_addrs: Vec<SocketAddr> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let tls = if config.net.amqps_listen.is_empty() && config.net.https_listen.is_empty() {
        None
    } else {
        Some(Arc::new(tls::Tls::new(&config.tls)?))
    };
    let mut amqps_listeners = Vec::new();
    for a in &config.net.amqps_listen {
        amqps_listeners.push(bind(a)?);
    }
    let amqps_addrs: Vec<SocketAddr> = amqps_listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let mut http_listeners = Vec::new();
    for a in &config.net.http_listen {
        http_listeners.push(bind(a)?);
    }
    let http_addrs: Vec<SocketAddr> = http_listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let mut https_listeners = Vec::new();
    for a in &config.net.https_listen {
        https_listeners.push(bind(a)?);
    }
    let https_addrs: Vec<SocketAddr> = https_listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let (broker, journal) = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || journal::open_broker(&config))
            .await
            .map_err(|e| ServerError::Startup(format!("store recovery did not finish: {e}")))??
    };
    if let Some(path) = &config.management.load_definitions {
        load_definitions(&broker, path)?;
    }
    let shared = Arc::new(Shared {
        broker: Arc::clone(&broker),
        config: Arc::new(config),
        registry: Arc::new(registry::Registry::default()),
        disk: Arc::default(),
        logins: auth::LoginThrottle::default(),
    });
    let (tx, rx) = watch::channel(false);
    disk::spawn_watch(
        Arc::clone(&shared.disk),
        shared.config.store.data_dirs.clone(),
        shared.config.limits.disk_free_bytes_min,
        rx.clone(),
    );
    let open = Arc::new(AtomicUsize::new(0));
    let all_addrs: Arc<Vec<SocketAddr>> = Arc::new(
        amqp_addrs
            .iter()
            .chain(&http_addrs)
            .chain(&https_addrs)
            .copied()
            .collect(),
    );
    if !http_listeners.is_empty() || !https_listeners.is_empty() {
        tokio::spawn(http::sample_rates(Arc::clone(&broker), rx.clone()));
    }
    for l in http_listeners {
        let app = http::router(http::HttpState {
            shared: Arc::clone(&shared),
            connections: Arc::clone(&open),
            listeners: Arc::clone(&all_addrs),
            journal: Arc::clone(&journal),
        });
        let mut stop = rx.clone();
        tokio::spawn(async move {
            let served = axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move {
                    let _sender_dropped_means_stop_too = stop.changed().await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "HTTP listener failed");
            }
        });
    }
    if let Some(tls) = &tls {
        for l in https_listeners {
            let app = http::router(http::HttpState {
                shared: Arc::clone(&shared),
                connections: Arc::clone(&open),
                listeners: Arc::clone(&all_addrs),
                journal: Arc::clone(&journal),
            });
            let timeout = Duration::from_millis(shared.config.net.handshake_timeout_ms);
            https::serve(tls, l, app, timeout, &rx).map_err(|source| ServerError::Bind {
                addr: "net.https_listen".to_owned(),
                source,
            })?;
        }
        tls_side::start(tls, amqps_listeners, &shared, &rx, &open);
    }
    let task = tokio::spawn(serve(listeners, shared, rx, open));
    let list: Vec<String> = amqp_addrs.iter().map(ToString::to_string).collect();
    let mut ready = format!("berth ready amqp={}", list.join(","));
    if !http_addrs.is_empty() {
        let h: Vec<String> = http_addrs.iter().map(ToString::to_string).collect();
        ready.push_str(&format!(" http={}", h.join(",")));
    }
    if !amqps_addrs.is_empty() {
        let s: Vec<String> = amqps_addrs.iter().map(ToString::to_string).collect();
        ready.push_str(&format!(" amqps={}", s.join(",")));
    }
    if !https_addrs.is_empty() {
        let s: Vec<String> = https_addrs.iter().map(ToString::to_string).collect();
        ready.push_str(&format!(" https={}", s.join(",")));
    }
    tracing::info!("{ready}");
    Ok(Running {
        amqp_addrs,
        amqps_addrs,
        http_addrs,
        journal,
        broker,
        shutdown: tx,
        task,
        _locks: locks,
    })
}

async fn serve(
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
) {
    let timers = {
        let broker = Arc::clone(&shared.broker);
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(limits::TIMER_TICK_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => broker.run_timers(Instant::now()),
                    _ = stop.changed() => break,
                }
            }
        })
    };
    let next_id = Arc::new(AtomicU64::new(1));
    let mut accepts = Vec::new();
    for l in listeners {
        accepts.push(tokio::spawn(accept_loop(
            l,
            Arc::clone(&shared),
            shutdown.clone(),
            Arc::clone(&open),
            Arc::clone(&next_id),
        )));
    }
    let mut stop = shutdown.clone();
    let _sender_dropped_means_stop_too = stop.changed().await;
    for a in accepts {
        a.abort();
    }
    timers.abort();
    let deadline = Instant::now() + Duration::from_millis(limits::SHUTDOWN_GRACE_MS);
    while open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(limits::SHUTDOWN_POLL_MS)).await;
    }
    tracing::info!("berth stopped");
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
    next_id: Arc<AtomicU64>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(limits::ACCEPT_BACKOFF_MS)).await;
                continue;
            }
        };
        let max = shared.config.limits.connections_max;
        if max > 0 && open.load(Ordering::Acquire) >= max {
            tracing::warn!(%peer, max, "connection refused: limits.connections_max reached");
            drop(stream);
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(&shared);
        let shutdown = shutdown.clone();
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            handle(stream, peer, id, shared, shutdown).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    connection::serve(stream, peer, id, shared, shutdown).await;
}
