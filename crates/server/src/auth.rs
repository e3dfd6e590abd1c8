//! Login rules, for AMQP and HTTP alike: startup of the stored users,
//! vhosts and permissions (restore, then the defaults of a new store),
//! password and certificate (`EXTERNAL`) logins with RabbitMQ's loopback
//! rule. The login budget of each address is in [`crate::throttle`]; the
//! HTTP API's basic auth and tag rules are in `http::auth`; the names a
//! client certificate gives are in [`crate::cert_login`].
//!
//! Invariants:
//! - The default user and vhost are created once per store (a marker in
//!   the store says so), so deleting `guest` lasts across restarts.
//! - A refused login says nothing about whether the user exists: unknown
//!   user and wrong password take the same path and the same hash work.
//! - Nothing here knows of connections or HTTP: callers pass the broker
//!   and configuration, so both sides may use these rules.

use std::net::SocketAddr;
use std::sync::Arc;

use berth_broker::access::{Permission, User, TAG_ADMINISTRATOR};
use berth_broker::password::PasswordHash;
use berth_broker::Broker;

use crate::config::Config;
use crate::ServerError;

/// Restores stored users, vhosts and permissions, makes sure the
/// configured vhosts exist, and on a new store creates the default user.
pub fn init(
    broker: &Broker,
    config: &Config,
    meta: &[(Vec<u8>, Vec<u8>)],
) -> Result<(), ServerError> {
    let (skipped, defaults_done) = broker.restore_access(meta);
    for s in &skipped {
        tracing::warn!("access entry not restored: {s}");
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        ServerError::Startup(format!("cannot store {what}: {e}"))
    };
    for v in &config.auth.vhosts {
        broker
            .add_vhost(v)
            .map_err(|e| fail(&format!("vhost '{v}'"), &e))?;
    }
    if !defaults_done {
        let name = &config.auth.default_user;
        if !name.is_empty() {
            broker
                .access()
                .put_user(User {
                    name: name.clone(),
                    password_hash: Some(PasswordHash::new(&config.auth.default_pass)),
                    tags: vec![TAG_ADMINISTRATOR.to_owned()],
                })
                .map_err(|e| fail("the default user", &e))?;
            let vhost = config.auth.vhosts.first().map_or("/", String::as_str);
            broker
                .access()
                .set_permission(vhost, name, Permission::all())
                .map_err(|e| fail("the default user's permissions", &e))?;
            tracing::info!(user = %name, vhost, "created the default user on a new store");
        }
        broker
            .mark_defaults_created()
            .map_err(|e| fail("the defaults marker", &e))?;
    }
    Ok(())
}

/// Why a login was refused (logged, never told to the client).
pub type Refusal = &'static str;

/// Checks a user name and password from `peer`.
pub fn login(
    broker: &Broker,
    config: &Config,
    user: &str,
    password: &str,
    peer: SocketAddr,
) -> Result<Arc<User>, Refusal> {
    let Some(u) = broker.access().authenticate(user, password) else {
        return Err("unknown user or wrong password");
    };
    check_loopback(config, user, peer)?;
    Ok(u)
}

/// `EXTERNAL`: the TLS client certificate (already verified against the
/// CA) names the user, who must exist; no password is checked.
pub fn login_external(
    broker: &Broker,
    config: &Config,
    user: &str,
    peer: SocketAddr,
) -> Result<Arc<User>, Refusal> {
    let Some(u) = broker.access().user(user) else {
        return Err("no user named by the client certificate");
    };
    check_loopback(config, user, peer)?;
    Ok(u)
}

/// RabbitMQ's `loopback_users`: such users log in from localhost only.
pub fn check_loopback(config: &Config, user: &str, peer: SocketAddr) -> Result<(), Refusal> {
    if config.auth.loopback_users.iter().any(|u| u == user) && !is_loopback(peer) {
        return Err("user may only connect via localhost (loopback_users)");
    }
    Ok(())
}

fn is_loopback(peer: SocketAddr) -> bool {
    match peer {
        SocketAddr::V4(a) => a.ip().is_loopback(),
        SocketAddr::V6(a) => {
            a.ip().is_loopback() || a.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}
