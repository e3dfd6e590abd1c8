//! One stream protocol connection: the task that owns the socket's read
//! half, walks the handshake (PeerProperties, SaslHandshake,
//! SaslAuthenticate, Tune, Open), then reads commands and acts on them
//! (`commands.rs`); its writer task owns the write half and drains
//! [`StreamOut`].
//!
//! Invariants:
//! - Every wait is bounded: the handshake by `net.handshake_timeout_ms`,
//!   a silent client by two heartbeat intervals, the last writes by
//!   `CLOSE_TIMEOUT_MS`.
//! - Before Open succeeded a frame may be at most
//!   `STREAM_PROTO_INITIAL_FRAME_BYTES_MAX`; after it, the frame_max of
//!   Tune. A larger frame closes the connection (FrameTooLarge) before
//!   it is buffered.
//! - The socket is not read while the store's queues are full, while
//!   `STREAM_PROTO_PUBLISHES_UNCONFIRMED_MAX` confirms are owed, while
//!   the output is over twice its bound, or (for a client that
//!   published) while a resource alarm is on.
//! - A bad frame ends this connection only, with a Close that names the
//!   problem's response code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Session as BrokerSession};
use berth_broker::vhost::VHost;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use super::frame::{self, code, key, Frame, FrameError, Request};
use super::outlet::StreamOut;
use super::publish::{Confirms, Publisher, Stored};
use super::tracking::Tracking;
use crate::limits;
use crate::state::Shared;

/// Why a connection ended.
pub enum End {
    /// The client closed (Close, answered) or we closed and it answered.
    Closed,
    /// The socket closed or failed.
    Lost(String),
    /// We end it: the code the client's Close says, and the cause.
    Refuse(u16, String),
}

/// Where the handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Until SaslAuthenticate succeeded.
    Login,
    /// Logged in, Tune sent: waiting for the client's Tune and Open.
    Tuning,
    Open,
}

/// A connection's state.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) tracking: Arc<Tracking>,
    pub(super) peer: SocketAddr,
    /// Our end of the socket: the address Metadata names.
    pub(super) local: SocketAddr,
    pub(super) id: u64,
    rd: OwnedReadHalf,
    rbuf: BytesMut,
    pub(super) out: Arc<StreamOut>,
    pub(super) stage: Stage,
    /// The largest frame read now.
    frame_max: u32,
    /// Negotiated in Tune.
    tuned_frame_max: u32,
    heartbeat: Option<Duration>,
    last_read: Instant,
    last_heartbeat_sent: Instant,
    pub(super) user: String,
    pub(super) vhost: Option<Arc<VHost>>,
    pub(super) session: Option<Arc<BrokerSession>>,
    /// The broker channel publishes go through.
    pub(super) publish_ch: Option<Arc<Channel>>,
    /// Each subscription's own broker channel.
    pub(super) subscriptions: HashMap<u8, Arc<Channel>>,
    pub(super) publishers: HashMap<u8, Publisher>,
    pub(super) confirms: Confirms,
    stored_rx: mpsc::UnboundedReceiver<Stored>,
    /// This client published: the resource alarms stop reading it.
    pub(super) has_published: bool,
}

/// Serves one accepted TCP connection until it ends.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: Arc<Shared>,
    tracking: Arc<Tracking>,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let local = stream.local_addr().unwrap_or(peer);
    let (rd, wr) = stream.into_split();
    let out = StreamOut::new(limits::STREAM_PROTO_OUTPUT_BYTES_MAX);
    let writer = tokio::spawn(write_loop(wr, Arc::clone(&out)));
    let (tx, stored_rx) = mpsc::unbounded_channel();
    let mut c = Conn {
        shared,
        tracking,
        peer,
        local,
        id,
        rd,
        rbuf: BytesMut::with_capacity(64 * 1024),
        out: Arc::clone(&out),
        stage: Stage::Login,
        frame_max: limits::STREAM_PROTO_INITIAL_FRAME_BYTES_MAX,
        tuned_frame_max: limits::STREAM_PROTO_FRAME_BYTES_MAX,
        heartbeat: None,
        last_read: Instant::now(),
        last_heartbeat_sent: Instant::now(),
        user: String::new(),
        vhost: None,
        session: None,
        publish_ch: None,
        subscriptions: HashMap::new(),
        publishers: HashMap::new(),
        confirms: Confirms::new(tx),
        stored_rx,
        has_published: false,
    };
    let end = c.run(shutdown).await;
    match &end {
        End::Closed => tracing::debug!(%peer, "stream connection closed"),
        End::Lost(why) => tracing::info!(%peer, "stream connection closed: {why}"),
        End::Refuse(code, why) => {
            tracing::info!(%peer, code, "stream connection closed by the server: {why}");
            out.push(|b| frame::put_close(b, 1, *code, why));
        }
    }
    c.finish();
    out.close();
    let close_wait = Duration::from_millis(limits::CLOSE_TIMEOUT_MS);
    if tokio::time::timeout(close_wait, writer).await.is_err() {
        tracing::debug!(%peer, "stream writer did not finish in time");
    }
}

impl Conn {
    /// Whether the socket may be read now (see the module's invariants).
    fn may_read(&self) -> bool {
        if !self.shared.broker.journal_has_room()
            || self.confirms.len() >= limits::STREAM_PROTO_PUBLISHES_UNCONFIRMED_MAX
            || self.out.is_full()
        {
            return false;
        }
        if self.has_published {
            let watermark = self.shared.config.limits.memory_high_watermark();
            if crate::memory::used_bytes() > watermark || self.shared.disk.is_on() {
                return false;
            }
        }
        true
    }

    /// Reads and handles frames until the connection ends.
    async fn run(&mut self, mut shutdown: watch::Receiver<bool>) -> End {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::CONNECTION_TICK_MS));
        let out = Arc::clone(&self.out);
        let shared = Arc::clone(&self.shared);
        let handshake_deadline =
            Instant::now() + Duration::from_millis(shared.config.net.handshake_timeout_ms);
        loop {
            while self.may_read() {
                match frame::decode(&mut self.rbuf, self.frame_max) {
                    Ok(Some(r)) => {
                        if let Err(end) = self.handle(r).await {
                            return end;
                        }
                    }
                    Ok(None) => break,
                    Err(e @ FrameError::TooLarge { .. }) => {
                        return End::Refuse(code::FRAME_TOO_LARGE, e.to_string())
                    }
                    Err(e) => return End::Refuse(code::UNKNOWN_FRAME, e.to_string()),
                }
            }
            let reading = self.may_read();
            let journal_full = !shared.broker.journal_has_room();
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(64 * 1024);
            }
            tokio::select! {
                r = self.rd.read_buf(&mut self.rbuf), if reading => match r {
                    Ok(0) => return End::Lost("closed by the client".into()),
                    Ok(_) => self.last_read = Instant::now(),
                    Err(e) => return End::Lost(format!("read failed: {e}")),
                },
                Some(s) = self.stored_rx.recv() => {
                    self.confirms.stored_all(s, &mut self.stored_rx);
                    self.send_due_confirms();
                }
                () = out.wake_connection.notified() => self.settle(),
                _ = shutdown.changed() => {
                    return End::Refuse(code::OK, "server shutting down".into());
                }
                () = std::future::poll_fn(|cx| shared.broker.poll_journal_room(cx)), if journal_full => {}
                _ = tick.tick() => {
                    if let Err(end) = self.on_tick(handshake_deadline) {
                        return end;
                    }
                }
            }
        }
    }

    fn on_tick(&mut self, handshake_deadline: Instant) -> Result<(), End> {
        if self.stage != Stage::Open && Instant::now() > handshake_deadline {
            return Err(End::Lost("handshake not completed in time".into()));
        }
        if let Some(h) = self.heartbeat {
            if self.last_read.elapsed() > 2 * h {
                return Err(End::Lost(format!(
                    "nothing read for {:?} (two heartbeats)",
                    2 * h
                )));
            }
            if self.last_heartbeat_sent.elapsed() >= h {
                self.last_heartbeat_sent = Instant::now();
                self.out
                    .push(|b| Frame::begin(b, key::HEARTBEAT, 1).finish());
            }
        }
        self.tracking.save_if_due(false);
        self.settle();
        Ok(())
    }

    /// Acks to the broker what went out in chunks: on a stream an ack
    /// only gives the consumer its credit back.
    fn settle(&mut self) {
        let now = self.shared.broker.now();
        let acks = self.out.take_acks();
        if !acks.is_empty() {
            let subscriptions = &self.subscriptions;
            self.out.settling(|| {
                for (id, tag) in acks {
                    if let Some(ch) = subscriptions.get(&id) {
                        if let Err(e) = ch.ack(tag, true, now) {
                            tracing::debug!(error = %e.reply_text(), "stream subscription ack");
                        }
                    }
                }
            });
        }
        if self.out.take_resume() {
            for ch in self.subscriptions.values() {
                ch.resume(now);
            }
        }
    }

    /// Sends the confirms and errors that are due, and notes named
    /// publishers' sequences.
    pub(super) fn send_due_confirms(&mut self) {
        let due = self.confirms.due();
        if due.is_empty() {
            return;
        }
        if let Some(vhost) = &self.vhost {
            for d in due.iter().filter(|d| d.error.is_none()) {
                if let Some(Publisher {
                    stream,
                    reference: Some(r),
                    ..
                }) = self.publishers.get(&d.publisher_id)
                {
                    self.tracking
                        .confirmed(&vhost.name, stream, r, d.publishing_id);
                }
            }
        }
        self.out.push(|b| super::publish::write_due(&due, b));
    }

    /// Acts on one frame; `Err` ends the connection.
    async fn handle(&mut self, r: Request) -> Result<(), End> {
        match (self.stage, r) {
            (_, Request::Heartbeat) => Ok(()),
            (_, Request::Close { corr, code, reason }) => {
                tracing::debug!(peer = %self.peer, code, %reason, "stream client closes");
                self.out
                    .push(|b| frame::put_response(b, key::CLOSE, corr, code::OK));
                Err(End::Closed)
            }
            (_, Request::CloseResponse { .. }) => Err(End::Closed),
            (Stage::Login, Request::PeerProperties { corr, .. }) => {
                let version = env!("CARGO_PKG_VERSION");
                let props = [
                    ("product", "berth"),
                    // Clients choose commands by the RabbitMQ version:
                    // berth speaks 3.10's stream protocol.
                    ("version", "3.10.8"),
                    ("berth_version", version),
                    ("platform", "Rust"),
                ];
                self.out.push(|b| {
                    let mut f = Frame::response(b, key::PEER_PROPERTIES, corr, code::OK);
                    f.properties(props.iter().map(|(k, v)| (*k, *v)));
                    f.finish();
                });
                Ok(())
            }
            (Stage::Login, Request::SaslHandshake { corr }) => {
                self.out.push(|b| {
                    let mut f = Frame::response(b, key::SASL_HANDSHAKE, corr, code::OK);
                    f.u32(1).string(super::login::MECHANISM_PLAIN);
                    f.finish();
                });
                Ok(())
            }
            (
                Stage::Login,
                Request::SaslAuthenticate {
                    corr,
                    mechanism,
                    data,
                },
            ) => match super::login::login(&self.shared, &mechanism, &data, self.peer).await {
                Ok(user) => {
                    self.user = user;
                    self.stage = Stage::Tuning;
                    let (fm, hb) = (
                        limits::STREAM_PROTO_FRAME_BYTES_MAX,
                        limits::STREAM_PROTO_HEARTBEAT_S,
                    );
                    self.out.push(|b| {
                        frame::put_response(b, key::SASL_AUTHENTICATE, corr, code::OK);
                        let mut f = Frame::begin(b, key::TUNE, 1);
                        f.u32(fm).u32(hb);
                        f.finish();
                    });
                    Ok(())
                }
                Err(c) => {
                    self.out
                        .push(|b| frame::put_response(b, key::SASL_AUTHENTICATE, corr, c));
                    Err(End::Refuse(c, "authentication failed".into()))
                }
            },
            (
                Stage::Tuning,
                Request::Tune {
                    frame_max,
                    heartbeat_s,
                },
            ) => {
                let ours = limits::STREAM_PROTO_FRAME_BYTES_MAX;
                self.tuned_frame_max = if frame_max == 0 {
                    ours
                } else {
                    frame_max.min(ours)
                };
                self.heartbeat =
                    (heartbeat_s > 0).then(|| Duration::from_secs(u64::from(heartbeat_s)));
                Ok(())
            }
            (Stage::Tuning, Request::Open { corr, vhost }) => self.open(corr, &vhost),
            (Stage::Open, r) => self.command(r),
            (stage, r) => Err(End::Refuse(
                code::UNKNOWN_FRAME,
                format!(
                    "{} is not expected at this point of the handshake ({stage:?})",
                    name(&r)
                ),
            )),
        }
    }

    /// Open: the vhost, and the broker session for the commands.
    fn open(&mut self, corr: u32, vhost_name: &str) -> Result<(), End> {
        let refuse = |c: u16, why: String| {
            let out = Arc::clone(&self.out);
            out.push(|b| frame::put_response(b, key::OPEN, corr, c));
            Err(End::Refuse(c, why))
        };
        let Some(vhost) = self.shared.broker.vhost(vhost_name) else {
            return refuse(
                code::VIRTUAL_HOST_ACCESS_FAILURE,
                format!("no vhost '{vhost_name}'"),
            );
        };
        if let Err(e) = self
            .shared
            .broker
            .access()
            .check_vhost_access(&self.user, &vhost.name)
        {
            return refuse(code::VIRTUAL_HOST_ACCESS_FAILURE, e.reply_text());
        }
        let session = Arc::new(BrokerSession {
            connection_id: self.id,
            vhost: Arc::clone(&vhost),
            outlet: Arc::clone(&self.out) as _,
            cancel_notify: true,
            consumer_timeout_ms: None,
            user: Arc::from(self.user.as_str()),
            events: self.shared.broker.event_sink(),
        });
        self.publish_ch = Some(Channel::new(0, Arc::clone(&session)));
        self.session = Some(session);
        self.vhost = Some(vhost);
        self.stage = Stage::Open;
        self.frame_max = self.tuned_frame_max;
        self.out.set_frame_max(self.tuned_frame_max);
        let (host, port) = (self.local.ip().to_string(), self.local.port().to_string());
        self.out.push(|b| {
            let mut f = Frame::response(b, key::OPEN, corr, code::OK);
            let props = [
                ("advertised_host", host.as_str()),
                ("advertised_port", port.as_str()),
            ];
            f.properties(props.into_iter());
            f.finish();
        });
        tracing::debug!(peer = %self.peer, user = %self.user, vhost = %vhost_name, "stream client connected");
        Ok(())
    }

    /// The connection ended: its consumers and channels go, tracking is
    /// saved.
    fn finish(&mut self) {
        let now = self.shared.broker.now();
        for (_, ch) in self.subscriptions.drain() {
            ch.close(now);
        }
        if let Some(ch) = self.publish_ch.take() {
            ch.close(now);
        }
        if let Some(v) = &self.vhost {
            v.connection_closed(self.id);
        }
        self.tracking.save_if_due(true);
    }
}

/// A request's name, for log lines.
pub(super) fn name(r: &Request) -> &'static str {
    match r {
        Request::PeerProperties { .. } => "PeerProperties",
        Request::SaslHandshake { .. } => "SaslHandshake",
        Request::SaslAuthenticate { .. } => "SaslAuthenticate",
        Request::Tune { .. } => "Tune",
        Request::Open { .. } => "Open",
        Request::Close { .. } => "Close",
        Request::CloseResponse { .. } => "CloseResponse",
        Request::Heartbeat => "Heartbeat",
        Request::DeclarePublisher { .. } => "DeclarePublisher",
        Request::Publish { .. } => "Publish",
        Request::QueryPublisherSequence { .. } => "QueryPublisherSequence",
        Request::DeletePublisher { .. } => "DeletePublisher",
        Request::Subscribe { .. } => "Subscribe",
        Request::Credit { .. } => "Credit",
        Request::StoreOffset { .. } => "StoreOffset",
        Request::QueryOffset { .. } => "QueryOffset",
        Request::Unsubscribe { .. } => "Unsubscribe",
        Request::Create { .. } => "Create",
        Request::Delete { .. } => "Delete",
        Request::Metadata { .. } => "Metadata",
        Request::ExchangeCommandVersions { .. } => "ExchangeCommandVersions",
        Request::Unsupported { .. } => "an unsupported command",
    }
}

/// Writes what the connection and its subscriptions buffer until closed.
async fn write_loop(mut wr: OwnedWriteHalf, out: Arc<StreamOut>) {
    loop {
        out.flush();
        match out.take() {
            None => break,
            Some(b) if b.is_empty() => out.wake_writer.notified().await,
            Some(b) => {
                if let Err(e) = wr.write_all(&b).await {
                    tracing::debug!(error = %e, "stream write failed");
                    out.close();
                    while out.take().is_some_and(|b| !b.is_empty()) {}
                    break;
                }
                if out.may_resume() {
                    out.wake_connection.notify_one();
                }
            }
        }
    }
    let _peer_may_be_gone = wr.shutdown().await;
}
