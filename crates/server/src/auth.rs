//! Login rules, for AMQP and HTTP alike: startup of the stored users,
//! vhosts and permissions (restore, then the defaults of a new store),
//! password and certificate (`EXTERNAL`) logins with RabbitMQ's loopback
//! rule, and the failed-login throttle. The HTTP API's basic auth and tag
//! rules are in `http::auth`; the names a client certificate gives are in
//! [`crate::cert_login`].
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

/// Slows down password guessing: each source address gets
/// `auth.login_failures_per_s_max` failed logins per second answered at
/// once; beyond that each refusal waits [`crate::limits::LOGIN_FAILURE_DELAY_MS`]
/// first. The wait is an async sleep of the guessing connection only, so
/// other clients (even from the same address, with the right password)
/// log in undelayed.
#[derive(Default)]
pub struct LoginThrottle {
    /// Per source address: (start of the current one-second window,
    /// failures in it). Bounded by [`crate::limits::LOGIN_THROTTLE_ADDRESSES_MAX`].
    failures:
        parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
}

impl LoginThrottle {
    /// Records a failed login from `ip`; returns how long to wait before
    /// answering it.
    pub fn failed(&self, ip: std::net::IpAddr, per_s_max: u32) -> std::time::Duration {
        use crate::limits::{LOGIN_FAILURE_DELAY_MS, LOGIN_THROTTLE_ADDRESSES_MAX};
        let now = std::time::Instant::now();
        let second = std::time::Duration::from_secs(1);
        let mut map = self.failures.lock();
        if map.len() >= LOGIN_THROTTLE_ADDRESSES_MAX {
            map.retain(|_, (start, _)| now.duration_since(*start) < second);
        }
        let e = map.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= second {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
        if e.1 > per_s_max {
            std::time::Duration::from_millis(LOGIN_FAILURE_DELAY_MS)
        } else {
            std::time::Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LoginThrottle;

    #[test]
    fn failures_beyond_the_budget_per_second_are_delayed() {
        let t = LoginThrottle::default();
        let ip = "10.0.0.1".parse().unwrap();
        for _ in 0..3 {
            assert!(t.failed(ip, 3).is_zero());
        }
        assert!(!t.failed(ip, 3).is_zero());
        // Another address has its own budget.
        assert!(t.failed("10.0.0.2".parse().unwrap(), 3).is_zero());
    }
}
