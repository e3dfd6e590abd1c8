//! A CONNECT's credentials to an AMQP user and vhost, as RabbitMQ's MQTT
//! plugin reads them: the user name is `vhost:user` (split at the first
//! `:`) or a plain `user` in the default vhost (the first of
//! `auth.vhosts`, `/` by default); the password is the user's AMQP
//! password. On MQTTS, a client that sends no password and whose TLS
//! client certificate was verified logs in as the user the certificate
//! names (RabbitMQ's `mqtt.ssl_cert_login`, picked as for AMQP's
//! `EXTERNAL`: `tls.cert_login_from`), in the vhost its user name names
//! or the default one. Logins share the per-address budget of AMQP and HTTP
//! (`crate::throttle`) and RabbitMQ's loopback rule (`crate::auth`).
//!
//! Invariants:
//! - A refused login says neither whether the user exists nor why: the
//!   client gets "bad user name or password" or "not authorized", the
//!   log gets the cause.
//! - A client that sends no user name is refused: berth has no anonymous
//!   MQTT login (RabbitMQ's `mqtt.allow_anonymous`), see docs/MQTT.md.

use std::net::SocketAddr;
use std::sync::Arc;

use berth_broker::vhost::VHost;
use mqtt5_protocol::ReasonCode;

use crate::state::Shared;

/// Who logged in, and where.
pub struct Login {
    pub user: String,
    pub vhost: Arc<VHost>,
}

/// The vhost and user named by an MQTT user name.
pub fn split_user_name<'a>(name: &'a str, default_vhost: &'a str) -> (&'a str, &'a str) {
    match name.split_once(':') {
        Some((vhost, user)) if !vhost.is_empty() => (vhost, user),
        _ => (default_vhost, name),
    }
}

/// Checks a CONNECT's user name and password from `peer`; the refusal is
/// the CONNACK reason code (mapped to a 3.1.1 return code by the codec).
pub async fn login(
    shared: &Shared,
    user_name: Option<&str>,
    password: Option<&[u8]>,
    peer: SocketAddr,
    cert_name: Option<&str>,
) -> Result<Login, ReasonCode> {
    if let (None, Some(cert_user)) = (password, cert_name) {
        return login_by_certificate(shared, user_name, cert_user, peer);
    }
    let (Some(name), Some(password)) = (user_name, password) else {
        tracing::warn!(%peer, "MQTT login refused: no user name or password (anonymous MQTT logins are off)");
        return Err(ReasonCode::BadUsernameOrPassword);
    };
    let default_vhost = shared
        .config
        .auth
        .vhosts
        .first()
        .map_or("/", String::as_str);
    let (vhost_name, user) = split_user_name(name, default_vhost);
    let Ok(password) = std::str::from_utf8(password) else {
        tracing::warn!(%peer, %user, "MQTT login refused: password is not UTF-8");
        return Err(ReasonCode::BadUsernameOrPassword);
    };
    if let Err(why) = shared.logins.turn(peer.ip()).await {
        tracing::warn!(%peer, %user, "MQTT login not checked: {why}");
        return Err(ReasonCode::ServerBusy);
    }
    if let Err(why) = crate::auth::login(&shared.broker, &shared.config, user, password, peer) {
        tracing::warn!(%peer, %user, "MQTT login refused: {why}");
        return Err(ReasonCode::BadUsernameOrPassword);
    }
    shared.logins.refund(peer.ip(), std::time::Instant::now());
    into_vhost(shared, user, vhost_name, peer)
}

/// The vhost `vhost_name`, if `user` may use it.
fn into_vhost(
    shared: &Shared,
    user: &str,
    vhost_name: &str,
    peer: SocketAddr,
) -> Result<Login, ReasonCode> {
    let Some(vhost) = shared.broker.vhost(vhost_name) else {
        tracing::warn!(%peer, %user, vhost = %vhost_name, "MQTT login refused: no such vhost");
        return Err(ReasonCode::NotAuthorized);
    };
    if let Err(e) = shared.broker.access().check_vhost_access(user, &vhost.name) {
        tracing::warn!(%peer, %user, vhost = %vhost_name, "MQTT login refused: {}", e.reply_text());
        return Err(ReasonCode::NotAuthorized);
    }
    Ok(Login {
        user: user.to_owned(),
        vhost,
    })
}

/// A login by TLS client certificate: `cert_user` must exist; a CONNECT
/// user name may name the vhost (`vhost:...`), not another user.
fn login_by_certificate(
    shared: &Shared,
    user_name: Option<&str>,
    cert_user: &str,
    peer: SocketAddr,
) -> Result<Login, ReasonCode> {
    let default_vhost = shared
        .config
        .auth
        .vhosts
        .first()
        .map_or("/", String::as_str);
    let (vhost_name, named) = split_user_name(user_name.unwrap_or(cert_user), default_vhost);
    if !named.is_empty() && named != cert_user {
        tracing::warn!(%peer, user = %named, certificate = %cert_user, "MQTT login refused: the user name is not the certificate's");
        return Err(ReasonCode::BadUsernameOrPassword);
    }
    if let Err(why) = crate::auth::login_external(&shared.broker, &shared.config, cert_user, peer) {
        tracing::warn!(%peer, user = %cert_user, "MQTT certificate login refused: {why}");
        return Err(ReasonCode::BadUsernameOrPassword);
    }
    into_vhost(shared, cert_user, vhost_name, peer)
}

#[cfg(test)]
mod tests {
    use super::split_user_name;

    #[test]
    fn user_names_name_a_vhost_as_rabbitmq_reads_them() {
        assert_eq!(split_user_name("guest", "/"), ("/", "guest"));
        assert_eq!(split_user_name("dev:alice", "/"), ("dev", "alice"));
        assert_eq!(split_user_name("dev:al:ice", "/"), ("dev", "al:ice"));
        assert_eq!(split_user_name(":bob", "/"), ("/", ":bob"));
    }
}
