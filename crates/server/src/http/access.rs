//! Users, vhosts, permissions and topic permissions from a RabbitMQ
//! definitions file (the JSON `rabbitmqctl export_definitions` and
//! `GET /api/definitions` write), so a RabbitMQ node's users log in to
//! berth with their passwords. The definitions endpoints and
//! `--load-definitions` read and write these sections through this module
//! (in the JSON shapes of the users and permissions endpoints).
//!
//! Invariants:
//! - Everything is validated before anything is stored: a file with one
//!   bad hash or regex changes nothing and the error names the entry.
//! - Vhosts first, then users, then permissions (each needs the former).

use berth_broker::access::{parse_tags, Permission, TopicPermission, User};
use berth_broker::password::{Algorithm, PasswordHash};
use berth_broker::Broker;
use serde::Deserialize;

/// The parts of a definitions file this module reads; the others (queues,
/// exchanges, policies, ...) are ignored here.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AccessDefinitions {
    pub users: Vec<UserDef>,
    pub vhosts: Vec<VhostDef>,
    pub permissions: Vec<PermissionDef>,
    pub topic_permissions: Vec<TopicPermissionDef>,
}

#[derive(Debug, Deserialize)]
pub struct UserDef {
    pub name: String,
    #[serde(default)]
    pub password_hash: Option<String>,
    /// A plain password (RabbitMQ accepts one in definitions too).
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub hashing_algorithm: Option<String>,
    #[serde(default)]
    pub tags: Tags,
}

/// Tags as a list (RabbitMQ 3.9+) or a comma-separated string (older).
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum Tags {
    #[default]
    None,
    List(Vec<String>),
    Text(String),
}

impl Tags {
    fn to_vec(&self) -> Vec<String> {
        match self {
            Self::None => Vec::new(),
            Self::List(l) => l.iter().flat_map(|t| parse_tags(t)).collect(),
            Self::Text(t) => parse_tags(t),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct VhostDef {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct PermissionDef {
    pub user: String,
    pub vhost: String,
    pub configure: String,
    pub write: String,
    pub read: String,
}

#[derive(Debug, Deserialize)]
pub struct TopicPermissionDef {
    pub user: String,
    pub vhost: String,
    pub exchange: String,
    pub write: String,
    pub read: String,
}

/// What an import did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub vhosts: usize,
    pub users: usize,
    pub permissions: usize,
    pub topic_permissions: usize,
}

/// Why an import was refused, naming the entry.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("definitions are not valid JSON for users/vhosts/permissions: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("could not store {what}: {source}")]
    Store {
        what: String,
        #[source]
        source: berth_broker::access::AccessError,
    },
}

/// The access sections of an export as RabbitMQ 3.10 writes them: `users`
/// (name, `password_hash` in base64, `hashing_algorithm`, `tags` as a
/// list, `limits`), `vhosts`, `permissions` and `topic_permissions`, each
/// sorted by name.
pub fn export_access(broker: &Broker) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{json, Value};
    let mut users = broker.access().users();
    users.sort_by(|a, b| a.name.cmp(&b.name));
    let mut vhosts: Vec<String> = broker.vhosts().iter().map(|v| v.name.clone()).collect();
    vhosts.sort_unstable();
    let mut permissions = broker.access().permissions();
    permissions.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    let mut topic = broker.access().topic_permissions();
    topic.sort_by(|a, b| (&a.1, &a.0, &a.2.exchange).cmp(&(&b.1, &b.0, &b.2.exchange)));
    let mut out = serde_json::Map::new();
    out.insert(
        "users".into(),
        users.iter().map(|u| super::users::user_json(u)).collect(),
    );
    out.insert(
        "vhosts".into(),
        vhosts.iter().map(|n| json!({ "name": n })).collect(),
    );
    out.insert(
        "permissions".into(),
        permissions
            .iter()
            .map(|(vhost, user, p)| super::permissions::permission_json(vhost, user, p))
            .collect::<Vec<Value>>()
            .into(),
    );
    out.insert(
        "topic_permissions".into(),
        topic
            .iter()
            .map(|(vhost, user, t)| super::permissions::topic_json(vhost, user, t))
            .collect::<Vec<Value>>()
            .into(),
    );
    out
}

/// Reads a whole definitions document (as JSON text).
pub fn parse(text: &str) -> Result<AccessDefinitions, ImportError> {
    Ok(serde_json::from_str(text)?)
}

fn user_of(d: &UserDef) -> Result<User, ImportError> {
    let bad = |why: String| ImportError::Invalid(format!("user '{}': {why}", d.name));
    let password_hash = match (&d.password_hash, &d.password) {
        (Some(h), _) if !h.is_empty() => {
            let name = d
                .hashing_algorithm
                .as_deref()
                .unwrap_or("rabbit_password_hashing_sha256");
            let alg = Algorithm::from_name(name).ok_or_else(|| {
                bad(format!(
                    "unknown hashing_algorithm '{name}' (berth reads rabbit_password_hashing_sha256, _sha512 and _md5)"
                ))
            })?;
            Some(PasswordHash::from_base64(alg, h).map_err(|e| bad(e.to_string()))?)
        }
        (_, Some(p)) => Some(PasswordHash::new(p)),
        _ => None,
    };
    Ok(User {
        name: d.name.clone(),
        password_hash,
        tags: d.tags.to_vec(),
    })
}

/// [`import_access`] of the access sections of a whole definitions
/// document; the error says why the whole import is refused.
pub(super) fn import_access_json(
    broker: &Broker,
    defs: &serde_json::Value,
) -> Result<Imported, String> {
    let access: AccessDefinitions =
        serde_json::from_value(defs.clone()).map_err(|e| ImportError::Json(e).to_string())?;
    import_access(broker, &access).map_err(|e| e.to_string())
}

/// Creates (or replaces) the vhosts, users, permissions and topic
/// permissions of `defs`.
pub fn import_access(broker: &Broker, defs: &AccessDefinitions) -> Result<Imported, ImportError> {
    // Validate everything first.
    let users: Vec<User> = defs.users.iter().map(user_of).collect::<Result<_, _>>()?;
    let perms: Vec<(&PermissionDef, Permission)> = defs
        .permissions
        .iter()
        .map(|p| {
            Permission::new(&p.configure, &p.write, &p.read)
                .map(|x| (p, x))
                .map_err(|e| {
                    ImportError::Invalid(format!(
                        "permissions of user '{}' in vhost '{}': {e}",
                        p.user, p.vhost
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    let store = |what: String| move |source| ImportError::Store { what, source };
    let mut done = Imported::default();
    for v in &defs.vhosts {
        broker
            .add_vhost(&v.name)
            .map_err(store(format!("vhost '{}'", v.name)))?;
        done.vhosts += 1;
    }
    for u in users {
        let name = u.name.clone();
        broker
            .access()
            .put_user(u)
            .map_err(store(format!("user '{name}'")))?;
        done.users += 1;
    }
    for (d, p) in perms {
        if broker.vhost(&d.vhost).is_none() {
            broker
                .add_vhost(&d.vhost)
                .map_err(store(format!("vhost '{}'", d.vhost)))?;
        }
        broker
            .access()
            .set_permission(&d.vhost, &d.user, p)
            .map_err(store(format!(
                "permissions of user '{}' in vhost '{}'",
                d.user, d.vhost
            )))?;
        done.permissions += 1;
    }
    for t in &defs.topic_permissions {
        broker
            .access()
            .set_topic_permission(
                &t.vhost,
                &t.user,
                TopicPermission {
                    exchange: t.exchange.clone(),
                    write: t.write.clone(),
                    read: t.read.clone(),
                },
            )
            .map_err(store(format!(
                "topic permissions of user '{}' in vhost '{}'",
                t.user, t.vhost
            )))?;
        done.topic_permissions += 1;
    }
    Ok(done)
}
