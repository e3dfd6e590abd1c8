//! The networked broker, assembled: binds the listeners ([`listen`]),
//! opens the store and the broker, builds the shared state ([`state`]),
//! starts the management API ([`http`]) and the AMQP accept loops
//! ([`accept`]) with the broker's timers, and shuts it all down.
//! Everything else lives in a module of its own; this file only wires
//! them together, and no module imports from it but [`ServerError`] and
//! [`Config`].
//!
//! Invariants:
//! - The broker logs exactly one `berth ready amqp=ADDR[,ADDR...]` line once
//!   every listener is bound, so scripts can find the ports it picked.
//! - On shutdown every connection is sent `connection.close 320` and given a
//!   bounded time to go.

mod accept;
pub mod auth;
pub mod cert_login;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod disk;
pub mod event_log;
pub mod field_json;
mod handshake_slots;
pub mod http;
mod https;
mod in_order;
pub mod limits;
mod listen;
pub mod mechanism;
pub mod memory;
pub mod mqtt;
pub mod outbound;
pub mod pending_output;
pub mod permissions;
pub mod registry;
pub mod reshape;
pub mod settings;
pub mod shovel;
pub mod socket;
pub mod state;
pub mod stats;
pub mod store_journal;
pub mod stream_proto;
pub mod throttle;
pub mod tls;

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

use accept::{Accepting, Transport};
pub use config::Config;
use listen::{Bound, Ipv6};
use state::Shared;

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
    /// The MQTT listeners (`net.mqtt_listen`; none by default).
    pub mqtt_addrs: Vec<SocketAddr>,
    /// The cluster listener, for a cluster member.
    pub cluster_addr: Option<SocketAddr>,
    /// The broker being served: from the start on a single node; on a
    /// cluster member, from when it leads.
    serving: Arc<parking_lot::Mutex<Option<Serving>>>,
    /// A member's task that waits to lead and then serves.
    member: Option<tokio::task::JoinHandle<()>>,
    _locks: Vec<File>,
}

/// A broker being served and what stops it.
struct Serving {
    journal: Arc<store_journal::StoreJournal>,
    /// For the removals still waiting at shutdown (dead-lettering).
    broker: Arc<berth_broker::Broker>,
    /// Stopped first at shutdown, so their own connections to this
    /// broker do not hold up its grace period.
    shovels: Option<Arc<shovel::Shovels>>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Asks every connection to close and waits (bounded) for the server to
    /// stop.
    pub async fn shutdown(self) {
        if let Some(member) = &self.member {
            member.abort();
        }
        let serving = self.serving.lock().take();
        if let Some(serving) = serving {
            serving.shutdown().await;
        }
    }
}

impl Serving {
    async fn shutdown(self) {
        if let Some(shovels) = &self.shovels {
            shovels.stop_all();
        }
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

/// Imports a RabbitMQ definitions file (`management.load_definitions`).
fn load_definitions(
    broker: &berth_broker::Broker,
    shovels: Option<&shovel::Shovels>,
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
    let report = http::import_definitions(broker, shovels, &defs, None).map_err(fail)?;
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

/// Every listener, bound.
struct Listeners {
    amqp: Bound,
    amqps: Bound,
    http: Bound,
    https: Bound,
    mqtt: Bound,
    stream: Bound,
    mqtts: Bound,
    mqtt_ws: Bound,
    tls: Option<Arc<tls::Tls>>,
}

fn bind_listeners(config: &Config) -> Result<Listeners, ServerError> {
    let net = &config.net;
    let amqp = listen::bind_all(&net.amqp_listen, Ipv6::SkipWhenUnavailable)?;
    let tls = if net.amqps_listen.is_empty()
        && net.https_listen.is_empty()
        && net.mqtts_listen.is_empty()
    {
        None
    } else {
        Some(Arc::new(tls::Tls::new(&config.tls)?))
    };
    Ok(Listeners {
        amqp,
        amqps: listen::bind_all(&net.amqps_listen, Ipv6::Required)?,
        http: listen::bind_all(&net.http_listen, Ipv6::Required)?,
        https: listen::bind_all(&net.https_listen, Ipv6::Required)?,
        mqtt: listen::bind_all(&net.mqtt_listen, Ipv6::Required)?,
        stream: listen::bind_all(&net.stream_listen, Ipv6::Required)?,
        mqtts: listen::bind_all(&net.mqtts_listen, Ipv6::Required)?,
        mqtt_ws: listen::bind_all(&net.mqtt_ws_listen, Ipv6::Required)?,
        tls,
    })
}

/// Starts the server: binds, logs the ready line, serves until shut down.
pub async fn start(config: Config) -> Result<Running, ServerError> {
    config.validate()?;
    raise_nofile_limit();
    let locks = lock_data_dirs(&config.store.data_dirs)?;
    let listeners = bind_listeners(&config)?;
    if config.cluster.node_id.is_some() {
        if let Some(s) = config.shovels.first() {
            return Err(ServerError::Startup(format!(
                "static shovel [shovels.{}]: shovels are not supported on a cluster member yet \
                 (docs/SHOVELS.md)",
                s.name
            )));
        }
        return start_member(config, listeners, locks).await;
    }
    let (broker, journal) = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || store_journal::open_broker(&config))
            .await
            .map_err(|e| ServerError::Startup(format!("store recovery did not finish: {e}")))??
    };
    // Started once the listeners are bound, so a shovel whose URI is this
    // broker connects (its accept loop starts in `serve_broker`); before
    // the definitions file, which may hold shovels.
    let dir = config.store.data_dirs.first().cloned();
    let statics = config.shovels.clone();
    let shovels =
        shovel::Shovels::start(dir, http::node_name().to_owned(), statics).map_err(|e| {
            ServerError::Startup(format!(
                "cannot load the shovels: {e} (fix the file or move it aside)"
            ))
        })?;
    if let Some(path) = &config.management.load_definitions {
        load_definitions(&broker, Some(&shovels), path)?;
    }
    let ready = ready_line(&listeners, None);
    let (amqp_addrs, amqps_addrs, http_addrs, mqtt_addrs) = (
        listeners.amqp.addrs.clone(),
        listeners.amqps.addrs.clone(),
        listeners.http.addrs.clone(),
        listeners.mqtt.addrs.clone(),
    );
    let serving = serve_broker(config, listeners, (broker, Some(shovels)), journal, None)?;
    tracing::info!("{ready}");
    Ok(Running {
        amqp_addrs,
        amqps_addrs,
        http_addrs,
        mqtt_addrs,
        cluster_addr: None,
        serving: Arc::new(parking_lot::Mutex::new(Some(serving))),
        member: None,
        _locks: locks,
    })
}

/// A listener's twin on the same socket, so a follower can answer on it
/// and hand the original on untouched when it starts to lead.
fn twin(l: &TcpListener) -> Result<TcpListener, ServerError> {
    let addr = l
        .local_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    let fail = |source| ServerError::Bind {
        addr: addr.clone(),
        source,
    };
    let std = socket2::SockRef::from(l).try_clone().map_err(fail)?;
    let std: std::net::TcpListener = std.into();
    std.set_nonblocking(true).map_err(fail)?;
    TcpListener::from_std(std).map_err(fail)
}

/// A cluster member: starts Raft and turns clients away until this member
/// leads, then serves the broker from its replica; a member that stops
/// leading restarts (see [`cluster::member`]).
async fn start_member(
    config: Config,
    listeners: Listeners,
    locks: Vec<File>,
) -> Result<Running, ServerError> {
    let member = Arc::new(cluster::member::Member::start(&config).await?);
    let view = Arc::clone(&member.view);
    let handshake = Duration::from_millis(config.net.handshake_timeout_ms);
    let mut follower = Vec::new();
    let secure = listeners.tls.as_ref().map(|t| t.acceptor());
    let amqp = (listeners.amqp.listeners.iter()).map(|l| (l, None));
    let amqps = (listeners.amqps.listeners.iter()).map(|l| (l, secure.clone()));
    for (l, tls) in amqp.chain(amqps) {
        let l = twin(l)?;
        follower.push(tokio::spawn(cluster::redirect::turn_away(
            l,
            Arc::clone(&view),
            handshake,
            tls,
        )));
    }
    let ws = mqtt::ws::Bounds {
        message_bytes_max: usize::try_from(config.limits.message_size_bytes_max)
            .unwrap_or(usize::MAX),
        timeout: handshake,
    };
    let mqtt_plain = (listeners.mqtt.listeners.iter()).map(|l| (l, mqtt::follower::Over::Plain));
    let mqtt_ws =
        (listeners.mqtt_ws.listeners.iter()).map(|l| (l, mqtt::follower::Over::WebSocket(ws)));
    let mqtts = (listeners.mqtts.listeners.iter())
        .filter_map(|l| Some((l, mqtt::follower::Over::Tls(secure.clone()?))));
    for (l, over) in mqtt_plain.chain(mqtt_ws).chain(mqtts) {
        follower.push(tokio::spawn(mqtt::follower::turn_away(
            twin(l)?,
            over,
            Arc::clone(&view),
            handshake,
        )));
    }
    for l in &listeners.stream.listeners {
        follower.push(tokio::spawn(stream_proto::follower::turn_away(
            twin(l)?,
            Arc::clone(&view),
            handshake,
        )));
    }
    let follower_http = || {
        http::follower::router(http::follower::Follower {
            view: Arc::clone(&view),
            data_dirs: config.store.data_dirs.clone(),
            disk_free_bytes_min: config.limits.disk_free_bytes_min,
            listeners: (listeners.amqp.addrs.iter())
                .chain(&listeners.amqps.addrs)
                .chain(&listeners.http.addrs)
                .chain(&listeners.https.addrs)
                .chain(&listeners.mqtt.addrs)
                .chain(&listeners.stream.addrs)
                .copied()
                .collect(),
        })
    };
    for l in &listeners.http.listeners {
        let app = follower_http();
        let l = twin(l)?;
        follower.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!(error = %e, "HTTP listener failed");
            }
        }));
    }
    // HTTPS answers as HTTP does, after the TLS handshake; stopped when
    // this member starts to lead (its twin listeners close then).
    let (stop_https, https_stopped) = tokio::sync::watch::channel(false);
    if let Some(tls) = &listeners.tls {
        let timeout = Duration::from_millis(config.net.tls_handshake_timeout_ms);
        for l in &listeners.https.listeners {
            let app = follower_http();
            https::serve(tls, twin(l)?, app, timeout, &https_stopped).map_err(|source| {
                ServerError::Bind {
                    addr: "net.https_listen".to_owned(),
                    source,
                }
            })?;
        }
    }
    let ready = ready_line(&listeners, Some(member.cluster_addr));
    let serves = cluster::view::Serves {
        amqp: listeners.amqp.addr_list(),
        http: listeners.http.addr_list(),
    };
    let running = Running {
        amqp_addrs: listeners.amqp.addrs.clone(),
        amqps_addrs: listeners.amqps.addrs.clone(),
        http_addrs: listeners.http.addrs.clone(),
        mqtt_addrs: listeners.mqtt.addrs.clone(),
        cluster_addr: Some(member.cluster_addr),
        serving: Arc::default(),
        member: None,
        _locks: locks,
    };
    let slot = Arc::clone(&running.serving);
    let task = tokio::spawn(async move {
        member.until_leading(&serves).await;
        for t in &follower {
            t.abort();
        }
        let _no_https_is_fine = stop_https.send(true);
        let served = lead(&config, listeners, &member).await;
        match served {
            Ok(serving) => {
                *slot.lock() = Some(serving);
                tracing::info!(member = %member.view.name, "berth leader serving clients");
                let why = member.until_deposed().await;
                cluster::member::restart(&why);
            }
            Err(e) => cluster::member::restart(&format!("could not open the broker: {e}")),
        }
    });
    tracing::info!("{ready}");
    Ok(Running {
        member: Some(task),
        ..running
    })
}

/// A new leader opens its broker from its replica (closed and reopened,
/// as after a restart) and serves it, every journal write through Raft.
async fn lead(
    config: &Config,
    listeners: Listeners,
    member: &Arc<cluster::member::Member>,
) -> Result<Serving, ServerError> {
    let node = Arc::clone(&member.view.node);
    let replica = Arc::clone(&member.replica);
    let raft = member.raft_runtime();
    let opened = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            // The store is swapped while no command is applied; the broker
            // is built after (building it may propose, e.g. the default
            // vhost, and commits need this member to apply).
            let mut recovered = None;
            let journal = replica
                .reopen(|old| {
                    old.store.close().map_err(|e| e.to_string())?;
                    let (store, r) =
                        berth_store::Store::open(cluster::member::store_config(&config))
                            .map_err(|e| e.to_string())?;
                    recovered = Some(r);
                    Ok::<_, String>(Arc::new(store_journal::StoreJournal {
                        store,
                        events: std::sync::OnceLock::new(),
                    }))
                })
                .map_err(ServerError::Startup)?;
            let mut recovered = recovered.expect("set when reopened");
            store_journal::broker_from(&config, journal, &mut recovered, started, |j| {
                Arc::new(cluster::replicated::ReplicatedJournal::start(
                    node,
                    Arc::clone(j),
                    &raft,
                )) as Arc<dyn berth_broker::durable::Journal>
            })
        })
        .await
        .map_err(|e| ServerError::Startup(format!("store recovery did not finish: {e}")))??
    };
    let (broker, journal) = opened;
    serve_broker(
        config.clone(),
        listeners,
        (broker, None),
        journal,
        Some(Arc::clone(&member.view)),
    )
}

/// Serves `broker` on every listener: the management API, the AMQP
/// accept loops and the broker's timers.
fn serve_broker(
    config: Config,
    listeners: Listeners,
    (broker, shovels): (Arc<berth_broker::Broker>, Option<Arc<shovel::Shovels>>),
    journal: Arc<store_journal::StoreJournal>,
    cluster: Option<Arc<cluster::view::ClusterView>>,
) -> Result<Serving, ServerError> {
    let Listeners {
        amqp,
        amqps,
        http,
        https,
        mqtt,
        stream,
        mqtts,
        mqtt_ws,
        tls,
    } = listeners;
    let logins = throttle::LoginThrottle::new(config.auth.login_failures_per_s_max);
    let shared = Arc::new(Shared {
        broker: Arc::clone(&broker),
        config: Arc::new(config),
        registry: Arc::new(registry::Registry::default()),
        disk: Arc::default(),
        logins,
        cluster,
        shovels: shovels.clone(),
    });
    let (tx, rx) = watch::channel(false);
    disk::spawn_watch(
        Arc::clone(&shared.disk),
        shared.config.store.data_dirs.clone(),
        shared.config.limits.disk_free_bytes_min,
        rx.clone(),
    );
    let accepting = Accepting {
        shared: Arc::clone(&shared),
        shutdown: rx.clone(),
        open: Arc::new(AtomicUsize::new(0)),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let state = http::HttpState {
        shared: Arc::clone(&shared),
        connections: Arc::clone(&accepting.open),
        listeners: Arc::new(
            amqp.addrs
                .iter()
                .chain(&http.addrs)
                .chain(&https.addrs)
                .copied()
                .collect(),
        ),
        journal: Arc::clone(&journal),
    };
    serve_http(state, http.listeners, https.listeners, tls.as_ref(), &rx)?;
    let mut listeners: Vec<(TcpListener, Transport)> = amqp
        .listeners
        .into_iter()
        .map(|l| (l, Transport::Plain))
        .collect();
    if let Some(tls) = &tls {
        let tls_listeners = amqps.listeners.into_iter();
        listeners.extend(tls_listeners.map(|l| (l, Transport::Tls(Arc::clone(tls)))));
        tls::reload_on_sighup(tls, &rx);
    }
    let mut mqtt: Vec<_> = (mqtt.listeners.into_iter())
        .map(|l| (l, mqtt::accept::Transport::Plain))
        .collect();
    if let Some(tls) = &tls {
        let secure = mqtt::accept::Transport::Tls(Arc::clone(tls));
        mqtt.extend(mqtts.listeners.into_iter().map(|l| (l, secure.clone())));
    }
    let ws = mqtt_ws.listeners.into_iter();
    mqtt.extend(ws.map(|l| (l, mqtt::accept::Transport::WebSocket)));
    let task = tokio::spawn(serve(listeners, (mqtt, stream.listeners), accepting));
    Ok(Serving {
        journal,
        broker,
        shovels,
        shutdown: tx,
        task,
    })
}

/// `berth ready amqp=ADDR[,ADDR...]`, then ` http=`, ` amqps=`,
/// ` https=`, ` mqtt=`, ` mqtts=`, ` mqtt-ws=` and ` cluster=` for the
/// kinds that have listeners.
fn ready_line(l: &Listeners, cluster: Option<SocketAddr>) -> String {
    let mut ready = format!("berth ready amqp={}", l.amqp.addr_list());
    for (kind, bound) in [
        ("http", &l.http),
        ("amqps", &l.amqps),
        ("https", &l.https),
        ("mqtt", &l.mqtt),
        ("stream", &l.stream),
        ("mqtts", &l.mqtts),
        ("mqtt-ws", &l.mqtt_ws),
    ] {
        if !bound.addrs.is_empty() {
            ready.push_str(&format!(" {kind}={}", bound.addr_list()));
        }
    }
    if let Some(addr) = cluster {
        ready.push_str(&format!(" cluster={addr}"));
    }
    ready
}

/// Serves the management API (one router, cloned for each listener) on
/// every HTTP and HTTPS listener, and samples queue rates while any is
/// there.
fn serve_http(
    state: http::HttpState,
    plain: Vec<TcpListener>,
    secure: Vec<TcpListener>,
    tls: Option<&Arc<tls::Tls>>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), ServerError> {
    if !plain.is_empty() || !secure.is_empty() {
        tokio::spawn(http::sample_rates(
            Arc::clone(&state.shared.broker),
            shutdown.clone(),
        ));
    }
    let timeout = Duration::from_millis(state.shared.config.net.tls_handshake_timeout_ms);
    let app = http::router(state);
    for l in plain {
        let app = app.clone();
        let mut stop = shutdown.clone();
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
    if let Some(tls) = tls {
        for l in secure {
            https::serve(tls, l, app.clone(), timeout, shutdown).map_err(|source| {
                ServerError::Bind {
                    addr: "net.https_listen".to_owned(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

/// The server's task: the broker's timers and one accept loop per AMQP
/// and MQTT listener until shutdown, then a bounded wait for the
/// connections to go.
async fn serve(
    listeners: Vec<(TcpListener, Transport)>,
    (mqtt, stream): (
        Vec<(TcpListener, mqtt::accept::Transport)>,
        Vec<TcpListener>,
    ),
    a: Accepting,
) {
    let timers = {
        let broker = Arc::clone(&a.shared.broker);
        let mut stop = a.shutdown.clone();
        // Work finished on another thread (a stream write that a reader
        // waits for) asks for a run now rather than at the next tick.
        let wake = Arc::new(tokio::sync::Notify::new());
        let waker = Arc::clone(&wake);
        if !broker.set_timer_waker(Box::new(move || waker.notify_one())) {
            tracing::warn!("the broker's timer waker was set already; keeping the first");
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(limits::TIMER_TICK_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => broker.run_timers(Instant::now()),
                    () = wake.notified() => broker.run_timers(Instant::now()),
                    _ = stop.changed() => break,
                }
            }
        })
    };
    let mut accepts: Vec<_> = listeners
        .into_iter()
        .map(|(l, transport)| tokio::spawn(accept::accept_loop(l, transport, a.clone())))
        .collect();
    let mqtt_clients = Arc::new(mqtt::clients::Clients::default());
    let mqtt_retained = Arc::new(mqtt::retained::Stores::default());
    accepts.extend(mqtt.into_iter().map(|(l, transport)| {
        let clients = Arc::clone(&mqtt_clients);
        let retained = Arc::clone(&mqtt_retained);
        tokio::spawn(mqtt::accept::accept_loop(
            l,
            transport,
            a.clone(),
            clients,
            retained,
        ))
    }));
    if !stream.is_empty() {
        let dir = a.shared.config.store.data_dirs.first().cloned();
        let tracking = Arc::new(stream_proto::tracking::Tracking::open(dir));
        accepts.extend(stream.into_iter().map(|l| {
            let tracking = Arc::clone(&tracking);
            tokio::spawn(stream_proto::accept::accept_loop(l, a.clone(), tracking))
        }));
    }
    let mut stop = a.shutdown.clone();
    let _sender_dropped_means_stop_too = stop.changed().await;
    for task in accepts {
        task.abort();
    }
    timers.abort();
    let deadline = Instant::now() + Duration::from_millis(limits::SHUTDOWN_GRACE_MS);
    while a.open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(limits::SHUTDOWN_POLL_MS)).await;
    }
    tracing::info!("berth stopped");
}
