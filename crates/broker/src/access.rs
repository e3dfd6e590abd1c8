//! Who may do what: users (with RabbitMQ's password hashes and tags),
//! per-vhost permissions (configure / write / read regular expressions) and
//! topic permissions, stored durably in the journal's metadata, and the
//! checks the server makes on every AMQP operation with RabbitMQ's reply
//! texts.
//!
//! Invariants:
//! - A change returns only once it is durable (metadata writes wait for
//!   the store), and memory is updated only after the write succeeded, so
//!   what a client was told is what a restart restores.
//! - A permission pattern is a regular expression matched anywhere in the
//!   name (unanchored, as RabbitMQ's `re:run`); the empty pattern matches
//!   nothing.
//! - Checks never take the write lock: they read a snapshot under a read
//!   lock, so a slow metadata write never stalls publishers.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_protocol::AMQPValue;
use parking_lot::{Mutex, RwLock};
use regex::Regex;

use crate::args::as_string;
use crate::durable::{read_table, split_key, table_bytes, Journal, JournalError};
use crate::error::{AmqpError, AmqpResult};
use crate::password::{Algorithm, PasswordHash};

/// The management tags RabbitMQ knows (others are kept but grant nothing).
pub const TAG_ADMINISTRATOR: &str = "administrator";
pub const TAG_MONITORING: &str = "monitoring";
pub const TAG_POLICYMAKER: &str = "policymaker";
pub const TAG_MANAGEMENT: &str = "management";

/// One user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// `None`: the user cannot log in with a password (EXTERNAL only).
    pub password_hash: Option<PasswordHash>,
    pub tags: Vec<String>,
}

impl User {
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
}

/// A compiled permission pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub source: String,
    /// `None` for the empty pattern, which matches nothing.
    re: Option<Regex>,
}

impl Pattern {
    /// Compiles a pattern; the error says which pattern and why.
    pub fn new(source: &str) -> Result<Self, AccessError> {
        let re = if source.is_empty() {
            None
        } else {
            Some(Regex::new(source).map_err(|e| {
                AccessError::Invalid(format!("invalid regular expression '{source}': {e}"))
            })?)
        };
        Ok(Self {
            source: source.to_owned(),
            re,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.re.as_ref().is_some_and(|r| r.is_match(name))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// A user's permissions in one vhost.
#[derive(Debug, Clone, PartialEq)]
pub struct Permission {
    pub configure: Pattern,
    pub write: Pattern,
    pub read: Pattern,
}

impl Permission {
    pub fn new(configure: &str, write: &str, read: &str) -> Result<Self, AccessError> {
        Ok(Self {
            configure: Pattern::new(configure)?,
            write: Pattern::new(write)?,
            read: Pattern::new(read)?,
        })
    }

    /// Everything (`.*` three times), as the default user gets.
    pub fn all() -> Self {
        Self::new(".*", ".*", ".*").expect("'.*' compiles")
    }

    fn pattern(&self, p: Perm) -> &Pattern {
        match p {
            Perm::Configure => &self.configure,
            Perm::Write => &self.write,
            Perm::Read => &self.read,
        }
    }
}

/// A user's topic permission on one exchange of a vhost: patterns on
/// routing keys, where `{username}` and `{vhost}` stand for the user's
/// name and the vhost (expanded when the check runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPermission {
    pub exchange: String,
    pub write: String,
    pub read: String,
}

/// The three kinds of access RabbitMQ distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    Configure,
    Write,
    Read,
}

/// What a permission is checked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    Exchange(&'a str),
    Queue(&'a str),
}

/// Why a change to users or permissions was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AccessError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

#[derive(Default)]
struct State {
    users: BTreeMap<String, Arc<User>>,
    /// vhost → user → permission.
    permissions: BTreeMap<String, BTreeMap<String, Arc<Permission>>>,
    /// (vhost, user) → exchange → topic permission.
    topic: BTreeMap<(String, String), BTreeMap<String, TopicPermission>>,
}

/// Users and permissions of the whole broker.
pub struct Access {
    journal: Arc<dyn Journal>,
    state: RwLock<State>,
    /// Serialises changes so the journal and memory see them in one order.
    changes: Mutex<()>,
}

// --- Metadata encodings (docs/FORMAT.md, "Broker payloads and metadata") ---

/// Key of a vhost created at runtime or by configuration: `v\0NAME`
/// (empty value).
pub fn vhost_key(name: &str) -> Vec<u8> {
    join(&[b"v", name.as_bytes()])
}

/// Key of the marker saying the default user and vhost were created once
/// (so deleting them is not undone by a restart): `d`.
pub const DEFAULTS_KEY: &[u8] = b"d";

/// Key of a user: `u\0NAME`.
pub fn user_key(name: &str) -> Vec<u8> {
    join(&[b"u", name.as_bytes()])
}

/// Key of a permission: `p\0VHOST\0USER`.
pub fn permission_key(vhost: &str, user: &str) -> Vec<u8> {
    join(&[b"p", vhost.as_bytes(), user.as_bytes()])
}

/// Key of a topic permission: `t\0VHOST\0USER\0EXCHANGE`.
pub fn topic_permission_key(vhost: &str, user: &str, exchange: &str) -> Vec<u8> {
    join(&[b"t", vhost.as_bytes(), user.as_bytes(), exchange.as_bytes()])
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&0u8)
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(v.as_bytes().to_vec().into())
}

fn user_value(u: &User) -> Vec<u8> {
    let (hash, algorithm) = u
        .password_hash
        .as_ref()
        .map_or((String::new(), Algorithm::Sha256), |h| {
            (h.to_base64(), h.algorithm)
        });
    table_bytes(&[
        ("password_hash", s(&hash)),
        ("hashing_algorithm", s(algorithm.name())),
        ("tags", s(&u.tags.join(","))),
    ])
}

fn permission_value(p: &Permission) -> Vec<u8> {
    table_bytes(&[
        ("configure", s(&p.configure.source)),
        ("write", s(&p.write.source)),
        ("read", s(&p.read.source)),
    ])
}

fn topic_value(t: &TopicPermission) -> Vec<u8> {
    table_bytes(&[("write", s(&t.write)), ("read", s(&t.read))])
}

/// Splits RabbitMQ's comma-separated tag list.
pub fn parse_tags(tags: &str) -> Vec<String> {
    tags.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Access {
    pub fn new(journal: Arc<dyn Journal>) -> Self {
        Self {
            journal,
            state: RwLock::new(State::default()),
            changes: Mutex::new(()),
        }
    }

    /// Rebuilds users and permissions from stored metadata; returns what
    /// could not be used, with why (those entries stay in the journal).
    pub fn restore<'a>(&self, meta: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<String> {
        let mut skipped = Vec::new();
        let mut st = self.state.write();
        for (key, value) in meta {
            let parts = split_key(key);
            let kind = parts.first().map(String::as_str);
            if !matches!(kind, Some("u" | "p" | "t")) {
                continue;
            }
            let Some(t) = read_table(value) else {
                skipped.push(format!("{parts:?}: value is not a field table"));
                continue;
            };
            let get = |k: &str| t.inner().get(k).and_then(as_string).unwrap_or_default();
            match (kind, parts.len()) {
                (Some("u"), 2) => {
                    let hash = get("password_hash");
                    let password_hash = if hash.is_empty() {
                        None
                    } else {
                        let Some(alg) = Algorithm::from_name(&get("hashing_algorithm")) else {
                            skipped.push(format!("{parts:?}: unknown hashing_algorithm"));
                            continue;
                        };
                        match PasswordHash::from_base64(alg, &hash) {
                            Ok(h) => Some(h),
                            Err(e) => {
                                skipped.push(format!("{parts:?}: {e}"));
                                continue;
                            }
                        }
                    };
                    let u = User {
                        name: parts[1].clone(),
                        password_hash,
                        tags: parse_tags(&get("tags")),
                    };
                    st.users.insert(u.name.clone(), Arc::new(u));
                }
                (Some("p"), 3) => {
                    match Permission::new(&get("configure"), &get("write"), &get("read")) {
                        Ok(p) => {
                            st.permissions
                                .entry(parts[1].clone())
                                .or_default()
                                .insert(parts[2].clone(), Arc::new(p));
                        }
                        Err(e) => skipped.push(format!("{parts:?}: {e}")),
                    }
                }
                (Some("t"), 4) => {
                    st.topic
                        .entry((parts[1].clone(), parts[2].clone()))
                        .or_default()
                        .insert(
                            parts[3].clone(),
                            TopicPermission {
                                exchange: parts[3].clone(),
                                write: get("write"),
                                read: get("read"),
                            },
                        );
                }
                _ => skipped.push(format!("{parts:?}: malformed key")),
            }
        }
        skipped
    }

    // --- Users ------------------------------------------------------------

    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.state.read().users.get(name).cloned()
    }

    /// Every user, by name.
    pub fn users(&self) -> Vec<Arc<User>> {
        self.state.read().users.values().cloned().collect()
    }

    /// Checks a password. An unknown user costs the same hash computation
    /// as a known one, so timing does not reveal which names exist.
    pub fn authenticate(&self, name: &str, password: &str) -> Option<Arc<User>> {
        let user = self.user(name);
        let ok = match user.as_ref().and_then(|u| u.password_hash.as_ref()) {
            Some(h) => h.verify(password),
            None => {
                let _same_cost_as_a_real_check = PasswordHash::dummy().verify(password);
                false
            }
        };
        user.filter(|_| ok)
    }

    /// Creates or replaces a user.
    pub fn put_user(&self, user: User) -> Result<(), AccessError> {
        if user.name.is_empty() {
            return Err(AccessError::Invalid("a user name cannot be empty".into()));
        }
        let _g = self.changes.lock();
        self.journal
            .put_meta(&user_key(&user.name), &user_value(&user))?;
        self.state
            .write()
            .users
            .insert(user.name.clone(), Arc::new(user));
        Ok(())
    }

    /// Deletes a user and all its permissions.
    pub fn delete_user(&self, name: &str) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        if !self.state.read().users.contains_key(name) {
            return Err(AccessError::NotFound(format!("no user '{name}'")));
        }
        let (perms, topics) = {
            let st = self.state.read();
            let perms: Vec<String> = st
                .permissions
                .iter()
                .filter(|(_, m)| m.contains_key(name))
                .map(|(v, _)| v.clone())
                .collect();
            let topics: Vec<(String, String)> = st
                .topic
                .iter()
                .filter(|((_, u), _)| u == name)
                .flat_map(|((v, _), m)| m.keys().map(|x| (v.clone(), x.clone())))
                .collect();
            (perms, topics)
        };
        for v in &perms {
            self.journal.delete_meta(&permission_key(v, name))?;
        }
        for (v, x) in &topics {
            self.journal
                .delete_meta(&topic_permission_key(v, name, x))?;
        }
        self.journal.delete_meta(&user_key(name))?;
        let mut st = self.state.write();
        st.users.remove(name);
        for m in st.permissions.values_mut() {
            m.remove(name);
        }
        st.topic.retain(|(_, u), _| u != name);
        Ok(())
    }

    // --- Permissions ------------------------------------------------------

    pub fn permission(&self, vhost: &str, user: &str) -> Option<Arc<Permission>> {
        self.state
            .read()
            .permissions
            .get(vhost)
            .and_then(|m| m.get(user))
            .cloned()
    }

    /// Every permission as (vhost, user, permission).
    pub fn permissions(&self) -> Vec<(String, String, Arc<Permission>)> {
        let st = self.state.read();
        st.permissions
            .iter()
            .flat_map(|(v, m)| m.iter().map(|(u, p)| (v.clone(), u.clone(), Arc::clone(p))))
            .collect()
    }

    /// Sets a user's permissions in a vhost (the user must exist; the
    /// caller checks the vhost).
    pub fn set_permission(
        &self,
        vhost: &str,
        user: &str,
        p: Permission,
    ) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        if !self.state.read().users.contains_key(user) {
            return Err(AccessError::NotFound(format!("no user '{user}'")));
        }
        self.journal
            .put_meta(&permission_key(vhost, user), &permission_value(&p))?;
        self.state
            .write()
            .permissions
            .entry(vhost.to_owned())
            .or_default()
            .insert(user.to_owned(), Arc::new(p));
        Ok(())
    }

    pub fn clear_permission(&self, vhost: &str, user: &str) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        if self.permission(vhost, user).is_none() {
            return Err(AccessError::NotFound(format!(
                "no permissions for user '{user}' in vhost '{vhost}'"
            )));
        }
        self.journal.delete_meta(&permission_key(vhost, user))?;
        if let Some(m) = self.state.write().permissions.get_mut(vhost) {
            m.remove(user);
        }
        Ok(())
    }

    /// Every topic permission as (vhost, user, permission).
    pub fn topic_permissions(&self) -> Vec<(String, String, TopicPermission)> {
        let st = self.state.read();
        st.topic
            .iter()
            .flat_map(|((v, u), m)| m.values().map(|t| (v.clone(), u.clone(), t.clone())))
            .collect()
    }

    pub fn set_topic_permission(
        &self,
        vhost: &str,
        user: &str,
        t: TopicPermission,
    ) -> Result<(), AccessError> {
        for p in [&t.write, &t.read] {
            // Checked as it will run: with the variables expanded.
            Pattern::new(&p.replace("{username}", "u").replace("{vhost}", "v"))?;
        }
        let _g = self.changes.lock();
        if !self.state.read().users.contains_key(user) {
            return Err(AccessError::NotFound(format!("no user '{user}'")));
        }
        self.journal.put_meta(
            &topic_permission_key(vhost, user, &t.exchange),
            &topic_value(&t),
        )?;
        self.state
            .write()
            .topic
            .entry((vhost.to_owned(), user.to_owned()))
            .or_default()
            .insert(t.exchange.clone(), t);
        Ok(())
    }

    /// Clears one exchange's topic permission, or all of the user's in the
    /// vhost when `exchange` is `None`.
    pub fn clear_topic_permission(
        &self,
        vhost: &str,
        user: &str,
        exchange: Option<&str>,
    ) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        let key = (vhost.to_owned(), user.to_owned());
        let exchanges: Vec<String> = self
            .state
            .read()
            .topic
            .get(&key)
            .map(|m| {
                m.keys()
                    .filter(|x| exchange.is_none_or(|e| e == x.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if exchanges.is_empty() {
            return Err(AccessError::NotFound(format!(
                "no topic permissions for user '{user}' in vhost '{vhost}'"
            )));
        }
        for x in &exchanges {
            self.journal
                .delete_meta(&topic_permission_key(vhost, user, x))?;
        }
        let mut st = self.state.write();
        if let Some(m) = st.topic.get_mut(&key) {
            m.retain(|x, _| !exchanges.contains(x));
            if m.is_empty() {
                st.topic.remove(&key);
            }
        }
        Ok(())
    }

    /// A vhost was deleted: its permissions go with it (durably).
    pub fn vhost_deleted(&self, vhost: &str) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        let (users, topics) = {
            let st = self.state.read();
            let users: Vec<String> = st
                .permissions
                .get(vhost)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            let topics: Vec<(String, String)> = st
                .topic
                .iter()
                .filter(|((v, _), _)| v == vhost)
                .flat_map(|((_, u), m)| m.keys().map(|x| (u.clone(), x.clone())))
                .collect();
            (users, topics)
        };
        for u in &users {
            self.journal.delete_meta(&permission_key(vhost, u))?;
        }
        for (u, x) in &topics {
            self.journal
                .delete_meta(&topic_permission_key(vhost, u, x))?;
        }
        let mut st = self.state.write();
        st.permissions.remove(vhost);
        st.topic.retain(|(v, _), _| v != vhost);
        Ok(())
    }

    // --- Checks -------------------------------------------------------------

    /// May `user` open a connection to `vhost`? RabbitMQ's rule: any
    /// permission entry in that vhost.
    pub fn check_vhost_access(&self, user: &str, vhost: &str) -> AmqpResult<()> {
        if self.permission(vhost, user).is_some() {
            return Ok(());
        }
        Err(AmqpError::not_allowed(format!(
            "access to vhost '{vhost}' refused for user '{user}'"
        )))
    }

    /// Checks one operation on a resource, answering 403 with RabbitMQ's
    /// text. The default exchange is checked under its name `amq.default`.
    pub fn check(
        &self,
        user: &str,
        vhost: &str,
        resource: Resource<'_>,
        perm: Perm,
    ) -> AmqpResult<()> {
        let (kind, name) = match resource {
            Resource::Exchange("") => ("exchange", "amq.default"),
            Resource::Exchange(n) => ("exchange", n),
            Resource::Queue(n) => ("queue", n),
        };
        let allowed = self
            .permission(vhost, user)
            .is_some_and(|p| p.pattern(perm).matches(name));
        if allowed {
            return Ok(());
        }
        Err(AmqpError::access_refused(format!(
            "access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"
        )))
    }

    /// Checks a routing key against the user's topic permission on a topic
    /// exchange. No topic permission for the exchange, or an exchange that
    /// is not a topic exchange (`is_topic` is asked only when there is a
    /// permission), means allowed, as in RabbitMQ.
    pub fn check_topic(
        &self,
        user: &str,
        vhost: &str,
        exchange: &str,
        routing_key: &str,
        perm: Perm,
        is_topic: impl FnOnce() -> bool,
    ) -> AmqpResult<()> {
        let pattern = {
            let st = self.state.read();
            let Some(t) = st
                .topic
                .get(&(vhost.to_owned(), user.to_owned()))
                .and_then(|m| m.get(exchange))
            else {
                return Ok(());
            };
            match perm {
                Perm::Write => t.write.clone(),
                Perm::Read | Perm::Configure => t.read.clone(),
            }
        };
        if !is_topic() {
            return Ok(());
        }
        let expanded = pattern
            .replace("{username}", &regex::escape(user))
            .replace("{vhost}", &regex::escape(vhost));
        let allowed = Pattern::new(&expanded).is_ok_and(|p| p.matches(routing_key));
        if allowed {
            return Ok(());
        }
        Err(AmqpError::access_refused(format!(
            "access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' refused for user '{user}'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::MemoryJournal;

    fn access() -> (Arc<MemoryJournal>, Access) {
        let j = Arc::new(MemoryJournal::default());
        (Arc::clone(&j), Access::new(j))
    }

    fn user(name: &str, pw: &str) -> User {
        User {
            name: name.into(),
            password_hash: Some(PasswordHash::new(pw)),
            tags: vec![],
        }
    }

    #[test]
    fn resource_checks_match_anywhere_and_name_the_resource_like_rabbitmq() {
        let (_, a) = access();
        a.put_user(user("u", "p")).unwrap();
        a.set_permission("/", "u", Permission::new("^cfg-", "w", "").unwrap())
            .unwrap();
        a.check("u", "/", Resource::Queue("cfg-1"), Perm::Configure)
            .unwrap();
        a.check("u", "/", Resource::Exchange("new"), Perm::Write)
            .unwrap();
        let e = a
            .check("u", "/", Resource::Queue("x-cfg-1"), Perm::Configure)
            .unwrap_err();
        assert_eq!(
            e.reply_text(),
            "ACCESS_REFUSED - access to queue 'x-cfg-1' in vhost '/' refused for user 'u'"
        );
        let e = a
            .check("u", "/", Resource::Queue("anything"), Perm::Read)
            .unwrap_err();
        assert_eq!(e.reply_code, 403);
        let e = a
            .check("u", "/", Resource::Exchange(""), Perm::Configure)
            .unwrap_err();
        assert!(e.text.contains("exchange 'amq.default'"), "{e}");
        let e = a.check_vhost_access("u", "other").unwrap_err();
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - access to vhost 'other' refused for user 'u'"
        );
    }

    #[test]
    fn topic_permissions_expand_username_and_vhost() {
        let (_, a) = access();
        a.put_user(user("alice", "p")).unwrap();
        a.set_topic_permission(
            "/",
            "alice",
            TopicPermission {
                exchange: "amq.topic".into(),
                write: "^{username}\\.".into(),
                read: "^shared\\.".into(),
            },
        )
        .unwrap();
        a.check_topic("alice", "/", "amq.topic", "alice.x", Perm::Write, || true)
            .unwrap();
        let e = a
            .check_topic("alice", "/", "amq.topic", "bob.x", Perm::Write, || true)
            .unwrap_err();
        assert_eq!(
            e.reply_text(),
            "ACCESS_REFUSED - access to topic 'bob.x' in exchange 'amq.topic' in vhost '/' refused for user 'alice'"
        );
        a.check_topic("alice", "/", "amq.topic", "shared.x", Perm::Read, || true)
            .unwrap();
        // No topic permission on another exchange: allowed.
        a.check_topic("alice", "/", "other", "bob.x", Perm::Write, || true)
            .unwrap();
    }

    #[test]
    fn users_and_permissions_survive_a_restore_from_the_journal() {
        let (j, a) = access();
        a.put_user(User {
            tags: vec!["administrator".into(), "monitoring".into()],
            ..user("u", "secret")
        })
        .unwrap();
        a.set_permission("/", "u", Permission::new("a", "b", "c").unwrap())
            .unwrap();
        a.set_topic_permission(
            "/",
            "u",
            TopicPermission {
                exchange: "t".into(),
                write: "w".into(),
                read: "r".into(),
            },
        )
        .unwrap();
        let b = Access::new(Arc::clone(&j) as Arc<dyn Journal>);
        let meta = j.meta.lock().clone();
        let skipped = b.restore(meta.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
        assert!(skipped.is_empty(), "{skipped:?}");
        let u = b.authenticate("u", "secret").expect("password restored");
        assert_eq!(u.tags, vec!["administrator", "monitoring"]);
        assert_eq!(b.permissions(), a.permissions());
        assert_eq!(b.topic_permissions(), a.topic_permissions());
        // Deleting the user takes its permissions out of the journal too.
        b.delete_user("u").unwrap();
        assert!(j.meta.lock().is_empty(), "{:?}", j.meta.lock());
    }

    #[test]
    fn unknown_user_and_wrong_password_both_fail() {
        let (_, a) = access();
        a.put_user(user("u", "right")).unwrap();
        assert!(a.authenticate("u", "wrong").is_none());
        assert!(a.authenticate("nobody", "right").is_none());
        assert!(a.authenticate("u", "right").is_some());
    }

    #[test]
    fn a_bad_regex_is_refused_with_the_pattern_named() {
        let e = Permission::new("(", ".*", ".*").unwrap_err();
        assert!(e.to_string().contains("'('"), "{e}");
    }
}
