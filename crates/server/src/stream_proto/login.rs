//! SASL PLAIN for the stream protocol, with berth's users: the same
//! password check, per-address login budget (`crate::throttle`) and
//! loopback rule (`crate::auth`) as AMQP, MQTT and HTTP.
//!
//! Invariants:
//! - A refused login says neither whether the user exists nor why: the
//!   client gets "authentication failure", the log gets the cause.
//! - Only PLAIN is offered (no EXTERNAL yet, docs/STREAMS.md).

use std::net::SocketAddr;

use super::frame::code;
use crate::state::Shared;

/// The one mechanism offered in SaslHandshake.
pub const MECHANISM_PLAIN: &str = "PLAIN";

/// PLAIN's response `[authzid] NUL user NUL password`, split.
pub fn split_plain(data: &[u8]) -> Option<(&str, &str)> {
    let mut parts = data.splitn(3, |b| *b == 0);
    let _authzid = parts.next()?;
    let user = std::str::from_utf8(parts.next()?).ok()?;
    let password = std::str::from_utf8(parts.next()?).ok()?;
    Some((user, password))
}

/// Checks a SaslAuthenticate; the user, or the response code.
pub async fn login(
    shared: &Shared,
    mechanism: &str,
    data: &[u8],
    peer: SocketAddr,
) -> Result<String, u16> {
    if mechanism != MECHANISM_PLAIN {
        tracing::warn!(%peer, %mechanism, "stream login refused: only PLAIN is offered");
        return Err(code::SASL_MECHANISM_NOT_SUPPORTED);
    }
    let Some((user, password)) = split_plain(data) else {
        tracing::warn!(%peer, "stream login refused: a malformed PLAIN response");
        return Err(code::SASL_ERROR);
    };
    if let Err(why) = shared.logins.turn(peer.ip()).await {
        tracing::warn!(%peer, %user, "stream login not checked: {why}");
        return Err(code::AUTHENTICATION_FAILURE);
    }
    if let Err(why) = crate::auth::login(&shared.broker, &shared.config, user, password, peer) {
        tracing::warn!(%peer, %user, "stream login refused: {why}");
        return Err(code::AUTHENTICATION_FAILURE);
    }
    shared.logins.refund(peer.ip(), std::time::Instant::now());
    Ok(user.to_owned())
}

#[cfg(test)]
mod tests {
    use super::split_plain;

    #[test]
    fn plain_responses() {
        assert_eq!(split_plain(b"\0guest\0pw"), Some(("guest", "pw")));
        assert_eq!(split_plain(b"admin\0guest\0p\0w"), Some(("guest", "p\0w")));
        assert_eq!(split_plain(b"guest"), None);
    }
}
