//! The connection handshake: protocol header, `start`/`start-ok` with
//! authentication, `tune`/`tune-ok`, `open`/`open-ok`.
//!
//! Invariants:
//! - The whole handshake is bounded by `net.handshake_timeout_ms`.
//! - A peer gets no session (and so no vhost) before its credentials were
//!   checked and its `tune-ok` stays within the server's limits.

use std::sync::Arc;
use std::time::Duration;

use berth_broker::channel::Session;
use berth_broker::AmqpError;
use berth_protocol::codec::{
    self, decode_method, Method, CLASS_CONNECTION, METHOD_CONNECTION_OPEN,
    METHOD_CONNECTION_START_OK, METHOD_CONNECTION_TUNE_OK,
};
use berth_protocol::frame::{
    decode_frame, Frame, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE, PROTOCOL_HEADER,
};
use berth_protocol::methods::connection as conn;
use berth_protocol::reply::UNEXPECTED_FRAME;
use berth_protocol::{AMQPClass, AMQPValue, FieldTable, LongString};

use super::exception::{decode_error, frame_error, End};
use super::Conn;
use crate::mechanism::{self, Mechanism};

/// What the client said it understands in `start-ok`'s capabilities.
struct ClientCapabilities {
    cancel_notify: bool,
    blocked_notify: bool,
}

impl Conn {
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
    pub(super) async fn handshake(&mut self) -> Result<bool, End> {
        let timeout = Duration::from_millis(self.shared.config.net.handshake_timeout_ms);
        match tokio::time::timeout(timeout, self.handshake_steps()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::info!(peer = %self.peer, "handshake timed out after {timeout:?}");
                Ok(false)
            }
        }
    }

    async fn handshake_steps(&mut self) -> Result<bool, End> {
        while self.rbuf.len() < PROTOCOL_HEADER.len() {
            self.read_more().await?;
        }
        if self.rbuf[..PROTOCOL_HEADER.len()] != PROTOCOL_HEADER {
            tracing::info!(peer = %self.peer, header = ?&self.rbuf[..8], "not an AMQP 0-9-1 client; answering with our protocol header");
            self.out.push(|b| b.extend_from_slice(&PROTOCOL_HEADER));
            return Ok(false);
        }
        let _ = self.rbuf.split_to(PROTOCOL_HEADER.len());
        let capabilities = self.start().await?;
        self.tune().await?;
        self.open(&capabilities).await?;
        Ok(true)
    }

    /// `start` / `start-ok`: the client's capabilities and credentials.
    async fn start(&mut self) -> Result<ClientCapabilities, End> {
        let offered = mechanism::offered(
            &self.shared.config.auth.mechanisms,
            self.peer_cert_name.is_some(),
        );
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::Start(conn::Start {
                version_major: 0,
                version_minor: 9,
                server_properties: server_properties(),
                mechanisms: mechanism::offer_text(&offered).into(),
                locales: "en_US".into(),
            })),
        );
        let start_ok = match self.next_method().await? {
            AMQPClass::Connection(conn::AMQPMethod::StartOk(s)) => s,
            _ => {
                return Err(AmqpError::command_invalid("expected connection.start-ok")
                    .during(CLASS_CONNECTION, METHOD_CONNECTION_START_OK)
                    .into())
            }
        };
        let capabilities = client_capabilities(&start_ok.client_properties);
        self.client_properties = start_ok.client_properties.clone();
        self.flow.blocked_notify = capabilities.blocked_notify;
        let chosen = start_ok
            .mechanism
            .as_str()
            .parse::<Mechanism>()
            .ok()
            .filter(|m| offered.contains(m));
        let external = chosen == Some(Mechanism::External);
        let credentials = match chosen {
            Some(Mechanism::External) => self.peer_cert_name.clone().map(|u| (u, String::new())),
            Some(m) => parse_credentials(m, start_ok.response.as_bytes()),
            None => None,
        };
        let (user, password) = match credentials {
            Some(c) => c,
            None => {
                return Err(AmqpError::access_refused(format!(
                    "unsupported or malformed authentication mechanism '{}'; use one of: {}",
                    start_ok.mechanism,
                    mechanism::offer_text(&offered)
                ))
                .during(CLASS_CONNECTION, METHOD_CONNECTION_START_OK)
                .into())
            }
        };
        self.user.clone_from(&user);
        if let Err(why) = self.shared.logins.turn(self.peer.ip()).await {
            tracing::warn!(peer = %self.peer, %user, "login not checked: {why}");
            return Err(AmqpError::access_refused(why.to_string())
                .during(CLASS_CONNECTION, METHOD_CONNECTION_START_OK)
                .into());
        }
        let checked = if external {
            crate::auth::login_external(&self.shared.broker, &self.shared.config, &user, self.peer)
                .map(|_| ())
        } else {
            self.authenticate(&user, &password)
        };
        if let Err(why) = checked {
            tracing::warn!(peer = %self.peer, %user, "login refused: {why}");
            return Err(AmqpError::access_refused(format!(
                "Login was refused using authentication mechanism {}. For details see the broker logfile.",
                start_ok.mechanism
            ))
            .into());
        }
        self.shared
            .logins
            .refund(self.peer.ip(), std::time::Instant::now());
        Ok(capabilities)
    }

    /// `tune` / `tune-ok`: frame_max, channel_max and heartbeat.
    async fn tune(&mut self) -> Result<(), End> {
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
                    .during(CLASS_CONNECTION, METHOD_CONNECTION_TUNE_OK)
                    .into())
            }
        };
        let server_frame_max = limits.frame_size_bytes_max;
        let refuse = |text: String| -> Result<(), End> {
            Err(AmqpError::not_allowed(text)
                .during(CLASS_CONNECTION, METHOD_CONNECTION_TUNE_OK)
                .into())
        };
        if tune_ok.frame_max != 0 && tune_ok.frame_max < FRAME_MIN_SIZE {
            return refuse(format!(
                "frame_max={} < {} min size",
                tune_ok.frame_max, FRAME_MIN_SIZE
            ));
        }
        if tune_ok.frame_max > server_frame_max {
            return refuse(format!(
                "frame_max={} > {} max size",
                tune_ok.frame_max, server_frame_max
            ));
        }
        if tune_ok.channel_max > limits.channels_per_connection_max {
            return refuse(format!(
                "channel_max={} > {} max",
                tune_ok.channel_max, limits.channels_per_connection_max
            ));
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
        Ok(())
    }

    /// `open` / `open-ok`: the vhost, and with it the session.
    async fn open(&mut self, capabilities: &ClientCapabilities) -> Result<(), End> {
        let open = match self.next_method().await? {
            AMQPClass::Connection(conn::AMQPMethod::Open(o)) => o,
            _ => {
                return Err(AmqpError::command_invalid("expected connection.open")
                    .during(CLASS_CONNECTION, METHOD_CONNECTION_OPEN)
                    .into())
            }
        };
        let Some(vhost) = self.shared.broker.vhost(open.virtual_host.as_str()) else {
            return Err(
                AmqpError::not_allowed(format!("vhost {} not found", open.virtual_host))
                    .during(CLASS_CONNECTION, METHOD_CONNECTION_OPEN)
                    .into(),
            );
        };
        self.shared
            .broker
            .access()
            .check_vhost_access(&self.user, &vhost.name)
            .map_err(|e| e.during(CLASS_CONNECTION, METHOD_CONNECTION_OPEN))?;
        self.session = Some(Arc::new(Session {
            connection_id: self.id,
            vhost,
            outlet: Arc::clone(&self.out) as _,
            cancel_notify: capabilities.cancel_notify,
            consumer_timeout_ms: Some(self.shared.config.limits.consumer_timeout_ms)
                .filter(|ms| *ms > 0),
            user: Arc::from(self.user.as_str()),
            events: self.shared.broker.event_sink(),
        }));
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::OpenOk(conn::OpenOk {})),
        );
        tracing::debug!(peer = %self.peer, user = %self.user, vhost = %open.virtual_host, "connection opened");
        Ok(())
    }

    fn authenticate(&self, user: &str, password: &str) -> Result<(), &'static str> {
        crate::auth::login(
            &self.shared.broker,
            &self.shared.config,
            user,
            password,
            self.peer,
        )
        .map(|_| ())
    }
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
fn parse_credentials(mechanism: Mechanism, response: &[u8]) -> Option<(String, String)> {
    match mechanism {
        Mechanism::Plain => {
            let mut parts = response.split(|b| *b == 0);
            let _authzid = parts.next()?;
            let user = parts.next()?;
            let pass = parts.next()?;
            Some((
                String::from_utf8(user.to_vec()).ok()?,
                String::from_utf8(pass.to_vec()).ok()?,
            ))
        }
        Mechanism::Amqplain => {
            let mut framed = (response.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(response);
            let table = codec::decode_field_table(&framed)?;
            let get = |k: &str| table.inner().get(k).and_then(berth_broker::args::as_string);
            Some((get("LOGIN")?, get("PASSWORD")?))
        }
        Mechanism::External => None,
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
