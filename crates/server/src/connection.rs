//! One AMQP connection: the task that owns the socket, reads frames and
//! dispatches them, and closes the connection. The handshake is in
//! [`handshake`]; each AMQP class's methods are in a file of their own
//! (`channel`, `exchange`, `queue`, `basic`, `tx`, `confirm`); publisher
//! confirms and transaction waits on the store in [`confirms`]; the memory
//! alarm and flow pauses in [`flow`]; every AMQP exception is made and sent
//! in [`exception`]. Content assembly is sans-I/O, in
//! `berth_protocol::content`.
//!
//! Invariants:
//! - A frame is checked against the negotiated `frame_max` before its
//!   payload is buffered; a bad frame closes the connection with 501, never
//!   panics, and never affects another connection.
//! - Every wait is bounded: the handshake by `handshake_timeout_ms`, a silent
//!   peer by twice the heartbeat, a close handshake by
//!   [`limits::CLOSE_TIMEOUT_MS`], the reading after our `close-ok` by
//!   [`limits::CLOSE_DRAIN_TIMEOUT_MS`].
//! - When the connection ends, for any reason, its channels are closed
//!   (unacked messages requeued) and its exclusive queues deleted.

mod awaiting_store;
mod basic;
mod channel;
mod confirm;
mod exception;
mod exchange;
mod flow;
mod handshake;
mod permissions;
mod queue;
mod read;
mod tx;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::channel::{Channel, Session};
use berth_broker::vhost::VHost;
use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::codec::{self, decode_method, Method};
use berth_protocol::content::ContentAssembler;
use berth_protocol::frame::{
    decode_frame, Frame, FrameError, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    FRAME_MIN_SIZE,
};
use berth_protocol::methods::connection as conn;
use berth_protocol::reply::{CONNECTION_FORCED, UNEXPECTED_FRAME};
use berth_protocol::AMQPClass;
use bytes::BytesMut;
use read::{read_into, ReadStep};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::limits;
use crate::outbound::Outbound;
use crate::pending_output::Output;
use crate::socket::{ReadStream, WriteStream};
use crate::state::Shared;

use awaiting_store::{ChannelConfirms, Completions, Stored};
use exception::{decode_error, frame_error, End};
use flow::Flow;

enum ChanState {
    Open,
    /// We sent `channel.close`; waiting for `close-ok`, ignoring the rest.
    Closing,
}

/// One open channel of the connection.
struct Slot {
    state: ChanState,
    ch: Arc<Channel>,
    /// The publish whose content frames are arriving, if any.
    content: ContentAssembler,
    /// `content`'s body bytes, counted for the memory alarm.
    assembling: crate::memory::Counted,
    /// Set once the channel is in confirm mode; shared with the
    /// completions of its publishes.
    confirms: Option<Arc<ChannelConfirms>>,
    /// The last queue declared on this channel, for empty queue names.
    last_queue: Option<String>,
    /// Journal writes the pending `tx.commit` still waits for.
    tx_waiting: usize,
    /// A `tx.commit-ok` is due once `tx_waiting` reaches zero.
    tx_commit_pending: bool,
    /// Which life of this channel number this is (see [`Stored`]).
    generation: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Completions still running for this life of the channel send
        // nothing more for it.
        if let Some(c) = &self.confirms {
            c.close();
        }
    }
}

struct Conn {
    shared: Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    rd: ReadStream,
    rbuf: BytesMut,
    rstep: ReadStep,
    out: Arc<Outbound>,
    frame_max: u32,
    channel_max: u16,
    heartbeat: Duration,
    /// Set by the handshake's `connection.open`.
    session: Option<Arc<Session>>,
    channels: HashMap<u16, Slot>,
    last_read: Instant,
    user: String,
    /// The client certificate's user name on a TLS connection that
    /// presented one (what `EXTERNAL` logs in as).
    peer_cert_name: Option<String>,
    /// Memory alarm and flow pauses: when the connection is not read.
    flow: Flow,
    /// Transactions' journal completions arrive here.
    stored_tx: tokio::sync::mpsc::UnboundedSender<Stored>,
    stored_rx: tokio::sync::mpsc::UnboundedReceiver<Stored>,
    /// Confirm-mode publishes waiting for the journal, all channels.
    completions: Arc<Completions>,
    /// Channels that published in confirm mode since the last
    /// `flush_confirms` (a channel may appear more than once).
    confirms_due: Vec<u16>,
    /// Journal writes of `tx.commit`s not completed yet, all channels
    /// (with `completions`, bounds what waits for the store; see [`flow`]).
    tx_waits: usize,
    /// Channels opened so far: the next slot's generation.
    generations: u64,
    /// The client's `client_properties` from `start-ok`.
    client_properties: berth_protocol::FieldTable,
    /// This connection's entry in the registry, once it is open.
    info: Option<Arc<crate::registry::ConnInfo>>,
}

/// Serves one connection (plain or TLS, already split) until it ends.
/// `addrs`: the peer's address and ours.
pub async fn serve_stream(
    rd: ReadStream,
    wr: WriteStream,
    (peer, local): (SocketAddr, SocketAddr),
    id: u64,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    peer_cert_name: Option<String>,
) {
    let config = Arc::clone(&shared.config);
    let config_limits = &config.limits;
    let out = Outbound::new(
        config_limits.connection_output_bytes_max,
        config_limits.frame_size_bytes_max,
    );
    if let Some(socket) = wr.second_plain_handle() {
        out.write_directly_to(socket);
    }
    let mut writer = tokio::spawn(write_loop(wr, Arc::clone(&out)));
    let (stored_tx, stored_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut c = Conn {
        frame_max: config_limits.frame_size_bytes_max,
        channel_max: config_limits.channels_per_connection_max,
        shared,
        id,
        peer,
        rd,
        rbuf: BytesMut::with_capacity(limits::READ_CHUNK_BYTES),
        rstep: ReadStep::default(),
        out: Arc::clone(&out),
        heartbeat: Duration::ZERO,
        session: None,
        channels: HashMap::new(),
        last_read: Instant::now(),
        user: String::new(),
        peer_cert_name,
        flow: Flow::new(config_limits.memory_high_watermark()),
        stored_tx,
        stored_rx,
        completions: Arc::default(),
        confirms_due: Vec::new(),
        tx_waits: 0,
        generations: 0,
        client_properties: berth_protocol::FieldTable::default(),
        info: None,
    };
    let end = match c.handshake().await {
        Ok(true) => {
            c.register(local);
            c.run(&mut shutdown).await
        }
        Ok(false) => End::Done,
        Err(e) => e,
    };
    let close_timeout = Duration::from_millis(limits::CLOSE_TIMEOUT_MS);
    match &end {
        End::Done | End::PeerClose => tracing::debug!(%peer, "connection closed"),
        End::Io(e) => tracing::debug!(%peer, error = %e, "connection lost"),
        End::Error(e) => {
            tracing::warn!(%peer, user = %c.user, code = e.reply_code, "closing connection: {}", e.reply_text());
            c.send_connection_close(e);
            // Give the peer a bounded chance to read the close and answer.
            let _ignored_result_of_best_effort_wait =
                tokio::time::timeout(close_timeout, c.await_close_ok()).await;
        }
    }
    c.cleanup();
    if let Some(info) = c.info.take() {
        c.shared.registry.remove(info.id);
    }
    let peer_closed = matches!(end, End::PeerClose);
    if peer_closed {
        // After the channels are closed, so that nothing of theirs follows.
        c.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::CloseOk(conn::CloseOk {})),
        );
    }
    out.close();
    let wr = match tokio::time::timeout(close_timeout, &mut writer).await {
        Ok(Ok(wr)) => Some(wr),
        _ => {
            // A peer that does not read would keep the writer, its buffer
            // and the socket forever.
            tracing::debug!(%peer, "writer did not finish in time; closing the socket");
            writer.abort();
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
async fn write_loop(mut wr: WriteStream, out: Arc<Outbound>) -> WriteStream {
    // Dropped with the task, even an aborted one: the count never leaks.
    let mut in_flight = crate::memory::Counted::new(&crate::memory::OUTPUT_BYTES);
    let mut spare = Output::default();
    loop {
        let buf = out.take(&mut in_flight, std::mem::take(&mut spare));
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
        let written = write_telling_blocked(&mut wr, &buf, &out).await;
        out.written();
        spare = buf.recycle(limits::OUTPUT_BUFFER_KEPT_BYTES_MAX);
        in_flight.set(0);
        if written.is_err() {
            out.close();
            break;
        }
    }
    wr
}

/// Writes all of `buf`, marking `out` as waiting for the socket from the
/// first time the socket does not take everything until the write is
/// done, so that queues stop adding deliveries behind a full socket.
async fn write_telling_blocked(
    wr: &mut WriteStream,
    buf: &Output,
    out: &Outbound,
) -> std::io::Result<()> {
    out.set_writing_bytes(buf.len());
    let mut write = std::pin::pin!(buf.write_to(wr));
    let written = std::future::poll_fn(|cx| {
        let polled = std::future::Future::poll(write.as_mut(), cx);
        if polled.is_pending() {
            out.set_socket_blocked(true);
        }
        polled
    })
    .await;
    out.set_socket_blocked(false);
    written
}

impl Conn {
    fn send_method(&self, channel: u16, m: &AMQPClass) {
        self.out.push(|b| codec::encode_method(b, channel, m));
    }

    async fn read_more(&mut self) -> Result<(), End> {
        read_into(&mut self.rd, &mut self.rbuf, &mut self.rstep).await?;
        self.last_read = Instant::now();
        Ok(())
    }

    fn vhost(&self) -> &Arc<VHost> {
        &self.session.as_ref().expect("open after handshake").vhost
    }

    fn now() -> Instant {
        Instant::now()
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

    /// The main loop: frames in, until the connection ends.
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> End {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::CONNECTION_TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let info = self.info.clone();
        loop {
            // While the journal is full, frames wait undecoded (flow.rs).
            while self.journal_has_room() {
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
            if self.flow.has_published {
                self.update_blocked();
            }
            let out = Arc::clone(&self.out);
            self.flow.end_pause_if_over(Instant::now());
            let paused = self.flow.is_paused();
            let reading = self.may_read();
            let journal_full = !self.journal_has_room();
            let shared = Arc::clone(&self.shared);
            let completions = Arc::clone(&self.completions);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(limits::FLOW_CHECK_MS)), if paused => {}
                () = std::future::poll_fn(|cx| shared.broker.poll_journal_room(cx)), if journal_full => {}
                r = read_into(&mut self.rd, &mut self.rbuf, &mut self.rstep), if reading => {
                    if let Err(e) = r { return e; }
                    self.last_read = Instant::now();
                }
                Some(done) = self.stored_rx.recv() => {
                    if let Err(e) = self.on_stored(done) { return e; }
                    while let Ok(more) = self.stored_rx.try_recv() {
                        if let Err(e) = self.on_stored(more) { return e; }
                    }
                }
                () = completions.room.notified(), if !reading => {}
                _ = tick.tick() => {
                    if let Err(e) = self.on_tick() { return e; }
                }
                () = out.drained.notified() => self.resume_consumers(),
                _ = shutdown.changed() => {
                    return End::Error(AmqpError::new(CONNECTION_FORCED, "broker shutdown"));
                }
                () = async { info.as_ref().expect("checked").close_requested.notified().await }, if info.is_some() => {
                    let reason = info.as_ref().and_then(|i| i.close_reason()).unwrap_or_default();
                    return End::Error(AmqpError::new(CONNECTION_FORCED, reason));
                }
            }
        }
    }

    fn on_tick(&mut self) -> Result<(), End> {
        self.update_blocked();
        if !self.shared.broker.vhost_is_live(self.vhost()) {
            return Err(AmqpError::new(
                CONNECTION_FORCED,
                format!("vhost '{}' is deleted", self.vhost().name),
            )
            .into());
        }
        // Deleting a user closes its connections (as RabbitMQ does); the
        // delete also asks the registry, this catches a login that raced it.
        if !self.user.is_empty() && self.shared.broker.access().user(&self.user).is_none() {
            return Err(AmqpError::new(
                CONNECTION_FORCED,
                format!("user '{}' is deleted", self.user),
            )
            .into());
        }
        let now = Self::now();
        if !self.may_read() {
            // Not reading is our choice, not the peer's silence (RabbitMQ
            // too stops its heartbeat monitor while it blocks a reader).
            self.last_read = now;
        }
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

    /// A method on channel 0 after the handshake.
    fn connection_method(&mut self, payload: &[u8]) -> Result<(), End> {
        let m = match decode_method(payload) {
            Ok(Method::Other(m)) => m,
            Ok(Method::Publish(_)) => {
                return Err(AmqpError::channel_error("basic.publish on channel 0")
                    .during(codec::CLASS_BASIC, codec::METHOD_BASIC_PUBLISH)
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

    /// A method frame on a channel other than 0: opens the channel, runs the
    /// close handshake of a closing one, or hands the method to its class.
    fn channel_frame_method(&mut self, channel: u16, payload: &[u8]) -> Result<(), End> {
        let decoded = decode_method(payload);
        match self.channels.get_mut(&channel) {
            // Only channel.open is valid on an unopened channel.
            None => return self.unopened_channel_method(channel, payload, decoded),
            Some(slot) if matches!(slot.state, ChanState::Closing) => {
                self.closing_channel_method(channel, decoded);
                return Ok(());
            }
            Some(slot) => slot
                .content
                .check_method()
                .map_err(|e| End::from(exception::content_error(e)))?,
        }
        let m = decoded.map_err(|e| decode_error(&e))?;
        if let Method::Other(AMQPClass::Basic(berth_protocol::methods::basic::AMQPMethod::Qos(_))) =
            &m
        {
            basic::check_qos_prefetch_size(payload)?;
        }
        let ids = match &m {
            Method::Publish(_) => (codec::CLASS_BASIC, codec::METHOD_BASIC_PUBLISH),
            Method::Other(c) => (c.get_amqp_class_id(), c.get_amqp_method_id()),
        };
        match self.channel_method(channel, m) {
            Ok(()) => Ok(()),
            Err(e) => self.raise(channel, e.during(ids.0, ids.1)),
        }
    }

    /// Hands a decoded method to the file of its AMQP class.
    fn channel_method(&mut self, channel: u16, m: Method) -> AmqpResult<()> {
        match m {
            Method::Publish(p) => self.basic_publish(channel, p),
            Method::Other(AMQPClass::Channel(m)) => self.channel_class_method(channel, m),
            Method::Other(AMQPClass::Access(m)) => self.access_class_method(channel, m),
            Method::Other(AMQPClass::Exchange(m)) => self.exchange_method(channel, m),
            Method::Other(AMQPClass::Queue(m)) => self.queue_method(channel, m),
            Method::Other(AMQPClass::Basic(m)) => self.basic_method(channel, m),
            Method::Other(AMQPClass::Tx(m)) => self.tx_method(channel, m),
            Method::Other(AMQPClass::Confirm(m)) => self.confirm_method(channel, m),
            Method::Other(other) => Err(exception::not_from_client(&other)),
        }
    }

    /// After we sent `connection.close`: discard frames until `close-ok`.
    async fn await_close_ok(&mut self) {
        loop {
            loop {
                match decode_frame(&mut self.rbuf, self.frame_max.max(FRAME_MIN_SIZE)) {
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
        let (rd, rbuf, step) = (&mut self.rd, &mut self.rbuf, &mut self.rstep);
        let drain = async {
            loop {
                rbuf.clear();
                if read_into(rd, rbuf, step).await.is_err() {
                    return;
                }
            }
        };
        let limit = Duration::from_millis(limits::CLOSE_DRAIN_TIMEOUT_MS);
        tokio::select! {
            () = drain => {}
            () = tokio::time::sleep(limit) => {
                tracing::debug!(peer = %self.peer, "peer still had the socket open {limit:?} after close-ok");
            }
            _ = shutdown.changed() => {}
        }
    }

    /// Lists this connection in the registry (after `open-ok`).
    fn register(&mut self, local: SocketAddr) {
        let info = Arc::new(
            crate::registry::ConnInfo::new(
                self.id,
                self.peer,
                local,
                self.user.clone(),
                self.vhost().name.clone(),
                self.frame_max,
                self.channel_max,
                self.heartbeat.as_secs(),
                crate::field_json::table_json(&self.client_properties),
            )
            .with_protocol("AMQP 0-9-1", self.rd.is_tls()),
        );
        self.shared.registry.insert(Arc::clone(&info));
        self.info = Some(info);
    }

    /// Keeps the registry's channel list in step with `channels`.
    fn registry_channel(&self, channel: u16, open: Option<&Arc<Channel>>) {
        if let Some(info) = &self.info {
            let mut chans = info.channels.lock();
            match open {
                Some(ch) => chans.insert(channel, Arc::clone(ch)),
                None => chans.remove(&channel),
            };
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
