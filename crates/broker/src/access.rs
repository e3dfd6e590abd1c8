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

use parking_lot::{Mutex, RwLock};
use regex::Regex;

use crate::durable::{Journal, JournalError};
use crate::error::{AmqpError, AmqpResult};
pub use crate::meta::parse_tags;
use crate::meta::{split_key, MetaCommand, PermissionDef, TopicPermissionDef, UserDef};
use crate::password::PasswordHash;

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
        for (key, value) in meta {
            if !matches!(key.first(), Some(b'u' | b'p' | b't')) {
                continue;
            }
            let applied = MetaCommand::decode(key, Some(value)).and_then(|c| {
                self.apply(&c)
                    .map_err(|why| format!("{:?}: {why}", split_key(key)))
            });
            skipped.extend(applied.err());
        }
        skipped
    }

    /// Applies a user, permission or topic permission command to memory
    /// (the caller made it durable, or the journal gives it back); other
    /// commands are not about access and change nothing here. The one
    /// place these changes reach the state, at runtime and on replay.
    pub fn apply(&self, cmd: &MetaCommand) -> Result<(), String> {
        use MetaCommand as C;
        // Compiled before the write lock: checks never wait for a regex.
        let permission = match cmd {
            C::PutPermission(p) => Some(Arc::new(
                Permission::new(&p.configure, &p.write, &p.read).map_err(|e| e.to_string())?,
            )),
            _ => None,
        };
        let mut st = self.state.write();
        match cmd {
            C::PutUser(u) => {
                let user = User {
                    name: u.name.clone(),
                    password_hash: u.password_hash.clone(),
                    tags: u.tags.clone(),
                };
                st.users.insert(u.name.clone(), Arc::new(user));
            }
            C::DeleteUser { name } => {
                st.users.remove(name);
                for m in st.permissions.values_mut() {
                    m.remove(name);
                }
                st.topic.retain(|(_, u), _| u != name);
            }
            C::PutPermission(p) => {
                let m = st.permissions.entry(p.vhost.clone()).or_default();
                m.insert(p.user.clone(), permission.expect("compiled above"));
            }
            C::DeletePermission { vhost, user } => {
                if let Some(m) = st.permissions.get_mut(vhost) {
                    m.remove(user);
                }
            }
            C::PutTopicPermission(t) => {
                let m = st.topic.entry((t.vhost.clone(), t.user.clone()));
                m.or_default().insert(
                    t.exchange.clone(),
                    TopicPermission {
                        exchange: t.exchange.clone(),
                        write: t.write.clone(),
                        read: t.read.clone(),
                    },
                );
            }
            C::DeleteTopicPermission {
                vhost,
                user,
                exchange,
            } => {
                let key = (vhost.clone(), user.clone());
                if let Some(m) = st.topic.get_mut(&key) {
                    m.remove(exchange);
                    if m.is_empty() {
                        st.topic.remove(&key);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Makes a change durable, then applies it; if the write fails nothing
    /// changes.
    fn commit(&self, cmd: &MetaCommand) -> Result<(), AccessError> {
        self.journal.record(cmd)?;
        self.apply(cmd).map_err(AccessError::Invalid)
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
        self.commit(&MetaCommand::PutUser(UserDef {
            name: user.name,
            password_hash: user.password_hash,
            tags: user.tags,
        }))
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
        for v in perms {
            self.commit(&MetaCommand::DeletePermission {
                vhost: v,
                user: name.to_owned(),
            })?;
        }
        for (vhost, exchange) in topics {
            self.commit(&MetaCommand::DeleteTopicPermission {
                vhost,
                user: name.to_owned(),
                exchange,
            })?;
        }
        self.commit(&MetaCommand::DeleteUser {
            name: name.to_owned(),
        })
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
        self.commit(&MetaCommand::PutPermission(PermissionDef {
            vhost: vhost.to_owned(),
            user: user.to_owned(),
            configure: p.configure.source,
            write: p.write.source,
            read: p.read.source,
        }))
    }

    pub fn clear_permission(&self, vhost: &str, user: &str) -> Result<(), AccessError> {
        let _g = self.changes.lock();
        if self.permission(vhost, user).is_none() {
            return Err(AccessError::NotFound(format!(
                "no permissions for user '{user}' in vhost '{vhost}'"
            )));
        }
        self.commit(&MetaCommand::DeletePermission {
            vhost: vhost.to_owned(),
            user: user.to_owned(),
        })
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
        self.commit(&MetaCommand::PutTopicPermission(TopicPermissionDef {
            vhost: vhost.to_owned(),
            user: user.to_owned(),
            exchange: t.exchange,
            write: t.write,
            read: t.read,
        }))
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
        for exchange in exchanges {
            self.commit(&MetaCommand::DeleteTopicPermission {
                vhost: vhost.to_owned(),
                user: user.to_owned(),
                exchange,
            })?;
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
        for user in users {
            self.commit(&MetaCommand::DeletePermission {
                vhost: vhost.to_owned(),
                user,
            })?;
        }
        for (user, exchange) in topics {
            self.commit(&MetaCommand::DeleteTopicPermission {
                vhost: vhost.to_owned(),
                user,
                exchange,
            })?;
        }
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
            if st.topic.is_empty() {
                // No topic permission anywhere (the usual case): nothing
                // to look up, and no key to copy for every publish.
                return Ok(());
            }
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
