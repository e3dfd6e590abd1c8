//! The management API's authentication: HTTP basic auth against the
//! stored users, and RabbitMQ's management tag rules: any of
//! `management`, `policymaker`, `monitoring`, `administrator` may use the
//! API; `monitoring` and `administrator` see every vhost, `management`
//! only those it has permissions in; only `administrator` changes users,
//! vhosts and permissions. Handlers ask for [`Authed`] or
//! [`AdminAuthed`] as an argument and run only once it passed.
//!
//! Invariants:
//! - Wrong or missing credentials, and valid credentials with too few
//!   tags, answer 401 with RabbitMQ's reasons (`Login failed`, `Not
//!   management user`, `Not administrator user`), as RabbitMQ 3.10 does.
//! - Credentials are checked only on a turn of the address's login
//!   budget, the one AMQP logins take from too ([`crate::throttle`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use berth_broker::access::{
    User, TAG_ADMINISTRATOR, TAG_MANAGEMENT, TAG_MONITORING, TAG_POLICYMAKER,
};
use berth_broker::vhost::VHost;

use super::error::{too_many_logins, unauthorized};
use super::{sorted_vhosts, vhost_or_404, HttpState};
use crate::permissions::{authorise, Action};
use crate::state::Shared;

/// A request that passed HTTP basic auth with a management user (and the
/// loopback rule): handlers that take it as an argument answer 401 before
/// they run. It carries the user, for the vhosts it may see.
pub(crate) struct Authed(pub Arc<User>);

impl Authed {
    /// Whether this user may see objects of `vhost` (RabbitMQ's rule:
    /// `administrator` and `monitoring` see every vhost, others only those
    /// they have permissions in).
    pub(crate) fn sees(&self, st: &HttpState, vhost: &str) -> bool {
        sees_vhost(&st.shared, &self.0, vhost)
    }

    /// The vhost named in a URL: 404 when it does not exist, 401 when this
    /// user may not see it (RabbitMQ's answer).
    pub(crate) fn vhost(&self, st: &HttpState, name: &str) -> Result<Arc<VHost>, Response> {
        let v = vhost_or_404(st, name)?;
        if !self.sees(st, name) {
            return Err(unauthorized("User not authorised to access virtual host"));
        }
        Ok(v)
    }

    /// The vhost named in a URL, for an action its permissions must allow:
    /// as [`Authed::vhost`], then each action of `needs` checked by
    /// [`crate::permissions::authorise`], the function AMQP connections
    /// ask too. Refused with RabbitMQ's 401 "Access
    /// refused.". Administrators are asked too: RabbitMQ runs these
    /// actions through an AMQP channel opened as the user, so an
    /// administrator without permissions in the vhost is refused there
    /// (creating a vhost grants its creator full ones, see `vhosts::put`);
    /// with `needs` empty (reading) administrators see every vhost.
    pub(crate) fn may(
        &self,
        st: &HttpState,
        vhost: &str,
        needs: &[Action<'_>],
    ) -> Result<Arc<VHost>, Response> {
        let v = self.vhost(st, vhost)?;
        let access = st.shared.broker.access();
        for &action in needs {
            if let Err(e) = authorise(access, &self.0.name, &v, action) {
                tracing::debug!(user = %self.0.name, error = %e, "management API action refused");
                return Err(unauthorized("Access refused."));
            }
        }
        Ok(v)
    }

    /// Whether this user sees every vhost and connection (`administrator`
    /// and `monitoring`).
    pub(crate) fn sees_all(&self) -> bool {
        self.0.has_tag(TAG_ADMINISTRATOR) || self.0.has_tag(TAG_MONITORING)
    }

    /// Whether this user may see a connection and its channels (RabbitMQ's
    /// rule: `administrator` and `monitoring` see all, others their own).
    pub(crate) fn sees_connection(&self, c: &crate::registry::ConnInfo) -> bool {
        self.sees_all() || c.user == self.0.name
    }

    /// Whether this user may close a connection (`administrator`, or its
    /// owner).
    pub(crate) fn may_close(&self, c: &crate::registry::ConnInfo) -> bool {
        self.0.has_tag(TAG_ADMINISTRATOR) || c.user == self.0.name
    }

    /// The vhosts this user may see, sorted by name.
    pub(crate) fn vhosts(&self, st: &HttpState) -> Vec<Arc<VHost>> {
        let mut all = sorted_vhosts(st);
        all.retain(|v| self.sees(st, &v.name));
        all
    }
}

impl FromRequestParts<HttpState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &HttpState) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        authenticate(&st.shared, &parts.headers, peer).map(Authed)
    }
}

/// A request that passed HTTP basic auth with an `administrator` user;
/// it carries the user (creating a vhost grants it permissions there).
pub(crate) struct AdminAuthed(pub Arc<User>);

impl FromRequestParts<HttpState> for AdminAuthed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &HttpState) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        authenticate_admin(&st.shared, &parts.headers, peer).map(AdminAuthed)
    }
}

fn is_management(u: &User) -> bool {
    [
        TAG_MANAGEMENT,
        TAG_POLICYMAKER,
        TAG_MONITORING,
        TAG_ADMINISTRATOR,
    ]
    .iter()
    .any(|t| u.has_tag(t))
}

/// Checks HTTP basic credentials: the user must exist, know its password,
/// obey the loopback rule and have a management tag.
pub fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<User>, Response> {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized("HTTP basic authentication required"));
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return Err(unauthorized("only HTTP basic authentication is supported"));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let Some((user, password)) = decoded.as_deref().and_then(|s| s.split_once(':')) else {
        return Err(unauthorized("malformed basic authentication header"));
    };
    let u = crate::auth::login(&shared.broker, &shared.config, user, password, peer).map_err(
        |why| {
            tracing::info!(%peer, %user, "HTTP login refused: {why}");
            let mut r = unauthorized("Login failed");
            r.extensions_mut().insert(LoginFailed);
            r
        },
    )?;
    if !is_management(&u) {
        return Err(unauthorized("Not management user"));
    }
    Ok(u)
}

/// Marks the answer to a request whose credentials were wrong, for
/// [`throttle_failed_logins`].
#[derive(Clone, Copy)]
struct LoginFailed;

/// Middleware: a request with credentials takes a turn from its address's
/// login budget ([`crate::throttle`], shared with AMQP logins) before it
/// runs, waiting asynchronously for it, so a password-guessing HTTP client
/// slows itself down and no other address; beyond the budget's longest
/// wait it is answered 429 unchecked. The turn is given back when the
/// answer is not a failed login, so only wrong credentials spend it (a
/// request holds its turn while it runs).
pub async fn throttle_logins(
    axum::extract::State(st): axum::extract::State<HttpState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !request.headers().contains_key(header::AUTHORIZATION) {
        return next.run(request).await;
    }
    if let Err(why) = st.shared.logins.turn(peer.ip()).await {
        tracing::info!(%peer, "HTTP login not checked: {why}");
        return too_many_logins(&why);
    }
    let response = next.run(request).await;
    if response.extensions().get::<LoginFailed>().is_none() {
        st.shared
            .logins
            .refund(peer.ip(), std::time::Instant::now());
    }
    response
}

/// [`authenticate`], then the `administrator` tag.
pub fn authenticate_admin(
    shared: &Shared,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<User>, Response> {
    let u = authenticate(shared, headers, peer)?;
    if !u.has_tag(TAG_ADMINISTRATOR) {
        return Err(unauthorized("Not administrator user"));
    }
    Ok(u)
}

/// May `u` see `vhost` (administrator and monitoring see all; others the
/// vhosts they have permissions in)?
pub fn sees_vhost(shared: &Shared, u: &User, vhost: &str) -> bool {
    u.has_tag(TAG_ADMINISTRATOR)
        || u.has_tag(TAG_MONITORING)
        || shared.broker.access().permission(vhost, &u.name).is_some()
}
