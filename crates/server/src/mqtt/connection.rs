//! One MQTT connection: the task that owns the socket's read half, reads
//! packets and acts on them, and ends the connection (with a v5
//! DISCONNECT that says why, the will message when one is due, and the
//! session's end). Its writer task owns the write half and drains
//! [`MqttOut`].
//!
//! Invariants:
//! - Every wait is bounded: CONNECT by `net.handshake_timeout_ms`, a
//!   silent client by 1.5 keepalive intervals (MQTT §3.1.2.10), the last
//!   writes by `CLOSE_TIMEOUT_MS`.
//! - The socket is not read while the store's queues are full, while
//!   `MQTT_PUBLISHES_UNACKED_MAX` PUBACKs are owed, while the output is
//!   over twice its bound, or (for a client that published) while a
//!   resource alarm is on: back-pressure, never unbounded buffering.
//! - A bad packet ends this connection only, with reason code 0x81
//!   (malformed) or 0x82 (protocol error) to a v5 client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mqtt5_protocol::packet::connect::ConnectPacket;
use mqtt5_protocol::packet::disconnect::DisconnectPacket;
use mqtt5_protocol::ReasonCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use berth_broker::channel::{Channel, Session as BrokerSession};

use super::clients::{Clients, Hold, Qos2State};
use super::codec::{self, CodecError};
use super::connect::{self, Refused};
use super::outlet::MqttOut;
use super::publish::{Acks, Stored};
use super::retained::Stores;
use super::session::Session;
use super::stream::{Link, Reader, Writer};
use super::will::Will;
use crate::limits;
use crate::state::Shared;

/// Why a connection ended.
pub enum End {
    /// The client sent DISCONNECT (v5 reason 0x04 asks for the will).
    Disconnect { with_will: bool },
    /// The socket closed or failed without a DISCONNECT.
    Lost(String),
    /// We end it: the reason code a v5 client is told, and the cause.
    Refuse(ReasonCode, String),
}

/// A connected client.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) peer: SocketAddr,
    pub(super) version: u8,
    pub(super) client_id: String,
    pub(super) user: String,
    rd: Reader,
    rbuf: BytesMut,
    pub(super) out: Arc<MqttOut>,
    pub(super) session: Session,
    pub(super) acks: Acks,
    stored_rx: mpsc::UnboundedReceiver<Stored>,
    keepalive: Option<Duration>,
    last_read: Instant,
    pub(super) packet_bytes_max: usize,
    /// This client published: the resource alarms stop reading it.
    pub(super) has_published: bool,
    will: Option<Will>,
    pub(super) clients: Arc<Clients>,
    /// The vhosts' retained messages.
    pub(super) retained: Arc<Stores>,
    /// QoS 2 packet ids routed and not yet released by the client's
    /// PUBREL: a PUBLISH again with one of them is not routed again.
    pub(super) awaiting_release: std::collections::HashSet<u16>,
    /// This connection in the management API's list (and how it is asked
    /// to close from there).
    listed: Arc<crate::registry::ConnInfo>,
    /// The client's 5.0 topic aliases (at most `MQTT_TOPIC_ALIASES_MAX`).
    pub(super) topic_aliases: std::collections::HashMap<u16, String>,
}

/// Serves one accepted connection until it ends.
pub async fn serve(
    (mut rd, mut wr): (Reader, Writer),
    link: Link,
    shared: Arc<Shared>,
    (clients, retained): (Arc<Clients>, Arc<Stores>),
    shutdown: watch::Receiver<bool>,
) {
    let (peer, id) = (link.peer, link.id);
    let mut rbuf = BytesMut::with_capacity(4096);
    let timeout = Duration::from_millis(shared.config.net.handshake_timeout_ms);
    let connect = match connect::read_connect(&mut rd, &mut rbuf, timeout).await {
        Ok(c) => c,
        Err(refused) => return refuse(&mut wr, 4, peer, refused).await,
    };
    let version = connect.protocol_version;
    if let Err(refused) = connect::check(&connect) {
        return refuse(&mut wr, version, peer, refused).await;
    }
    let login = match super::login::login(
        &shared,
        connect.username.as_deref(),
        connect.password.as_deref(),
        peer,
        link.cert_name.as_deref(),
    )
    .await
    {
        Ok(l) => l,
        Err(code) => {
            let why = "login refused".to_owned();
            return refuse(&mut wr, version, peer, Refused::Connack(code, why)).await;
        }
    };
    let assigned = connect
        .client_id
        .is_empty()
        .then(|| connect::assigned_client_id(id, peer));
    let client_id = assigned
        .clone()
        .unwrap_or_else(|| connect.client_id.clone());
    let wait = Duration::from_millis(limits::MQTT_TAKEOVER_WAIT_MS);
    let Some(hold) = clients.take(&login.vhost.name, &client_id, id, wait).await else {
        let why = "the connection holding this client id did not close".to_owned();
        let refused = Refused::Connack(ReasonCode::ServerBusy, why);
        return refuse(&mut wr, version, peer, refused).await;
    };
    let vhost_name = login.vhost.name.clone();
    let out = MqttOut::new(
        version,
        connect
            .properties
            .get_maximum_packet_size()
            .map_or(usize::MAX, |m| m as usize),
        limits::MQTT_OUTPUT_BYTES_MAX,
    );
    let writer = tokio::spawn(write_loop(wr, Arc::clone(&out)));
    let started = start(
        &shared,
        &connect,
        login,
        (client_id.clone(), assigned),
        &link,
        (&out, &clients, &retained),
        (rd, rbuf),
    );
    let end = match started {
        Ok(mut c) => {
            let end = c.run(&hold, shutdown).await;
            c.finish(&end);
            end
        }
        Err((Some(code), why)) => {
            out.push(|b| connect::connack_refusal(version, code, b));
            End::Refuse(code, why)
        }
        Err((None, why)) => End::Lost(why),
    };
    if let End::Refuse(_, why) | End::Lost(why) = &end {
        tracing::info!(%peer, client_id = %client_id, "MQTT connection closed: {why}");
    }
    out.close();
    let close_wait = Duration::from_millis(limits::CLOSE_TIMEOUT_MS);
    if tokio::time::timeout(close_wait, writer).await.is_err() {
        tracing::debug!(%peer, "MQTT writer did not finish in time");
    }
    clients.release(&vhost_name, &client_id, id, &hold);
}

/// Answers a refused CONNECT (a CONNACK if it deserves one) and closes.
async fn refuse(wr: &mut Writer, version: u8, peer: SocketAddr, refused: Refused) {
    match refused {
        Refused::Close(why) => tracing::info!(%peer, "MQTT connection closed: {why}"),
        Refused::Connack(code, why) => {
            tracing::info!(%peer, ?code, "MQTT CONNECT refused: {why}");
            let mut b = BytesMut::new();
            connect::connack_refusal(version, code, &mut b);
            let close_wait = Duration::from_millis(limits::CLOSE_TIMEOUT_MS);
            let _peer_may_be_gone = tokio::time::timeout(close_wait, wr.write_all(&b)).await;
        }
    }
    let _peer_may_be_gone = wr.shutdown().await;
}

/// The session after a good login: the broker channel, the kept session
/// discarded or resumed, and the CONNACK.
fn start(
    shared: &Arc<Shared>,
    connect: &ConnectPacket,
    login: super::login::Login,
    (client_id, assigned): (String, Option<String>),
    link: &Link,
    (out, clients, retained): (&Arc<MqttOut>, &Arc<Clients>, &Arc<Stores>),
    (rd, rbuf): (Reader, BytesMut),
) -> Result<Conn, (Option<ReasonCode>, String)> {
    let (id, peer) = (link.id, link.peer);
    let now = shared.broker.now();
    let version = connect.protocol_version;
    let broker_session = Arc::new(BrokerSession {
        connection_id: id,
        vhost: Arc::clone(&login.vhost),
        outlet: Arc::clone(out) as _,
        cancel_notify: true,
        consumer_timeout_ms: None,
        user: Arc::from(login.user.as_str()),
        events: shared.broker.event_sink(),
    });
    let ch = Channel::new(1, broker_session);
    let prefetch = connect
        .properties
        .get_receive_maximum()
        .unwrap_or(u16::MAX)
        .clamp(1, limits::MQTT_DELIVERIES_UNACKED_MAX);
    ch.qos(prefetch, false, now);
    let lifetime = connect::lifetime(connect);
    let mut session = Session::new(
        Arc::clone(shared),
        ch,
        id,
        &login.user,
        &client_id,
        lifetime,
    );
    let fail = |e: berth_broker::AmqpError| {
        let code = if e.reply_code == berth_protocol::reply::ACCESS_REFUSED {
            ReasonCode::NotAuthorized
        } else {
            ReasonCode::UnspecifiedError
        };
        (Some(code), format!("session: {}", e.reply_text()))
    };
    let kept_qos2 = clients.take_qos2(&login.vhost.name, &client_id);
    let (session_present, qos2) = if connect.clean_start {
        session.discard_kept().map_err(fail)?;
        (false, Qos2State::default())
    } else {
        // A session is kept in its queues (subscriptions) and in the
        // QoS 2 ids in the middle of their exchange.
        (session.was_kept() || !kept_qos2.is_empty(), kept_qos2)
    };
    let will = match &connect.will {
        Some(w) => {
            let store = match w.retain {
                true => Some(retained.get(&login.vhost, &login.user, now).map_err(fail)?),
                false => None,
            };
            Some(Will::new(w, &session, &login.user, version, store).map_err(fail)?)
        }
        None => None,
    };
    let packet_bytes_max = usize::try_from(shared.config.limits.message_size_bytes_max)
        .unwrap_or(usize::MAX)
        .saturating_add(limits::MQTT_PACKET_HEADERS_BYTES_MAX);
    let ack = connect::connack_accepted(version, session_present, assigned, packet_bytes_max);
    out.push(|b| {
        if let Err(e) = codec::encode(&ack, b) {
            tracing::error!(error = %e, "could not encode a CONNACK");
        }
    });
    // Only after the CONNACK: a kept session's messages are delivered as
    // soon as its queues are consumed.
    if session_present {
        // PUBRELs first: they answer PUBRECs the client sent before.
        out.resume_awaiting_comp(qos2.awaiting_comp);
        if let Err(e) = session.resume(now) {
            tracing::warn!(%peer, client_id = %client_id, "MQTT session not resumed: {}", e.reply_text());
            let bye = DisconnectPacket::new(ReasonCode::UnspecifiedError);
            if version == 5 {
                out.push(|b| {
                    let _encoded_or_logged = codec::encode(&bye, b);
                });
            }
            session.end(now);
            return Err((None, "session not resumed".into()));
        }
    }
    let listed = super::listed::register(shared, link, &session, connect);
    let (tx, stored_rx) = mpsc::unbounded_channel();
    tracing::debug!(%peer, client_id = %client_id, user = %login.user, vhost = %login.vhost.name, version, session_present, "MQTT client connected");
    Ok(Conn {
        shared: Arc::clone(shared),
        peer,
        version,
        client_id,
        user: login.user,
        rd,
        rbuf,
        out: Arc::clone(out),
        session,
        acks: Acks::new(tx),
        stored_rx,
        keepalive: (connect.keep_alive > 0)
            .then(|| Duration::from_millis(u64::from(connect.keep_alive) * 1500)),
        last_read: Instant::now(),
        packet_bytes_max,
        has_published: false,
        will,
        clients: Arc::clone(clients),
        retained: Arc::clone(retained),
        awaiting_release: qos2.awaiting_release,
        listed,
        topic_aliases: std::collections::HashMap::new(),
    })
}

impl Conn {
    /// Whether the socket may be read now (see the module's invariants).
    fn may_read(&self) -> bool {
        if !self.shared.broker.journal_has_room()
            || self.acks.len() >= usize::from(limits::MQTT_PUBLISHES_UNACKED_MAX)
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

    /// Reads and handles packets until the connection ends.
    async fn run(&mut self, hold: &Hold, mut shutdown: watch::Receiver<bool>) -> End {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::CONNECTION_TICK_MS));
        let out = Arc::clone(&self.out);
        let shared = Arc::clone(&self.shared);
        loop {
            while self.may_read() {
                let decoded = codec::decode(&mut self.rbuf, self.version, self.packet_bytes_max);
                match decoded {
                    Ok(Some(p)) => {
                        if let Err(end) = self.handle(p) {
                            return end;
                        }
                    }
                    Ok(None) => break,
                    Err(e @ CodecError::TooLarge { .. }) => {
                        return End::Refuse(ReasonCode::PacketTooLarge, e.to_string())
                    }
                    Err(e) => return End::Refuse(ReasonCode::MalformedPacket, e.to_string()),
                }
            }
            let reading = self.may_read();
            let journal_full = !shared.broker.journal_has_room();
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(16 * 1024);
            }
            tokio::select! {
                r = self.rd.read_buf(&mut self.rbuf), if reading => match r {
                    Ok(0) => return End::Lost("closed by the client".into()),
                    Ok(_) => self.last_read = Instant::now(),
                    Err(e) => return End::Lost(format!("read failed: {e}")),
                },
                Some(s) = self.stored_rx.recv() => {
                    self.acks.stored_all(s, &mut self.stored_rx);
                    if let Err(end) = self.send_due_acks() {
                        return end;
                    }
                }
                () = out.wake_connection.notified() => {
                    if let Err(end) = self.settle_now() {
                        return end;
                    }
                }
                () = self.listed.close_requested.notified() => {
                    let why = self.listed.close_reason().unwrap_or_default();
                    return End::Refuse(ReasonCode::AdministrativeAction, format!("closed through the management API: {why}"));
                }
                () = hold.taken_over.notified() => {
                    return End::Refuse(ReasonCode::SessionTakenOver, "another connection took the client id".into());
                }
                _ = shutdown.changed() => {
                    return End::Refuse(ReasonCode::ServerShuttingDown, "server shutting down".into());
                }
                () = std::future::poll_fn(|cx| shared.broker.poll_journal_room(cx)), if journal_full => {}
                _ = tick.tick() => {
                    if let Some(k) = self.keepalive {
                        if self.last_read.elapsed() > k {
                            return End::Refuse(ReasonCode::KeepAliveTimeout, format!("nothing read for {k:?} (1.5 x keepalive)"));
                        }
                    }
                }
            }
        }
    }

    /// Acks what the outlet could not ack under the channel lock; a queue
    /// of the session deleted under it ends the connection.
    fn settle_now(&mut self) -> Result<(), End> {
        let now = self.shared.broker.now();
        for tag in self.out.take_settle_now() {
            if let Err(e) = self.session.ch.ack(tag, false, now) {
                tracing::debug!(error = %e.reply_text(), "MQTT auto-ack of a QoS 0 delivery");
            }
        }
        if self.out.was_cancelled() {
            return Err(End::Refuse(
                ReasonCode::AdministrativeAction,
                "a queue of the session was deleted".into(),
            ));
        }
        Ok(())
    }

    /// The connection ended: the v5 DISCONNECT, the will, the session.
    fn finish(&mut self, end: &End) {
        if let (End::Refuse(code, why), 5) = (end, self.version) {
            let mut d = DisconnectPacket::new(*code);
            if self.version == 5 {
                d = d.with_reason_string(why.clone());
            }
            self.out.push(|b| {
                if let Err(e) = codec::encode(&d, b) {
                    tracing::error!(error = %e, "could not encode a DISCONNECT");
                }
            });
        }
        let will_due = match end {
            End::Disconnect { with_will } => *with_will,
            End::Lost(_) => true,
            End::Refuse(code, _) => *code != ReasonCode::ServerShuttingDown,
        };
        if let Some(will) = self.will.take() {
            if will_due {
                will.publish(&self.session, &self.clients, &self.client_id);
            }
        }
        if self.session.lifetime != super::session::Lifetime::Connection {
            let state = Qos2State {
                awaiting_release: std::mem::take(&mut self.awaiting_release),
                awaiting_comp: self.out.take_awaiting_comp(),
            };
            (self.clients).keep_qos2(&self.session.vhost.name, &self.client_id, state);
        }
        self.session.end(self.shared.broker.now());
        self.shared.registry.remove(self.listed.id);
    }
}

/// Writes what the connection and its queues buffer until closed.
async fn write_loop(mut wr: Writer, out: Arc<MqttOut>) {
    loop {
        match out.take() {
            None => break,
            Some(b) if b.is_empty() => out.wake_writer.notified().await,
            Some(b) => {
                if let Err(e) = wr.write_all(&b).await {
                    tracing::debug!(error = %e, "MQTT write failed");
                    out.close();
                    // Keep draining so producers see the buffer emptied.
                    while out.take().is_some_and(|b| !b.is_empty()) {}
                    break;
                }
            }
        }
    }
    let _peer_may_be_gone = wr.shutdown().await;
}
