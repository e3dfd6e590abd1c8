//! One AMQP connection: the handshake, the channel state machines, content
//! assembly, publisher confirms, and turning broker errors into
//! `channel.close` / `connection.close`.
//!
//! Invariants:
//! - A frame is checked against the negotiated `frame_max` before its
//!   payload is buffered; a bad frame closes the connection with 501, never
//!   panics, and never affects another connection.
//! - Every wait is bounded: the handshake by `handshake_timeout_ms`, a silent
//!   peer by twice the heartbeat, a close handshake by `CLOSE_TIMEOUT`, the
//!   reading after our `close-ok` by `CLOSE_DRAIN_TIMEOUT_MS`.
//! - When the connection ends, for any reason, its channels are closed
//!   (unacked messages requeued) and its exclusive queues deleted.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Published, Session};
use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::{AmqpError, AmqpResult, Broker};
use berth_protocol::codec::{self, decode_content_header, decode_method, DecodeError, Method};
use berth_protocol::frame::{
    decode_frame, Frame, FrameError, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    PROTOCOL_HEADER,
};
use berth_protocol::methods::{
    access, basic, channel as chan, confirm, connection as conn, exchange, queue, tx,
};
use berth_protocol::reply::*;
use berth_protocol::{AMQPClass, AMQPValue, FieldTable, LongString};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::Config;
use crate::outbound::Outbound;

/// How long we wait for the peer's `close-ok` after sending `close`.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long, after answering the peer's `connection.close` with `close-ok`,
/// we keep reading (and dropping) what it still sends before we close the
/// socket ourselves. RabbitMQ 3.10 waits 30 s (measured), then resets.
const CLOSE_DRAIN_TIMEOUT_MS: u64 = 30_000;
/// How often channels are checked for overdue acks (consumer timeout).
const TICK: Duration = Duration::from_millis(100);
/// Read buffer growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What every connection needs from the server.
pub struct Shared {
    pub broker: Arc<Broker>,
    pub config: Arc<Config>,
}

/// Why a connection ended.
#[derive(Debug)]
enum End {
    /// Closed cleanly (by either side's close handshake or EOF).
    Done,
    /// The peer sent `connection.close`: `close-ok` is due once the
    /// channels are closed, then the socket is drained until the peer
    /// closes it.
    PeerClose,
    /// A connection exception to report to the peer.
    Error(AmqpError),
    /// The socket failed; nothing more can be said to the peer.
    Io(std::io::Error),
}

impl From<std::io::Error> for End {
    fn from(e: std::io::Error) -> Self {
        End::Io(e)
    }
}

impl From<AmqpError> for End {
    fn from(e: AmqpError) -> Self {
        End::Error(e)
    }
}

fn frame_error(e: &FrameError) -> AmqpError {
    AmqpError::new(FRAME_ERROR, e.to_string())
}

fn decode_error(e: &DecodeError) -> AmqpError {
    match e {
        DecodeError::UnknownMethod {
            class_id,
            method_id,
        } => AmqpError::not_implemented(e.to_string()).during(*class_id, *method_id),
        DecodeError::Malformed {
            class_id,
            method_id,
        } => AmqpError::new(SYNTAX_ERROR, e.to_string()).during(*class_id, *method_id),
        _ => AmqpError::new(SYNTAX_ERROR, e.to_string()),
    }
}

/// Content being assembled on a channel.
enum Content {
    Idle,
    /// `basic.publish` seen, header expected next.
    Header(codec::Publish),
    /// Header seen, `remaining` body bytes expected.
    Body {
        publish: codec::Publish,
        properties: Bytes,
        body: BytesMut,
        remaining: u64,
    },
}

/// Publisher confirm bookkeeping for a channel in confirm mode.
///
/// A publish is confirmed once it is routed and, if it was journaled, once
/// the journal says it is stored. Acks go out as `basic.ack multiple` up to
/// the first publish still waiting for the journal.
#[derive(Default)]
struct Confirms {
    /// Sequence number of the last publish.
    last_seq: u64,
    /// Highest sequence number confirmed (acked or nacked) to the client.
    acked_upto: u64,
    /// Publishes waiting for the journal.
    waiting: BTreeSet<u64>,
    /// Publishes already nacked individually (refused, or the store failed).
    nacked: BTreeSet<u64>,
}

impl Confirms {
    /// Frames confirming everything that can be confirmed now.
    fn flush(&mut self, channel: u16, out: &mut BytesMut) {
        let frontier = self.waiting.first().map_or(self.last_seq, |w| w - 1);
        if frontier <= self.acked_upto {
            return;
        }
        let nacked_in_range = self
            .nacked
            .range(self.acked_upto + 1..=frontier)
            .next()
            .is_some();
        if nacked_in_range {
            // Rare (a refusal or a store failure): ack one by one around the nacks.
            for seq in self.acked_upto + 1..=frontier {
                if !self.nacked.contains(&seq) {
                    codec::encode_ack(out, channel, seq, false);
                }
            }
            self.nacked = self.nacked.split_off(&(frontier + 1));
        } else {
            codec::encode_ack(out, channel, frontier, frontier > self.acked_upto + 1);
        }
        self.acked_upto = frontier;
    }
}

/// A journal completion, sent from a store thread to the connection task.
/// `generation` names the channel's life it belongs to: a channel number
/// can be closed and opened again before the completions of its first life
/// arrive, and those must not confirm or commit anything of the second.
enum Stored {
    /// A publish in confirm mode.
    Confirm {
        channel: u16,
        generation: u64,
        seq: u64,
        result: Result<(), String>,
    },
    /// One of the writes a `tx.commit` waits for.
    Tx {
        channel: u16,
        generation: u64,
        result: Result<(), String>,
    },
}

/// Publishes waiting for the journal, per connection, before the broker
/// stops reading from it (back-pressure instead of unbounded bookkeeping).
const UNCONFIRMED_PER_CONNECTION_MAX: usize = 65_536;

/// Flow control, like RabbitMQ's credit flow: after a publish to a queue
/// whose consumers are busy but not keeping up, the connection stops
/// reading until they have caught up (checked every `FLOW_CHECK`), so the
/// backlog and the latency it adds stay bounded. It reads again after
/// `FLOW_PAUSE_MAX` in any case, so acks on the same connection get in.
const FLOW_CHECK: Duration = Duration::from_millis(1);
const FLOW_PAUSE_MAX: Duration = Duration::from_millis(100);

enum ChanState {
    Open,
    /// We sent `channel.close`; waiting for `close-ok`, ignoring the rest.
    Closing,
}

struct Slot {
    state: ChanState,
    ch: Arc<Channel>,
    content: Content,
    confirms: Option<Confirms>,
    /// The last queue declared on this channel, for empty queue names.
    last_queue: Option<String>,
    /// Journal writes the pending `tx.commit` still waits for.
    tx_waiting: usize,
    /// A `tx.commit-ok` is due once `tx_waiting` reaches zero.
    tx_commit_pending: bool,
    /// Which life of this channel number this is (see [`Stored`]).
    generation: u64,
}

struct Conn {
    shared: Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    rd: OwnedReadHalf,
    rbuf: BytesMut,
    out: Arc<Outbound>,
    frame_max: u32,
    channel_max: u16,
    heartbeat: Duration,
    session: Option<Arc<Session>>,
    channels: HashMap<u16, Slot>,
    last_read: Instant,
    /// We sent `connection.close` and wait for `close-ok`.
    closing_since: Option<Instant>,
    user: String,
    /// This connection published something: the memory alarm applies to it.
    has_published: bool,
    /// We stopped reading because of the memory alarm.
    blocked: bool,
    /// Flow control: not reading until this queue has caught up, or until
    /// the deadline (see [`FLOW_PAUSE_MAX`]).
    flow: Option<(Arc<berth_broker::queue::Queue>, Instant)>,
    /// The client understands `connection.blocked`.
    blocked_notify: bool,
    /// Journal completions for this connection arrive here.
    stored_tx: tokio::sync::mpsc::UnboundedSender<Stored>,
    stored_rx: tokio::sync::mpsc::UnboundedReceiver<Stored>,
    /// Confirm-mode publishes waiting for the journal, all channels.
    unconfirmed: usize,
    /// Channels opened so far: the next slot's generation.
    generations: u64,
    memory_high_watermark: u64,
}

/// Serves one accepted TCP connection until it ends.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let (rd, wr) = stream.into_split();
    let config = Arc::clone(&shared.config);
    let limits = &config.limits;
    let out = Outbound::new(
        limits.connection_output_bytes_max,
        limits.frame_size_bytes_max,
    );
    let writer = tokio::spawn(write_loop(wr, Arc::clone(&out)));
    let (stored_tx, stored_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut c = Conn {
        frame_max: limits.frame_size_bytes_max,
        channel_max: limits.channels_per_connection_max,
        shared,
        id,
        peer,
        rd,
        rbuf: BytesMut::with_capacity(READ_CHUNK_BYTES),
        out: Arc::clone(&out),
        heartbeat: Duration::ZERO,
        session: None,
        channels: HashMap::new(),
        last_read: Instant::now(),
        closing_since: None,
        user: String::new(),
        has_published: false,
        blocked: false,
        flow: None,
        blocked_notify: false,
        stored_tx,
        stored_rx,
        unconfirmed: 0,
        generations: 0,
        memory_high_watermark: limits.memory_high_watermark(),
    };
    let end = match c.handshake().await {
        Ok(true) => c.run(&mut shutdown).await,
        Ok(false) => End::Done,
        Err(e) => e,
    };
    match &end {
        End::Done | End::PeerClose => tracing::debug!(%peer, "connection closed"),
        End::Io(e) => tracing::debug!(%peer, error = %e, "connection lost"),
        End::Error(e) => {
            tracing::warn!(%peer, user = %c.user, code = e.reply_code, "closing connection: {}", e.reply_text());
            c.send_connection_close(e);
            // Give the peer a bounded chance to read the close and answer.
            let _ignored_result_of_best_effort_wait =
                tokio::time::timeout(CLOSE_TIMEOUT, c.await_close_ok()).await;
        }
    }
    c.cleanup();
    let peer_closed = matches!(end, End::PeerClose);
    if peer_closed {
        // After the channels are closed, so that nothing of theirs follows.
        c.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::CloseOk(conn::CloseOk {})),
        );
    }
    out.close();
    let wr = match tokio::time::timeout(CLOSE_TIMEOUT, writer).await {
        Ok(Ok(wr)) => Some(wr),
        _ => {
            tracing::debug!(%peer, "writer did not finish in time");
            None
        }
    };
    if peer_closed {
        c.drain_until_peer_closes(&mut shutdown).await;
    }
    if let Some(mut wr) = wr {
        let _shutdown_errors_are_irrelevant_once_closing = wr.shutdown().await;
    }
}

/// Writes whatever the connection and its queues buffered; sends heartbeats
/// when idle. Returns the write half once `out` is closed and flushed: when
/// the socket closes is the connection's decision.
async fn write_loop(mut wr: OwnedWriteHalf, out: Arc<Outbound>) -> OwnedWriteHalf {
    loop {
        let buf = out.take();
        if buf.is_empty() {
            if out.is_closed() {
                break;
            }
            // Send at half the interval, as RabbitMQ does, so a peer that
            // allows two missed intervals never gives up on us.
            let hb = Duration::from_millis(u64::from(out.heartbeat_ms() / 2));
            if hb.is_zero() {
                out.ready.notified().await;
            } else if tokio::time::timeout(hb, out.ready.notified())
                .await
                .is_err()
            {
                out.push(codec::encode_heartbeat);
            }
            continue;
        }
        if wr.write_all(&buf).await.is_err() {
            out.close();
            break;
        }
    }
    wr
}

impl Conn {
    fn send_method(&self, channel: u16, m: &AMQPClass) {
        self.out.push(|b| codec::encode_method(b, channel, m));
    }

    async fn read_more(&mut self) -> Result<(), End> {
        read_into(&mut self.rd, &mut self.rbuf).await?;
        self.last_read = Instant::now();
        Ok(())
    }

    /// Reads the next frame during the handshake.
    async fn next_frame(&mut self) -> Result<Frame, End> {
        loop {
            if let Some(f) =
                decode_frame(&mut self.rbuf, self.frame_max).map_err(|e| frame_error(&e))?
            {
                return Ok(f);
            }
            self.read_more().await?;
        }
    }

    /// Reads the next handshake method on channel 0.
    async fn next_method(&mut self) -> Result<AMQPClass, End> {
        loop {
            let f = self.next_frame().await?;
            match f.kind {
                FRAME_HEARTBEAT => continue,
                FRAME_METHOD if f.channel == 0 => {
                    return match decode_method(&f.payload) {
                        Ok(Method::Other(m)) => Ok(m),
                        Ok(Method::Publish(_)) => Err(AmqpError::channel_error(
                            "expected a connection method on channel 0",
                        )
                        .into()),
                        Err(e) => Err(decode_error(&e).into()),
                    };
                }
                _ => {
                    return Err(AmqpError::new(
                        UNEXPECTED_FRAME,
                        "expected a connection method on channel 0 during the handshake",
                    )
                    .into())
                }
            }
        }
    }

    /// Protocol header, start/start-ok, tune/tune-ok, open/open-ok.
    /// Returns `Ok(false)` if the peer is not speaking AMQP 0-9-1.
    async fn handshake(&mut self) -> Result<bool, End> {
        let timeout = Duration::from_millis(self.shared.config.net.handshake_timeout_ms);
        match tokio::time::timeout(timeout, self.handshake_inner()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::info!(peer = %self.peer, "handshake timed out after {timeout:?}");
                Ok(false)
            }
        }
    }

    async fn handshake_inner(&mut self) -> Result<bool, End> {
        while self.rbuf.len() < PROTOCOL_HEADER.len() {
            self.read_more().await?;
        }
        if self.rbuf[..PROTOCOL_HEADER.len()] != PROTOCOL_HEADER {
            tracing::info!(peer = %self.peer, header = ?&self.rbuf[..8], "not an AMQP 0-9-1 client; answering with our protocol header");
            self.out.push(|b| b.extend_from_slice(&PROTOCOL_HEADER));
            return Ok(false);
        }
        let _ = self.rbuf.split_to(PROTOCOL_HEADER.len());

        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::Start(conn::Start {
                version_major: 0,
                version_minor: 9,
                server_properties: server_properties(),
                mechanisms: "PLAIN AMQPLAIN".into(),
                locales: "en_US".into(),
            })),
        );

        let start_ok = match self.next_method().await? {
            AMQPClass::Connection(conn::AMQPMethod::StartOk(s)) => s,
            _ => {
                return Err(AmqpError::command_invalid("expected connection.start-ok")
                    .during(10, 11)
                    .into())
            }
        };
        let capabilities = client_capabilities(&start_ok.client_properties);
        self.blocked_notify = capabilities.blocked_notify;
        let (user, password) =
            match parse_credentials(start_ok.mechanism.as_str(), start_ok.response.as_bytes()) {
                Some(c) => c,
                None => {
                    return Err(AmqpError::access_refused(format!(
                    "unsupported or malformed authentication mechanism '{}'; use PLAIN or AMQPLAIN",
                    start_ok.mechanism
                ))
                    .during(10, 11)
                    .into())
                }
            };
        self.user.clone_from(&user);
        if let Err(why) = self.authenticate(&user, &password) {
            tracing::warn!(peer = %self.peer, %user, "login refused: {why}");
            return Err(AmqpError::access_refused(format!(
                "Login was refused using authentication mechanism {}. For details see the broker logfile.",
                start_ok.mechanism
            ))
            .into());
        }

        let shared = Arc::clone(&self.shared);
        let limits = &shared.config.limits;
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::Tune(conn::Tune {
                channel_max: limits.channels_per_connection_max,
                frame_max: limits.frame_size_bytes_max,
                heartbeat: self.shared.config.net.heartbeat_s,
            })),
        );
        let tune_ok = match self.next_method().await? {
            AMQPClass::Connection(conn::AMQPMethod::TuneOk(t)) => t,
            _ => {
                return Err(AmqpError::command_invalid("expected connection.tune-ok")
                    .during(10, 31)
                    .into())
            }
        };
        let server_frame_max = limits.frame_size_bytes_max;
        if tune_ok.frame_max != 0 && tune_ok.frame_max < berth_protocol::frame::FRAME_MIN_SIZE {
            return Err(AmqpError::not_allowed(format!(
                "frame_max={} < {} min size",
                tune_ok.frame_max,
                berth_protocol::frame::FRAME_MIN_SIZE
            ))
            .during(10, 31)
            .into());
        }
        if tune_ok.frame_max > server_frame_max {
            return Err(AmqpError::not_allowed(format!(
                "frame_max={} > {} max size",
                tune_ok.frame_max, server_frame_max
            ))
            .during(10, 31)
            .into());
        }
        if tune_ok.channel_max > limits.channels_per_connection_max {
            return Err(AmqpError::not_allowed(format!(
                "channel_max={} > {} max",
                tune_ok.channel_max, limits.channels_per_connection_max
            ))
            .during(10, 31)
            .into());
        }
        self.frame_max = if tune_ok.frame_max == 0 {
            server_frame_max
        } else {
            tune_ok.frame_max
        };
        self.out.set_frame_max(self.frame_max);
        self.channel_max = if tune_ok.channel_max == 0 {
            limits.channels_per_connection_max
        } else {
            tune_ok.channel_max
        };
        self.heartbeat = Duration::from_secs(u64::from(tune_ok.heartbeat));
        self.out
            .set_heartbeat_ms(u32::from(tune_ok.heartbeat) * 1000);

        let open = match self.next_method().await? {
            AMQPClass::Connection(conn::AMQPMethod::Open(o)) => o,
            _ => {
                return Err(AmqpError::command_invalid("expected connection.open")
                    .during(10, 40)
                    .into())
            }
        };
        let Some(vhost) = self.shared.broker.vhost(open.virtual_host.as_str()) else {
            return Err(
                AmqpError::not_allowed(format!("vhost {} not found", open.virtual_host))
                    .during(10, 40)
                    .into(),
            );
        };
        self.session = Some(Arc::new(Session {
            connection_id: self.id,
            vhost,
            outlet: Arc::clone(&self.out) as _,
            cancel_notify: capabilities.cancel_notify,
            consumer_timeout_ms: Some(self.shared.config.limits.consumer_timeout_ms)
                .filter(|ms| *ms > 0),
        }));
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::OpenOk(conn::OpenOk {})),
        );
        tracing::debug!(peer = %self.peer, user = %self.user, vhost = %open.virtual_host, "connection opened");
        Ok(true)
    }

    fn authenticate(&self, user: &str, password: &str) -> Result<(), &'static str> {
        let auth = &self.shared.config.auth;
        let ok = auth
            .users
            .iter()
            .any(|u| u.name == user && u.password == password);
        if !ok {
            return Err("unknown user or wrong password");
        }
        if auth.loopback_users.iter().any(|u| u == user)
            && !self.peer.ip().is_loopback()
            && !is_mapped_loopback(self.peer)
        {
            return Err("user may only connect via localhost (loopback_users)");
        }
        Ok(())
    }

    fn vhost(&self) -> &Arc<VHost> {
        &self.session.as_ref().expect("open after handshake").vhost
    }

    fn now() -> Instant {
        Instant::now()
    }

    /// The main loop: frames in, until the connection ends.
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> End {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            loop {
                match decode_frame(&mut self.rbuf, self.frame_max) {
                    Ok(Some(f)) => {
                        if let Err(e) = self.handle_frame(f) {
                            return e;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return End::Error(frame_error(&e)),
                }
            }
            self.flush_confirms();
            if self.has_published {
                self.update_blocked();
            }
            let out = Arc::clone(&self.out);
            if let Some((q, until)) = &self.flow {
                let now = Instant::now();
                if now >= *until || q.caught_up(now) {
                    self.flow = None;
                }
            }
            let paused = self.flow.is_some();
            let reading =
                !self.blocked && !paused && self.unconfirmed < UNCONFIRMED_PER_CONNECTION_MAX;
            tokio::select! {
                () = tokio::time::sleep(FLOW_CHECK), if paused => {}
                r = read_into(&mut self.rd, &mut self.rbuf), if reading => {
                    if let Err(e) = r { return e; }
                    self.last_read = Instant::now();
                }
                Some(done) = self.stored_rx.recv() => {
                    if let Err(e) = self.on_stored(done) { return e; }
                    while let Ok(more) = self.stored_rx.try_recv() {
                        if let Err(e) = self.on_stored(more) { return e; }
                    }
                }
                _ = tick.tick() => {
                    if let Err(e) = self.on_tick() { return e; }
                }
                () = out.drained.notified() => {
                    let now = Self::now();
                    for s in self.channels.values() {
                        s.ch.resume(now);
                    }
                }
                _ = shutdown.changed() => {
                    return End::Error(AmqpError::new(CONNECTION_FORCED, "broker shutdown"));
                }
            }
        }
    }

    /// The memory alarm: publishing connections stop being read while
    /// message memory is above the watermark (TCP back-pressure does the
    /// rest), and are told so if they asked.
    fn update_blocked(&mut self) {
        let over = berth_broker::message::message_bytes() > self.memory_high_watermark;
        if over && self.has_published && !self.blocked {
            self.blocked = true;
            tracing::warn!(peer = %self.peer, "memory alarm: blocking publishing connection");
            if self.blocked_notify {
                self.send_method(
                    0,
                    &AMQPClass::Connection(conn::AMQPMethod::Blocked(conn::Blocked {
                        reason: "low on memory".into(),
                    })),
                );
            }
        } else if !over && self.blocked {
            self.blocked = false;
            if self.blocked_notify {
                self.send_method(
                    0,
                    &AMQPClass::Connection(conn::AMQPMethod::Unblocked(conn::Unblocked {})),
                );
            }
        }
    }

    fn on_tick(&mut self) -> Result<(), End> {
        self.update_blocked();
        let now = Self::now();
        if !self.heartbeat.is_zero() && now.duration_since(self.last_read) > self.heartbeat * 2 {
            tracing::warn!(peer = %self.peer, user = %self.user, "missed heartbeats from client, timeout: {:?}", self.heartbeat * 2);
            return Err(End::Done);
        }
        let overdue: Vec<(u16, u64)> = self
            .channels
            .iter()
            .filter(|(_, s)| matches!(s.state, ChanState::Open))
            .filter_map(|(id, s)| s.ch.overdue_delivery(now).map(|ms| (*id, ms)))
            .collect();
        for (id, ms) in overdue {
            self.channel_exception(
                id,
                AmqpError::precondition_failed(format!(
                    "delivery acknowledgement on channel {id} timed out. Timeout value used: {ms} ms. This timeout value can be configured, see consumers doc guide to learn more"
                )),
            );
        }
        Ok(())
    }

    fn handle_frame(&mut self, f: Frame) -> Result<(), End> {
        if f.channel > self.channel_max {
            return Err(AmqpError::not_allowed(format!(
                "channel {} is above the negotiated channel_max ({})",
                f.channel, self.channel_max
            ))
            .into());
        }
        match f.kind {
            FRAME_HEARTBEAT if f.channel == 0 => Ok(()),
            FRAME_HEARTBEAT => Err(AmqpError::new(
                UNEXPECTED_FRAME,
                format!(
                    "type 8, all octets = <<>>: heartbeat frames belong on channel 0, not channel {}",
                    f.channel
                ),
            )
            .into()),
            FRAME_METHOD if f.channel == 0 => self.connection_method(&f.payload),
            FRAME_METHOD => self.channel_frame_method(f.channel, &f.payload),
            FRAME_HEADER | FRAME_BODY if f.channel == 0 => {
                Err(AmqpError::new(UNEXPECTED_FRAME, "content frame on channel 0").into())
            }
            FRAME_HEADER | FRAME_BODY => self.content_frame(f),
            other => Err(frame_error(&FrameError::UnknownType(other)).into()),
        }
    }

    fn connection_method(&mut self, payload: &[u8]) -> Result<(), End> {
        let m = match decode_method(payload) {
            Ok(Method::Other(m)) => m,
            Ok(Method::Publish(_)) => {
                return Err(AmqpError::channel_error("basic.publish on channel 0")
                    .during(60, 40)
                    .into())
            }
            Err(e) => return Err(decode_error(&e).into()),
        };
        let (class_id, method_id) = (m.get_amqp_class_id(), m.get_amqp_method_id());
        match m {
            AMQPClass::Connection(conn::AMQPMethod::Close(c)) => {
                tracing::debug!(peer = %self.peer, code = c.reply_code, text = %c.reply_text, "client closed the connection");
                Err(End::PeerClose)
            }
            AMQPClass::Connection(conn::AMQPMethod::CloseOk(_)) => Err(End::Done),
            AMQPClass::Connection(conn::AMQPMethod::UpdateSecret(_)) => {
                self.send_method(
                    0,
                    &AMQPClass::Connection(conn::AMQPMethod::UpdateSecretOk(
                        conn::UpdateSecretOk {},
                    )),
                );
                Ok(())
            }
            AMQPClass::Connection(
                conn::AMQPMethod::Blocked(_) | conn::AMQPMethod::Unblocked(_),
            ) => Ok(()),
            _ => Err(AmqpError::channel_error(format!(
                "method {class_id}.{method_id} is not allowed on channel 0 after the handshake"
            ))
            .during(class_id, method_id)
            .into()),
        }
    }

    fn channel_frame_method(&mut self, channel: u16, payload: &[u8]) -> Result<(), End> {
        let decoded = decode_method(payload);
        let slot = self.channels.get_mut(&channel);
        match slot {
            None => {
                // Only channel.open is valid on an unopened channel.
                return match decoded {
                    Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::Open(_)))) => {
                        if self.channels.len() >= usize::from(self.channel_max) {
                            return Err(AmqpError::not_allowed(format!(
                                "number of channels opened ({}) has reached the negotiated channel_max ({})",
                                self.channels.len(),
                                self.channel_max
                            ))
                            .into());
                        }
                        let session =
                            Arc::clone(self.session.as_ref().expect("open after handshake"));
                        self.channels.insert(
                            channel,
                            Slot {
                                state: ChanState::Open,
                                ch: Channel::new(channel, session),
                                content: Content::Idle,
                                confirms: None,
                                last_queue: None,
                                tx_waiting: 0,
                                tx_commit_pending: false,
                                generation: {
                                    self.generations += 1;
                                    self.generations
                                },
                            },
                        );
                        self.send_method(
                            channel,
                            &AMQPClass::Channel(chan::AMQPMethod::OpenOk(chan::OpenOk {})),
                        );
                        Ok(())
                    }
                    Err(e) => Err(decode_error(&e).into()),
                    Ok(_) => {
                        let (c, m) = codec::method_ids(payload).unwrap_or((0, 0));
                        Err(AmqpError::channel_error("expected 'channel.open'")
                            .during(c, m)
                            .into())
                    }
                };
            }
            Some(slot) if matches!(slot.state, ChanState::Closing) => {
                match decoded {
                    Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::CloseOk(_)))) => {
                        self.channels.remove(&channel);
                    }
                    // The two closes crossed: answer the peer's, and keep
                    // waiting for its close-ok to ours (as RabbitMQ does),
                    // which must not find the number free.
                    Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::Close(_)))) => {
                        self.send_method(
                            channel,
                            &AMQPClass::Channel(chan::AMQPMethod::CloseOk(chan::CloseOk {})),
                        );
                    }
                    // Everything else is dropped while the close handshake runs.
                    _ => {}
                }
                return Ok(());
            }
            Some(slot) => {
                if !matches!(slot.content, Content::Idle) {
                    return Err(AmqpError::new(
                        UNEXPECTED_FRAME,
                        format!("expected content header or body on channel {channel}, got a method frame"),
                    )
                    .during(60, 40)
                    .into());
                }
            }
        }
        let m = decoded.map_err(|e| decode_error(&e))?;
        if let Method::Other(AMQPClass::Basic(basic::AMQPMethod::Qos(_))) = &m {
            let size = codec::qos_prefetch_size(payload).unwrap_or(0);
            if size != 0 {
                return Err(
                    AmqpError::not_implemented(format!("prefetch_size!=0 ({size})"))
                        .during(60, 10)
                        .into(),
                );
            }
        }
        let ids = match &m {
            Method::Publish(_) => (60, 40),
            Method::Other(c) => (c.get_amqp_class_id(), c.get_amqp_method_id()),
        };
        match self.channel_method(channel, m) {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = e.during(ids.0, ids.1);
                if e.is_connection_error() {
                    Err(e.into())
                } else {
                    self.channel_exception(channel, e);
                    Ok(())
                }
            }
        }
    }

    /// Closes a channel with an exception: the broker side is cleaned up
    /// at once; the slot waits for the client's `close-ok`.
    fn channel_exception(&mut self, channel: u16, e: AmqpError) {
        tracing::debug!(peer = %self.peer, channel, code = e.reply_code, "channel error: {}", e.reply_text());
        if let Some(slot) = self.channels.get_mut(&channel) {
            slot.state = ChanState::Closing;
            slot.content = Content::Idle;
            slot.ch.close(Self::now());
        }
        self.send_method(
            channel,
            &AMQPClass::Channel(chan::AMQPMethod::Close(chan::Close {
                reply_code: e.reply_code,
                reply_text: e.reply_text().into(),
                class_id: e.class_id,
                method_id: e.method_id,
            })),
        );
    }

    fn slot(&mut self, channel: u16) -> &mut Slot {
        self.channels
            .get_mut(&channel)
            .expect("slot exists for an open channel")
    }

    /// Resolves an empty queue name to the channel's last declared queue.
    fn queue_name(&mut self, channel: u16, name: &str) -> AmqpResult<String> {
        if !name.is_empty() {
            return Ok(name.to_owned());
        }
        self.slot(channel)
            .last_queue
            .clone()
            .ok_or_else(|| AmqpError::not_found("no previously declared queue"))
    }

    #[allow(clippy::too_many_lines)]
    fn channel_method(&mut self, channel: u16, m: Method) -> AmqpResult<()> {
        let now = Self::now();
        let m = match m {
            Method::Publish(p) => {
                if p.immediate {
                    return Err(AmqpError::not_implemented("immediate=true"));
                }
                self.slot(channel).content = Content::Header(p);
                return Ok(());
            }
            Method::Other(m) => m,
        };
        let ch = Arc::clone(&self.slot(channel).ch);
        let vhost = Arc::clone(self.vhost());
        let conn_id = self.id;
        match m {
            AMQPClass::Channel(chan::AMQPMethod::Open(_)) => {
                return Err(AmqpError::channel_error(format!(
                    "second 'channel.open' seen on channel {channel}"
                )));
            }
            AMQPClass::Channel(chan::AMQPMethod::Close(_)) => {
                ch.close(now);
                self.channels.remove(&channel);
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::CloseOk(chan::CloseOk {})),
                );
            }
            AMQPClass::Channel(chan::AMQPMethod::CloseOk(_)) => {}
            AMQPClass::Channel(chan::AMQPMethod::Flow(f)) => {
                if !f.active {
                    return Err(AmqpError::not_implemented("active=false"));
                }
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::FlowOk(chan::FlowOk { active: true })),
                );
            }
            AMQPClass::Channel(chan::AMQPMethod::FlowOk(_)) => {}
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                self.send_method(
                    channel,
                    &AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Declare(d)) => {
                vhost.declare_exchange(
                    d.exchange.as_str(),
                    &ExchangeDeclare {
                        kind: d.kind.to_string(),
                        passive: d.passive,
                        durable: d.durable,
                        auto_delete: d.auto_delete,
                        internal: d.internal,
                        arguments: d.arguments,
                    },
                )?;
                if !d.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(
                            exchange::DeclareOk {},
                        )),
                    );
                }
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Delete(d)) => {
                vhost.delete_exchange(d.exchange.as_str(), d.if_unused)?;
                if !d.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
                    );
                }
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Bind(b)) => {
                vhost.bind_exchange(
                    b.destination.as_str(),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                if !b.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})),
                    );
                }
            }
            AMQPClass::Exchange(exchange::AMQPMethod::Unbind(b)) => {
                vhost.unbind_exchange(
                    b.destination.as_str(),
                    b.source.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                if !b.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})),
                    );
                }
            }
            AMQPClass::Queue(queue::AMQPMethod::Declare(d)) => {
                let name = if d.passive {
                    self.queue_name(channel, d.queue.as_str())?
                } else {
                    d.queue.to_string()
                };
                let (name, messages, consumers) = vhost.declare_queue(
                    conn_id,
                    &name,
                    &QueueDeclare {
                        passive: d.passive,
                        durable: d.durable,
                        exclusive: d.exclusive,
                        auto_delete: d.auto_delete,
                        arguments: d.arguments,
                    },
                    now,
                )?;
                self.slot(channel).last_queue = Some(name.clone());
                if !d.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                            queue: name.into(),
                            message_count: u32::try_from(messages).unwrap_or(u32::MAX),
                            consumer_count: u32::try_from(consumers).unwrap_or(u32::MAX),
                        })),
                    );
                }
            }
            AMQPClass::Queue(queue::AMQPMethod::Bind(b)) => {
                let q = self.queue_name(channel, b.queue.as_str())?;
                vhost.bind_queue(
                    conn_id,
                    &q,
                    b.exchange.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                if !b.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
                    );
                }
            }
            AMQPClass::Queue(queue::AMQPMethod::Unbind(b)) => {
                let q = self.queue_name(channel, b.queue.as_str())?;
                vhost.unbind_queue(
                    conn_id,
                    &q,
                    b.exchange.as_str(),
                    b.routing_key.as_str(),
                    &b.arguments,
                )?;
                self.send_method(
                    channel,
                    &AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
                );
            }
            AMQPClass::Queue(queue::AMQPMethod::Purge(p)) => {
                let q = self.queue_name(channel, p.queue.as_str())?;
                let n = vhost.purge_queue(conn_id, &q, now)?;
                if !p.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                            message_count: u32::try_from(n).unwrap_or(u32::MAX),
                        })),
                    );
                }
            }
            AMQPClass::Queue(queue::AMQPMethod::Delete(d)) => {
                let q = self.queue_name(channel, d.queue.as_str())?;
                // RabbitMQ answers with delete-ok before it sends basic.cancel
                // to the queue's consumers on this channel; amqplib relies on it.
                self.out.hold_cancels();
                let deleted = vhost.delete_queue(conn_id, &q, d.if_unused, d.if_empty);
                if let (Ok(n), false) = (&deleted, d.nowait) {
                    self.send_method(
                        channel,
                        &AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                            message_count: u32::try_from(*n).unwrap_or(u32::MAX),
                        })),
                    );
                }
                self.out.release_cancels();
                deleted?;
            }
            AMQPClass::Basic(basic::AMQPMethod::Qos(q)) => {
                // prefetch-size is dropped by the generated decoder; it is
                // checked from the raw payload in `qos_prefetch_size`.
                ch.qos(q.prefetch_count, q.global, now);
                self.send_method(
                    channel,
                    &AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
            }
            AMQPClass::Basic(basic::AMQPMethod::Consume(c)) => {
                let qname = self.queue_name(channel, c.queue.as_str())?;
                let q = vhost.queue(conn_id, &qname)?;
                let out = Arc::clone(&self.out);
                let nowait = c.nowait;
                ch.consume(
                    q,
                    c.consumer_tag.as_str(),
                    c.no_ack,
                    c.exclusive,
                    now,
                    |tag| {
                        if !nowait {
                            out.push(|b| {
                                codec::encode_method(
                                    b,
                                    channel,
                                    &AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                                        basic::ConsumeOk {
                                            consumer_tag: tag.into(),
                                        },
                                    )),
                                );
                            });
                        }
                    },
                )?;
            }
            AMQPClass::Basic(basic::AMQPMethod::Cancel(c)) => {
                ch.cancel(c.consumer_tag.as_str(), now);
                if !c.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                            consumer_tag: c.consumer_tag,
                        })),
                    );
                }
            }
            // The answer to a server-sent cancel; nothing to do.
            AMQPClass::Basic(basic::AMQPMethod::CancelOk(_)) => {}
            AMQPClass::Basic(basic::AMQPMethod::Get(g)) => {
                let qname = self.queue_name(channel, g.queue.as_str())?;
                let q = vhost.queue(conn_id, &qname)?;
                if !ch.get(&q, g.no_ack, now) {
                    self.send_method(
                        channel,
                        &AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
                    );
                }
            }
            AMQPClass::Basic(basic::AMQPMethod::Ack(a)) => {
                ch.ack(a.delivery_tag, a.multiple, now)?
            }
            AMQPClass::Basic(basic::AMQPMethod::Nack(n)) => {
                ch.nack(n.delivery_tag, n.multiple, n.requeue, now)?
            }
            AMQPClass::Basic(basic::AMQPMethod::Reject(r)) => {
                ch.nack(r.delivery_tag, false, r.requeue, now)?
            }
            AMQPClass::Basic(basic::AMQPMethod::Recover(r)) => {
                if !r.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                ch.recover(now);
                self.send_method(
                    channel,
                    &AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
                );
            }
            AMQPClass::Basic(basic::AMQPMethod::RecoverAsync(r)) => {
                if !r.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                ch.recover(now);
            }
            AMQPClass::Tx(tx::AMQPMethod::Select(_)) => {
                if self.slot(channel).confirms.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                ch.tx_select();
                self.send_method(
                    channel,
                    &AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})),
                );
            }
            AMQPClass::Tx(tx::AMQPMethod::Commit(_)) => {
                let sender = self.stored_tx.clone();
                let generation = self.slot(channel).generation;
                let mut waits = 0usize;
                let published = ch.tx_commit(now, &mut || {
                    waits += 1;
                    let sender = sender.clone();
                    Box::new(move |r| {
                        let _connection_may_be_gone = sender.send(Stored::Tx {
                            channel,
                            generation,
                            result: r.map_err(|e| e.to_string()),
                        });
                    })
                })?;
                let partial = published.iter().any(|p| p.result.rejected);
                for p in published {
                    self.after_publish(channel, &p, None);
                }
                let slot = self.slot(channel);
                slot.tx_waiting += waits;
                if partial {
                    // What fitted stays enqueued, as in RabbitMQ; the
                    // client learns that the rest was refused.
                    return Err(AmqpError::precondition_failed("partial tx completion"));
                }
                if slot.tx_waiting == 0 {
                    self.send_method(
                        channel,
                        &AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
                    );
                } else {
                    slot.tx_commit_pending = true;
                }
            }
            AMQPClass::Tx(tx::AMQPMethod::Rollback(_)) => {
                ch.tx_rollback()?;
                self.send_method(
                    channel,
                    &AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
                );
            }
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                if ch.is_transactional() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                let slot = self.slot(channel);
                if slot.confirms.is_none() {
                    slot.confirms = Some(Confirms::default());
                }
                if !s.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "method {}.{} is not valid from a client",
                    other.get_amqp_class_id(),
                    other.get_amqp_method_id()
                )));
            }
        }
        Ok(())
    }

    fn content_frame(&mut self, f: Frame) -> Result<(), End> {
        let channel = f.channel;
        let max_body = self.shared.config.limits.message_size_bytes_max;
        let Some(slot) = self.channels.get_mut(&channel) else {
            return Err(AmqpError::channel_error(format!(
                "expected 'channel.open' on channel {channel}"
            ))
            .into());
        };
        if matches!(slot.state, ChanState::Closing) {
            return Ok(());
        }
        let content = std::mem::replace(&mut slot.content, Content::Idle);
        let (publish, properties, body) = match (content, f.kind) {
            (Content::Header(publish), FRAME_HEADER) => {
                let h = decode_content_header(&f.payload).map_err(|e| decode_error(&e))?;
                if h.class_id != codec::CLASS_BASIC {
                    return Err(AmqpError::new(
                        UNEXPECTED_FRAME,
                        format!("content header for class {} (expected 60)", h.class_id),
                    )
                    .into());
                }
                if h.body_size > max_body {
                    self.channel_exception(
                        channel,
                        AmqpError::precondition_failed(format!(
                            "message size {} is larger than configured max size {}",
                            h.body_size, max_body
                        ))
                        .during(60, 40),
                    );
                    return Ok(());
                }
                if h.body_size > 0 {
                    slot.content = Content::Body {
                        publish,
                        properties: h.properties,
                        body: BytesMut::new(),
                        remaining: h.body_size,
                    };
                    return Ok(());
                }
                (publish, h.properties, Bytes::new())
            }
            (
                Content::Body {
                    publish,
                    properties,
                    mut body,
                    remaining,
                },
                FRAME_BODY,
            ) => {
                let n = f.payload.len() as u64;
                if n > remaining {
                    return Err(AmqpError::new(FRAME_ERROR, format!("body frame of {n} bytes exceeds the {remaining} bytes left of the declared body size")).into());
                }
                if n == remaining && body.is_empty() {
                    // Whole body in one frame: keep the frame's bytes, no copy.
                    (publish, properties, f.payload)
                } else {
                    body.extend_from_slice(&f.payload);
                    if n < remaining {
                        slot.content = Content::Body {
                            publish,
                            properties,
                            body,
                            remaining: remaining - n,
                        };
                        return Ok(());
                    }
                    (publish, properties, body.freeze())
                }
            }
            (Content::Idle, kind) => {
                return Err(AmqpError::new(
                    UNEXPECTED_FRAME,
                    format!(
                        "{} frame on channel {channel} without a preceding basic.publish",
                        if kind == FRAME_HEADER {
                            "content header"
                        } else {
                            "content body"
                        }
                    ),
                )
                .into())
            }
            (_, _) => {
                return Err(AmqpError::new(
                    UNEXPECTED_FRAME,
                    format!("content frames out of order on channel {channel}"),
                )
                .into());
            }
        };
        self.publish(channel, publish, properties, body);
        Ok(())
    }

    fn publish(&mut self, channel: u16, p: codec::Publish, properties: Bytes, body: Bytes) {
        let now = Self::now();
        if !self.has_published {
            self.has_published = true;
        }
        let slot = self.slot(channel);
        let ch = Arc::clone(&slot.ch);
        let seq = slot.confirms.as_ref().map(|c| c.last_seq + 1);
        let generation = slot.generation;
        let sender = self.stored_tx.clone();
        let mut make_done = || -> berth_broker::durable::Done {
            let sender = sender.clone();
            Box::new(move |r: Result<(), berth_broker::durable::JournalError>| {
                if let Some(seq) = seq {
                    let _connection_may_be_gone = sender.send(Stored::Confirm {
                        channel,
                        generation,
                        seq,
                        result: r.map_err(|e| e.to_string()),
                    });
                } else if let Err(e) = r {
                    tracing::error!(error = %e, "a persistent message could not be stored");
                }
            })
        };
        let result = Message::published(
            p.exchange.clone(),
            p.routing_key,
            properties,
            body,
            &self.user,
        )
        .and_then(|msg| ch.publish(&p.exchange, msg, p.mandatory, now, &mut make_done));
        match result {
            Ok(Some(published)) => {
                if let Some(c) = self.slot(channel).confirms.as_mut() {
                    c.last_seq += 1;
                }
                self.after_publish(channel, &published, seq);
            }
            Ok(None) => {}
            Err(e) => self.channel_exception(channel, e.during(60, 40)),
        }
    }

    /// `basic.return` for unroutable mandatory messages; nacks for refused
    /// ones (acks are batched in `flush_confirms`).
    fn after_publish(&mut self, channel: u16, p: &Published, seq: Option<u64>) {
        if let (None, Some(q)) = (&self.flow, &p.result.backlogged) {
            self.flow = Some((Arc::clone(q), Instant::now() + FLOW_PAUSE_MAX));
        }
        if p.mandatory && p.result.unroutable() {
            let frame_max = self.frame_max;
            let msg = Arc::clone(&p.msg);
            self.out.push(|b| {
                codec::encode_return(
                    b,
                    channel,
                    NO_ROUTE,
                    "NO_ROUTE",
                    &msg.exchange,
                    &msg.routing_key,
                );
                codec::encode_content(b, channel, &msg.properties, &msg.body, frame_max);
            });
        }
        let Some(seq) = seq else { return };
        let out = Arc::clone(&self.out);
        let mut waiting = false;
        if let Some(c) = self.slot(channel).confirms.as_mut() {
            if p.result.durable {
                c.waiting.insert(seq);
                waiting = true;
            }
            if p.result.rejected {
                c.nacked.insert(seq);
                out.push(|b| codec::encode_nack(b, channel, seq, false));
            }
        }
        if waiting {
            self.unconfirmed += 1;
        }
    }

    /// A journal write finished.
    fn on_stored(&mut self, s: Stored) -> Result<(), End> {
        match s {
            Stored::Confirm {
                channel,
                generation,
                seq,
                result,
            } => {
                // Counted when published, whatever became of the channel
                // since: a closed channel's completions must not leak.
                self.unconfirmed = self.unconfirmed.saturating_sub(1);
                let out = Arc::clone(&self.out);
                let Some(c) = self
                    .channels
                    .get_mut(&channel)
                    .filter(|s| s.generation == generation)
                    .and_then(|s| s.confirms.as_mut())
                else {
                    return Ok(());
                };
                c.waiting.remove(&seq);
                if let Err(e) = result {
                    tracing::error!(peer = %self.peer, channel, seq, error = %e, "persistent message not stored; publisher gets basic.nack");
                    if c.nacked.insert(seq) {
                        out.push(|b| codec::encode_nack(b, channel, seq, false));
                    }
                }
                Ok(())
            }
            Stored::Tx {
                channel,
                generation,
                result,
            } => {
                if let Err(e) = result {
                    return Err(AmqpError::internal(format!(
                        "transaction on channel {channel} could not be stored: {e}"
                    ))
                    .during(90, 20)
                    .into());
                }
                let Some(slot) = self
                    .channels
                    .get_mut(&channel)
                    .filter(|s| s.generation == generation)
                else {
                    return Ok(());
                };
                slot.tx_waiting = slot.tx_waiting.saturating_sub(1);
                if slot.tx_waiting == 0 && slot.tx_commit_pending {
                    slot.tx_commit_pending = false;
                    self.send_method(
                        channel,
                        &AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
                    );
                }
                Ok(())
            }
        }
    }

    /// Confirms everything that can be confirmed, one `basic.ack multiple`
    /// per channel per read batch.
    fn flush_confirms(&mut self) {
        let out = Arc::clone(&self.out);
        for (id, slot) in &mut self.channels {
            if let Some(c) = slot.confirms.as_mut() {
                let frontier = c.waiting.first().map_or(c.last_seq, |w| w - 1);
                if frontier > c.acked_upto {
                    out.push(|b| c.flush(*id, b));
                }
            }
        }
    }

    fn send_connection_close(&mut self, e: &AmqpError) {
        self.closing_since = Some(Self::now());
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::Close(conn::Close {
                reply_code: e.reply_code,
                reply_text: e.reply_text().into(),
                class_id: e.class_id,
                method_id: e.method_id,
            })),
        );
    }

    /// After we sent `connection.close`: discard frames until `close-ok`.
    async fn await_close_ok(&mut self) {
        loop {
            loop {
                match decode_frame(
                    &mut self.rbuf,
                    self.frame_max.max(berth_protocol::frame::FRAME_MIN_SIZE),
                ) {
                    Ok(Some(f)) => {
                        if f.kind == FRAME_METHOD && f.channel == 0 {
                            if let Ok(Method::Other(AMQPClass::Connection(
                                conn::AMQPMethod::CloseOk(_) | conn::AMQPMethod::Close(_),
                            ))) = decode_method(&f.payload)
                            {
                                return;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            if self.read_more().await.is_err() {
                return;
            }
        }
    }

    /// After our `close-ok`: reads and drops what the peer still sends until
    /// it closes the socket, as RabbitMQ does. A client that multiplexes
    /// channels (amqplib) can write `connection.close` ahead of frames of a
    /// channel it is still flushing; closing at once would reset the
    /// connection under those writes and lose the `close-ok`.
    async fn drain_until_peer_closes(&mut self, shutdown: &mut watch::Receiver<bool>) {
        if *shutdown.borrow() {
            return;
        }
        let (rd, rbuf) = (&mut self.rd, &mut self.rbuf);
        let drain = async {
            loop {
                rbuf.clear();
                if read_into(rd, rbuf).await.is_err() {
                    return;
                }
            }
        };
        let limit = Duration::from_millis(CLOSE_DRAIN_TIMEOUT_MS);
        tokio::select! {
            () = drain => {}
            () = tokio::time::sleep(limit) => {
                tracing::debug!(peer = %self.peer, "peer still had the socket open {limit:?} after close-ok");
            }
            _ = shutdown.changed() => {}
        }
    }

    fn cleanup(&mut self) {
        let now = Self::now();
        for (_, slot) in self.channels.drain() {
            slot.ch.close(now);
        }
        if let Some(s) = &self.session {
            s.vhost.connection_closed(self.id);
        }
    }
}

/// Reads more bytes from the socket; EOF is an error (the peer went away).
async fn read_into(rd: &mut OwnedReadHalf, rbuf: &mut BytesMut) -> Result<(), End> {
    if rbuf.capacity() - rbuf.len() < 4096 {
        rbuf.reserve(READ_CHUNK_BYTES);
    }
    let n = rd.read_buf(rbuf).await?;
    if n == 0 {
        return Err(End::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed the connection",
        )));
    }
    Ok(())
}

fn is_mapped_loopback(peer: SocketAddr) -> bool {
    match peer {
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        SocketAddr::V4(_) => false,
    }
}

struct ClientCapabilities {
    cancel_notify: bool,
    blocked_notify: bool,
}

fn client_capabilities(props: &FieldTable) -> ClientCapabilities {
    let caps = match props.inner().get("capabilities") {
        Some(AMQPValue::FieldTable(t)) => Some(t),
        _ => None,
    };
    let flag = |k: &str| {
        caps.and_then(|t| t.inner().get(k))
            .is_some_and(|v| matches!(v, AMQPValue::Boolean(true)))
    };
    ClientCapabilities {
        cancel_notify: flag("consumer_cancel_notify"),
        blocked_notify: flag("connection.blocked"),
    }
}

/// PLAIN: `\0user\0password`; AMQPLAIN: a field table body with LOGIN and
/// PASSWORD.
fn parse_credentials(mechanism: &str, response: &[u8]) -> Option<(String, String)> {
    match mechanism {
        "PLAIN" => {
            let mut parts = response.split(|b| *b == 0);
            let _authzid = parts.next()?;
            let user = parts.next()?;
            let pass = parts.next()?;
            Some((
                String::from_utf8(user.to_vec()).ok()?,
                String::from_utf8(pass.to_vec()).ok()?,
            ))
        }
        "AMQPLAIN" => {
            let mut framed = (response.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(response);
            let table = codec::decode_field_table(&framed)?;
            let get = |k: &str| table.inner().get(k).and_then(berth_broker::args::as_string);
            Some((get("LOGIN")?, get("PASSWORD")?))
        }
        _ => None,
    }
}

/// What the server tells clients about itself in `connection.start`.
fn server_properties() -> FieldTable {
    let mut caps = FieldTable::default();
    for c in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ] {
        caps.insert(c.into(), AMQPValue::Boolean(true));
    }
    let s = |v: &str| AMQPValue::LongString(LongString::from(v.as_bytes().to_vec()));
    let mut p = FieldTable::default();
    p.insert("product".into(), s("berth"));
    p.insert("version".into(), s(env!("CARGO_PKG_VERSION")));
    p.insert("platform".into(), s("Rust"));
    p.insert(
        "information".into(),
        s("A durable AMQP 0-9-1 message broker"),
    );
    p.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    p
}
