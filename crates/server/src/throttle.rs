//! The login budget of each source address: one token bucket per address,
//! shared by all its connections, AMQP and HTTP alike, so that opening
//! more connections does not buy more password guesses.
//!
//! The bucket is kept as GCRA (the "generic cell rate algorithm"): one
//! instant per address, its *theoretical arrival time* `tat`. A bucket is
//! full when `tat <= now`; taking a token moves `tat` on by one interval
//! (`1 / rate`); a token is there while `tat` stays within one second
//! (the burst: `rate` tokens) of now. A login attempt takes its token
//! *before* its password is checked ([`LoginThrottle::admit`]): when the
//! bucket is empty the attempt waits for its turn, when the turns are
//! booked more than [`limits::LOGIN_WAIT_MS_MAX`] ahead it is refused
//! unchecked; a login that succeeds gives its token back
//! ([`LoginThrottle::refund`]).
//!
//! Invariants:
//! - From one address, at most `rate + rate * t` passwords are checked
//!   and found wrong in any `t` seconds, however many connections ask.
//! - Memory is fixed when the throttle is built: a table of
//!   [`limits::LOGIN_THROTTLE_ADDRESSES_MAX`] entries in sets of [`WAYS`];
//!   each call locks one set and looks at its `WAYS` entries, nothing more
//!   (no global lock, no scan).
//! - Forgetting an address only ever gives it a full bucket back; one
//!   address's failures never charge another address.
//! - The set an address falls in depends on a key drawn at startup, so
//!   nobody can pick addresses that push a given one out.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::limits;

/// Entries per set: a new address replaces the fullest bucket of its set,
/// so an address in debt is not forgotten while its set has fuller ones.
pub const WAYS: usize = 4;

const NS_PER_S: u64 = 1_000_000_000;

/// What a login attempt must do before its password is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Check it now.
    Now,
    /// Wait this long (an async sleep of this attempt only), then check it.
    After(Duration),
    /// Do not check it: the address has booked its turns further ahead than
    /// [`limits::LOGIN_WAIT_MS_MAX`]. An attempt this long from now would
    /// be checked at once.
    Refused { retry_after: Duration },
}

/// A login refused without its password checked: its address booked its
/// turns too far ahead. Its text is the answer the client gets.
#[derive(Debug, Clone, Copy)]
pub struct NotChecked {
    pub ip: IpAddr,
    pub retry_after: Duration,
}

impl NotChecked {
    /// Whole seconds until a login from the address is checked at once.
    pub fn retry_after_s(&self) -> u64 {
        self.retry_after.as_secs() + u64::from(self.retry_after.subsec_nanos() > 0)
    }
}

impl std::fmt::Display for NotChecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "too many failed logins from {}; no login from this address is checked for \
             the next {} s: wait, then try again with the right credentials",
            self.ip,
            self.retry_after_s()
        )
    }
}

/// The key of a source address: an IPv4 address (also when written as an
/// IPv4-mapped IPv6 address), or an IPv6 `/64`, the block one host or
/// subscriber usually has, so a host cannot cycle through its own
/// addresses for fresh budgets.
pub fn address_key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => u128::from(v4.to_ipv6_mapped()),
            None => u128::from(a) & !u128::from(u64::MAX),
        },
    }
}

#[derive(Clone, Copy, Default)]
struct Entry {
    key: Option<u128>,
    /// Theoretical arrival time, in ns since the throttle's epoch.
    tat_ns: u64,
}

/// Failed-login budgets per source address (see the module doc).
pub struct LoginThrottle {
    sets: Box<[Mutex<[Entry; WAYS]>]>,
    hasher: RandomState,
    epoch: Instant,
    /// `1 / rate`: a token comes back this often.
    interval_ns: u64,
    /// How far ahead of now `tat` may be while a token is left: one second,
    /// so the burst is `rate` tokens.
    burst_ns: u64,
    wait_max_ns: u64,
}

impl LoginThrottle {
    /// A throttle of [`limits::LOGIN_THROTTLE_ADDRESSES_MAX`] addresses,
    /// `failures_per_s` tokens per second and as many at once, waits up to
    /// [`limits::LOGIN_WAIT_MS_MAX`].
    pub fn new(failures_per_s: u32) -> Self {
        Self::with(
            limits::LOGIN_THROTTLE_ADDRESSES_MAX,
            failures_per_s,
            Duration::from_millis(limits::LOGIN_WAIT_MS_MAX),
            Instant::now(),
        )
    }

    /// As [`LoginThrottle::new`], with every bound given (for tests).
    ///
    /// # Panics
    /// If `failures_per_s` is 0 or `addresses` is not a power of two of at
    /// least [`WAYS`] (the settings table refuses a rate of 0).
    pub fn with(addresses: usize, failures_per_s: u32, wait_max: Duration, epoch: Instant) -> Self {
        assert!(
            failures_per_s > 0,
            "a login rate of 0 is refused by the settings"
        );
        assert!(addresses >= WAYS && addresses.is_power_of_two());
        Self {
            sets: (0..addresses / WAYS)
                .map(|_| Mutex::new([Entry::default(); WAYS]))
                .collect(),
            hasher: RandomState::new(),
            epoch,
            interval_ns: NS_PER_S / u64::from(failures_per_s),
            burst_ns: NS_PER_S,
            wait_max_ns: u64::try_from(wait_max.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Takes the token a login attempt from `ip` needs before its password
    /// is checked (none is taken when the answer is `Refused`).
    pub fn admit(&self, ip: IpAddr, now: Instant) -> Admission {
        let now_ns = self.ns(now);
        self.with_entry(ip, now_ns, |e| {
            let next = e.tat_ns.max(now_ns) + self.interval_ns;
            let turn = next.saturating_sub(self.burst_ns);
            if turn <= now_ns {
                e.tat_ns = next;
                return Admission::Now;
            }
            let wait = turn - now_ns;
            if wait > self.wait_max_ns {
                return Admission::Refused {
                    retry_after: Duration::from_nanos(wait),
                };
            }
            e.tat_ns = next;
            Admission::After(Duration::from_nanos(wait))
        })
    }

    /// [`LoginThrottle::admit`] now, and the wait for the turn it gives
    /// (an async sleep of this attempt only); `Err` when the attempt is
    /// refused unchecked.
    pub async fn turn(&self, ip: IpAddr) -> Result<(), NotChecked> {
        match self.admit(ip, Instant::now()) {
            Admission::Now => Ok(()),
            Admission::After(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            Admission::Refused { retry_after } => Err(NotChecked { ip, retry_after }),
        }
    }

    /// Gives back the token of a login from `ip` that succeeded.
    pub fn refund(&self, ip: IpAddr, now: Instant) {
        let now_ns = self.ns(now);
        let key = address_key(ip);
        let mut set = self.set(key).lock();
        if let Some(e) = set.iter_mut().find(|e| e.key == Some(key)) {
            e.tat_ns = e.tat_ns.saturating_sub(self.interval_ns).max(now_ns);
        }
    }

    /// Addresses remembered now (at most the table's size).
    pub fn addresses(&self) -> usize {
        self.sets
            .iter()
            .map(|s| s.lock().iter().filter(|e| e.key.is_some()).count())
            .sum()
    }

    fn ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn set(&self, key: u128) -> &Mutex<[Entry; WAYS]> {
        // The table's length is a power of two.
        let h = usize::try_from(self.hasher.hash_one(key) & u64::from(u32::MAX)).unwrap_or(0);
        &self.sets[h & (self.sets.len() - 1)]
    }

    /// Runs `f` on the entry of `ip`, making one (a full bucket) in place
    /// of the fullest of its set if it has none.
    fn with_entry<R>(&self, ip: IpAddr, now_ns: u64, f: impl FnOnce(&mut Entry) -> R) -> R {
        let key = address_key(ip);
        let mut set = self.set(key).lock();
        let i = match set.iter().position(|e| e.key == Some(key)) {
            Some(i) => i,
            None => {
                let fullest = (0..WAYS)
                    .min_by_key(|&i| set[i].key.map_or(0, |_| set[i].tat_ns.max(1)))
                    .unwrap_or(0);
                set[fullest] = Entry {
                    key: Some(key),
                    tat_ns: now_ns,
                };
                fullest
            }
        };
        f(&mut set[i])
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use super::{address_key, Admission, LoginThrottle};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn throttle(addresses: usize, rate: u32) -> (LoginThrottle, Instant) {
        let t0 = Instant::now();
        (
            LoginThrottle::with(addresses, rate, Duration::from_secs(5), t0),
            t0,
        )
    }

    #[test]
    fn a_burst_of_rate_then_one_turn_per_interval() {
        let (t, t0) = throttle(64, 10);
        let a = ip("10.0.0.1");
        for _ in 0..10 {
            assert_eq!(t.admit(a, t0), Admission::Now);
        }
        assert_eq!(t.admit(a, t0), Admission::After(Duration::from_millis(100)));
        assert_eq!(t.admit(a, t0), Admission::After(Duration::from_millis(200)));
        // Another address has its own budget.
        assert_eq!(t.admit(ip("10.0.0.2"), t0), Admission::Now);
    }

    /// 50 connections from one address, each asking again as soon as it is
    /// answered, for 4 s of simulated time: the passwords checked are the
    /// burst plus the rate per second, not 50 times that.
    #[test]
    fn the_budget_is_per_address_across_connections() {
        let (t, t0) = throttle(64, 5);
        let a = ip("192.0.2.7");
        let horizon = Duration::from_secs(4);
        // When each connection's attempt is checked next.
        let mut next = vec![Duration::ZERO; 50];
        let mut checked = 0u32;
        loop {
            let (c, &at) = next.iter().enumerate().min_by_key(|(_, at)| **at).unwrap();
            if at > horizon {
                break;
            }
            match t.admit(a, t0 + at) {
                Admission::Now => {
                    checked += 1;
                    next[c] = at + Duration::from_millis(1);
                }
                Admission::After(d) => {
                    if at + d <= horizon {
                        checked += 1;
                    }
                    next[c] = at + d + Duration::from_millis(1);
                }
                Admission::Refused { .. } => next[c] = at + Duration::from_millis(1),
            }
        }
        // burst 5 + 5/s * 4 s, and one for the turn that falls on the end.
        assert!(checked <= 5 + 5 * 4 + 1, "{checked} passwords checked");
        assert!(checked >= 5 + 5 * 4 - 1, "{checked} passwords checked");
    }

    #[test]
    fn turns_booked_beyond_the_wait_max_are_refused_and_not_charged() {
        let (t, t0) = throttle(64, 2);
        let a = ip("10.0.0.1");
        let mut waits = 0;
        loop {
            match t.admit(a, t0) {
                Admission::Now => {}
                Admission::After(d) => {
                    assert!(d <= Duration::from_secs(5));
                    waits += 1;
                }
                Admission::Refused { retry_after } => {
                    assert!(retry_after > Duration::from_secs(5), "{retry_after:?}");
                    break;
                }
            }
        }
        assert_eq!(waits, 10, "2/s for 5 s of waits");
        // A refusal took no token: the next one is refused the same way.
        let again = t.admit(a, t0);
        assert!(matches!(again, Admission::Refused { .. }), "{again:?}");
        // Once the booked turns are past, the address is checked again.
        assert_eq!(t.admit(a, t0 + Duration::from_secs(6)), Admission::Now);
    }

    #[test]
    fn a_successful_login_gives_its_token_back() {
        let (t, t0) = throttle(64, 3);
        let a = ip("10.0.0.1");
        for _ in 0..100 {
            assert_eq!(t.admit(a, t0), Admission::Now);
            t.refund(a, t0);
        }
        // A client that mistypes once is not made to wait.
        assert_eq!(t.admit(a, t0), Admission::Now);
        t.refund(a, t0);
        // Refunds do not fill a bucket past its burst.
        for _ in 0..3 {
            assert_eq!(t.admit(a, t0), Admission::Now);
        }
        assert!(matches!(t.admit(a, t0), Admission::After(_)));
    }

    #[test]
    fn memory_stays_at_the_table_size_and_debtors_are_kept() {
        let (t, t0) = throttle(16, 1);
        let debtor = ip("198.51.100.1");
        for _ in 0..4 {
            let _ = t.admit(debtor, t0);
        }
        for i in 0..10_000u32 {
            let [_, b, c, d] = i.to_be_bytes();
            assert_eq!(t.admit(IpAddr::from([10, b, c, d]), t0), Admission::Now);
            assert!(t.addresses() <= 16);
        }
        assert_eq!(t.addresses(), 16);
        // The newcomers' buckets (one token taken) were fuller than the
        // debtor's, so its debt is remembered.
        assert!(matches!(t.admit(debtor, t0), Admission::After(d) if d >= Duration::from_secs(3)));
    }

    #[test]
    fn ipv4_mapped_and_one_ipv6_64_are_one_address() {
        assert_eq!(
            address_key(ip("192.0.2.1")),
            address_key(ip("::ffff:192.0.2.1"))
        );
        assert_eq!(
            address_key(ip("2001:db8:1:2::1")),
            address_key(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            address_key(ip("2001:db8:1:2::1")),
            address_key(ip("2001:db8:1:3::1"))
        );
        assert_ne!(address_key(ip("::1")), address_key(ip("0.0.0.1")));
        let (t, t0) = throttle(64, 1);
        assert_eq!(t.admit(ip("2001:db8::1"), t0), Admission::Now);
        assert!(matches!(
            t.admit(ip("2001:db8::2"), t0),
            Admission::After(_)
        ));
    }
}
