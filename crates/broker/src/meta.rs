//! Metadata as commands: every change to what the broker defines — vhosts,
//! users, permissions, topic permissions, policies, exchanges, queues,
//! bindings — is one [`MetaCommand`], and this module is the one place
//! that encodes it into a journal key and value and decodes it back
//! (docs/FORMAT.md, "Metadata keys" and "Metadata values").
//! `Broker::apply` (in `broker/meta.rs`) is the one function that applies
//! a command to the broker's state, at runtime after the command is
//! durable and at startup when the journal replays it; a replicated log
//! is meant to feed it next.
//!
//! Invariants:
//! - The bytes are those berth has always written: `encode` is pinned by
//!   golden-bytes tests, and `decode(encode(c)) == c` for every command.
//! - A key says what it defines (its first part, a one-letter kind); a put
//!   carries a value, a delete none. The last command on a key wins.
//! - Any names make a key that decodes back to them, a zero byte in a name
//!   included (`meta/key.rs`).

use berth_protocol::codec::{decode_field_table, encode_field_table};
use berth_protocol::{AMQPValue, FieldTable};

use crate::args::{as_i128, as_string};
use crate::password::{Algorithm, PasswordHash};
use crate::policy::{ApplyTo, Policy, PolicyKind};

mod key;
use key::join;

/// One change to the broker's definitions.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaCommand {
    /// A vhost exists (configuration, the API, a definitions import).
    PutVhost {
        name: String,
    },
    DeleteVhost {
        name: String,
    },
    /// The default user and vhost were created once, so deleting them is
    /// not undone by a restart.
    DefaultsCreated,
    PutUser(UserDef),
    DeleteUser {
        name: String,
    },
    PutPermission(PermissionDef),
    DeletePermission {
        vhost: String,
        user: String,
    },
    PutTopicPermission(TopicPermissionDef),
    DeleteTopicPermission {
        vhost: String,
        user: String,
        exchange: String,
    },
    /// A policy or operator policy, validated.
    PutPolicy(Box<Policy>),
    DeletePolicy {
        kind: PolicyKind,
        vhost: String,
        name: String,
    },
    PutExchange(ExchangeDef),
    DeleteExchange {
        vhost: String,
        name: String,
    },
    PutQueue(QueueDef),
    DeleteQueue {
        vhost: String,
        name: String,
    },
    /// A binding whose both ends are durable.
    PutBinding(BindingDef),
    DeleteBinding(BindingDef),
}

/// A user as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDef {
    pub name: String,
    /// `None`: no password login (EXTERNAL only).
    pub password_hash: Option<PasswordHash>,
    pub tags: Vec<String>,
}

/// A user's permission patterns in a vhost, as given (compiled when
/// applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionDef {
    pub vhost: String,
    pub user: String,
    pub configure: String,
    pub write: String,
    pub read: String,
}

/// A user's topic permission on an exchange of a vhost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPermissionDef {
    pub vhost: String,
    pub user: String,
    pub exchange: String,
    pub write: String,
    pub read: String,
}

/// A durable exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeDef {
    pub vhost: String,
    pub name: String,
    /// `direct`, `fanout`, `topic` or `headers` (checked when applied).
    pub kind: String,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// A delayed exchange's id in the journal's message records (its
    /// pending messages are stored under it, as a queue's are).
    pub delayed_id: Option<u64>,
}

/// A durable queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    pub vhost: String,
    pub name: String,
    /// The queue's id in the journal's message records.
    pub id: u64,
    pub auto_delete: bool,
    pub arguments: FieldTable,
}

/// A binding: from exchange `source` to a queue (`to_queue`) or exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDef {
    pub vhost: String,
    pub source: String,
    pub to_queue: bool,
    pub destination: String,
    pub routing_key: String,
    pub arguments: FieldTable,
}

/// Key of the defaults marker: `d`.
const DEFAULTS_KEY: &[u8] = b"d";

impl MetaCommand {
    /// The journal key and value (`None`: the key is deleted). The one
    /// encoder of berth's metadata (docs/FORMAT.md, "Metadata keys").
    pub fn encode(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        use MetaCommand as C;
        match self {
            C::PutVhost { name } => (join(&[b"v", name.as_bytes()]), Some(Vec::new())),
            C::DeleteVhost { name } => (join(&[b"v", name.as_bytes()]), None),
            C::DefaultsCreated => (DEFAULTS_KEY.to_vec(), Some(Vec::new())),
            C::PutUser(u) => (user_key(&u.name), Some(user_value(u))),
            C::DeleteUser { name } => (user_key(name), None),
            C::PutPermission(p) => (
                permission_key(&p.vhost, &p.user),
                Some(table_bytes(&[
                    ("configure", s(&p.configure)),
                    ("write", s(&p.write)),
                    ("read", s(&p.read)),
                ])),
            ),
            C::DeletePermission { vhost, user } => (permission_key(vhost, user), None),
            C::PutTopicPermission(t) => (
                topic_key(&t.vhost, &t.user, &t.exchange),
                Some(table_bytes(&[("write", s(&t.write)), ("read", s(&t.read))])),
            ),
            C::DeleteTopicPermission {
                vhost,
                user,
                exchange,
            } => (topic_key(vhost, user, exchange), None),
            C::PutPolicy(p) => (policy_key(p.kind, &p.vhost, &p.name), Some(policy_value(p))),
            C::DeletePolicy { kind, vhost, name } => (policy_key(*kind, vhost, name), None),
            C::PutExchange(x) => (
                join(&[b"x", x.vhost.as_bytes(), x.name.as_bytes()]),
                Some(exchange_value(x)),
            ),
            C::DeleteExchange { vhost, name } => {
                (join(&[b"x", vhost.as_bytes(), name.as_bytes()]), None)
            }
            C::PutQueue(q) => (queue_key(&q.vhost, &q.name), Some(queue_value(q))),
            C::DeleteQueue { vhost, name } => (queue_key(vhost, name), None),
            C::PutBinding(b) => (
                binding_key(b),
                Some(table_bytes(&[(
                    "arguments",
                    AMQPValue::FieldTable(b.arguments.clone()),
                )])),
            ),
            C::DeleteBinding(b) => (binding_key(b), None),
        }
    }

    /// Reads a command back from a journal key and value (`None`: a
    /// delete). The error names the key's parts and what is wrong; the
    /// entry then stays in the journal untouched.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Self, String> {
        let parts = key::split(key).map_err(|why| format!("{:?}: {why}", split_key(key)))?;
        decode_parts(&parts, value).map_err(|why| format!("{parts:?}: {why}"))
    }

    /// Where the command goes when a snapshot of the keys (which has no
    /// order of its own) is replayed: what a command needs comes first —
    /// vhosts, then users and permissions, policies, exchanges, queues and
    /// last bindings.
    pub fn replay_rank(&self) -> u8 {
        use MetaCommand as C;
        match self {
            C::PutVhost { .. } | C::DeleteVhost { .. } | C::DefaultsCreated => 0,
            C::PutUser(_) | C::DeleteUser { .. } => 1,
            C::PutPermission(_)
            | C::DeletePermission { .. }
            | C::PutTopicPermission(_)
            | C::DeleteTopicPermission { .. } => 2,
            C::PutPolicy(_) | C::DeletePolicy { .. } => 3,
            C::PutExchange(_) | C::DeleteExchange { .. } => 4,
            C::PutQueue(_) | C::DeleteQueue { .. } => 5,
            C::PutBinding(_) | C::DeleteBinding(_) => 6,
        }
    }
}

/// [`MetaCommand::decode`] on a split key; the error is the bare reason.
fn decode_parts(parts: &[String], value: Option<&[u8]>) -> Result<MetaCommand, String> {
    use MetaCommand as C;
    let kind = parts.first().map_or("", String::as_str);
    let part = |i: usize| parts[i].clone();
    let table = || -> Result<FieldTable, String> {
        let v = value.ok_or("a delete of a key that needs a value")?;
        decode_field_table(v).ok_or_else(|| "value is not a field table".to_owned())
    };
    Ok(match (kind, parts.len(), value.is_some()) {
        ("v", 2, true) => C::PutVhost { name: part(1) },
        ("v", 2, false) => C::DeleteVhost { name: part(1) },
        ("d", 1, true) => C::DefaultsCreated,
        ("u", 2, true) => C::PutUser(user_from(part(1), &table()?)?),
        ("u", 2, false) => C::DeleteUser { name: part(1) },
        ("p", 3, true) => {
            let t = table()?;
            C::PutPermission(PermissionDef {
                vhost: part(1),
                user: part(2),
                configure: text(&t, "configure"),
                write: text(&t, "write"),
                read: text(&t, "read"),
            })
        }
        ("p", 3, false) => C::DeletePermission {
            vhost: part(1),
            user: part(2),
        },
        ("t", 4, true) => {
            let t = table()?;
            C::PutTopicPermission(TopicPermissionDef {
                vhost: part(1),
                user: part(2),
                exchange: part(3),
                write: text(&t, "write"),
                read: text(&t, "read"),
            })
        }
        ("t", 4, false) => C::DeleteTopicPermission {
            vhost: part(1),
            user: part(2),
            exchange: part(3),
        },
        ("y" | "o", 3, has_value) => {
            let kind = if kind == "y" {
                PolicyKind::Policy
            } else {
                PolicyKind::Operator
            };
            if has_value {
                C::PutPolicy(Box::new(policy_from(kind, part(1), part(2), &table()?)?))
            } else {
                C::DeletePolicy {
                    kind,
                    vhost: part(1),
                    name: part(2),
                }
            }
        }
        ("x", 3, true) => {
            let t = table()?;
            let kind = t.inner().get("type").and_then(as_string).ok_or("no type")?;
            C::PutExchange(ExchangeDef {
                vhost: part(1),
                name: part(2),
                kind,
                auto_delete: flag(&t, "auto_delete"),
                internal: flag(&t, "internal"),
                arguments: arguments(&t),
                delayed_id: id_of(&t),
            })
        }
        ("x", 3, false) => C::DeleteExchange {
            vhost: part(1),
            name: part(2),
        },
        ("q", 3, true) => {
            let t = table()?;
            let id = id_of(&t).ok_or("no id")?;
            C::PutQueue(QueueDef {
                vhost: part(1),
                name: part(2),
                id,
                auto_delete: flag(&t, "auto_delete"),
                arguments: arguments(&t),
            })
        }
        ("q", 3, false) => C::DeleteQueue {
            vhost: part(1),
            name: part(2),
        },
        ("b", 7, has_value) => {
            let mut b = BindingDef {
                vhost: part(1),
                source: part(2),
                to_queue: parts[3] == "q",
                destination: part(4),
                routing_key: part(5),
                arguments: FieldTable::default(),
            };
            if has_value {
                b.arguments = arguments(&table()?);
                C::PutBinding(b)
            } else {
                b.arguments = args_from_hex(&parts[6]).ok_or("arguments do not parse")?;
                C::DeleteBinding(b)
            }
        }
        _ => return Err("malformed key".to_owned()),
    })
}

// --- Keys: parts joined with a zero byte, or length-prefixed (key.rs) -----

fn user_key(name: &str) -> Vec<u8> {
    join(&[b"u", name.as_bytes()])
}

fn permission_key(vhost: &str, user: &str) -> Vec<u8> {
    join(&[b"p", vhost.as_bytes(), user.as_bytes()])
}

fn topic_key(vhost: &str, user: &str, exchange: &str) -> Vec<u8> {
    join(&[b"t", vhost.as_bytes(), user.as_bytes(), exchange.as_bytes()])
}

fn queue_key(vhost: &str, name: &str) -> Vec<u8> {
    join(&[b"q", vhost.as_bytes(), name.as_bytes()])
}

/// `y` (policy) or `o` (operator policy) · vhost · name.
fn policy_key(kind: PolicyKind, vhost: &str, name: &str) -> Vec<u8> {
    let tag: &[u8] = match kind {
        PolicyKind::Policy => b"y",
        PolicyKind::Operator => b"o",
    };
    join(&[tag, vhost.as_bytes(), name.as_bytes()])
}

/// Its arguments' field-table encoding in lower-case hex ends the key, so
/// two bindings that differ only in arguments have different keys.
fn binding_key(b: &BindingDef) -> Vec<u8> {
    let args_hex: String = encode_field_table(&b.arguments)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    join(&[
        b"b",
        b.vhost.as_bytes(),
        b.source.as_bytes(),
        if b.to_queue { b"q" } else { b"x" },
        b.destination.as_bytes(),
        b.routing_key.as_bytes(),
        args_hex.as_bytes(),
    ])
}

fn args_from_hex(hex: &str) -> Option<FieldTable> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    decode_field_table(&bytes?)
}

/// The kind of definition a key holds (`q` for a queue, ...: its first
/// part, docs/FORMAT.md "Metadata keys"), whichever way the key is spelled.
pub fn key_kind(key: &[u8]) -> Option<u8> {
    key::kind(key)
}

/// Splits a metadata key into its parts, for showing it: a key that is
/// not well formed comes back whole, as one part.
pub fn split_key(key: &[u8]) -> Vec<String> {
    key::split(key).unwrap_or_else(|_| vec![String::from_utf8_lossy(key).into_owned()])
}

// --- Values: AMQP field tables --------------------------------------------

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(v.as_bytes().to_vec().into())
}

fn table_bytes(entries: &[(&str, AMQPValue)]) -> Vec<u8> {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    encode_field_table(&t)
}

fn text(t: &FieldTable, k: &str) -> String {
    t.inner().get(k).and_then(as_string).unwrap_or_default()
}

fn flag(t: &FieldTable, k: &str) -> bool {
    matches!(t.inner().get(k), Some(AMQPValue::Boolean(true)))
}

fn arguments(t: &FieldTable) -> FieldTable {
    match t.inner().get("arguments") {
        Some(AMQPValue::FieldTable(a)) => a.clone(),
        _ => FieldTable::default(),
    }
}

fn id_of(t: &FieldTable) -> Option<u64> {
    t.inner()
        .get("id")
        .and_then(as_i128)
        .and_then(|i| u64::try_from(i).ok())
}

/// The store's queue id recorded in a queue definition's value (what the
/// store tools use to name a queue id), or a delayed exchange's in its
/// exchange definition's.
pub fn queue_id_of(value: &[u8]) -> Option<u64> {
    match decode_field_table(value)?.inner().get("id")? {
        AMQPValue::LongLongInt(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// An exchange's value; `id` only for a delayed exchange (an older berth
/// ignores it, so other exchanges' bytes are unchanged).
fn exchange_value(x: &ExchangeDef) -> Vec<u8> {
    let mut fields = vec![
        ("type", s(&x.kind)),
        ("auto_delete", AMQPValue::Boolean(x.auto_delete)),
        ("internal", AMQPValue::Boolean(x.internal)),
        ("arguments", AMQPValue::FieldTable(x.arguments.clone())),
    ];
    if let Some(id) = x.delayed_id {
        fields.push((
            "id",
            AMQPValue::LongLongInt(i64::try_from(id).unwrap_or(i64::MAX)),
        ));
    }
    table_bytes(&fields)
}

fn queue_value(q: &QueueDef) -> Vec<u8> {
    table_bytes(&[
        (
            "id",
            AMQPValue::LongLongInt(i64::try_from(q.id).unwrap_or(i64::MAX)),
        ),
        ("auto_delete", AMQPValue::Boolean(q.auto_delete)),
        ("arguments", AMQPValue::FieldTable(q.arguments.clone())),
    ])
}

/// `password_hash` (base64, empty: no password login),
/// `hashing_algorithm`, `tags` (comma-separated).
fn user_value(u: &UserDef) -> Vec<u8> {
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

fn user_from(name: String, t: &FieldTable) -> Result<UserDef, String> {
    let hash = text(t, "password_hash");
    let password_hash = if hash.is_empty() {
        None
    } else {
        let alg = Algorithm::from_name(&text(t, "hashing_algorithm"))
            .ok_or("unknown hashing_algorithm")?;
        Some(PasswordHash::from_base64(alg, &hash).map_err(|e| e.to_string())?)
    };
    Ok(UserDef {
        name,
        password_hash,
        tags: parse_tags(&text(t, "tags")),
    })
}

/// Splits RabbitMQ's comma-separated tag list.
pub fn parse_tags(tags: &str) -> Vec<String> {
    tags.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `apply-to` (longstr), `definition` (table), `pattern` (longstr),
/// `priority` (i64).
fn policy_value(p: &Policy) -> Vec<u8> {
    table_bytes(&[
        ("apply-to", s(p.apply_to.as_str())),
        ("definition", AMQPValue::FieldTable(p.definition.clone())),
        ("pattern", s(&p.pattern)),
        ("priority", AMQPValue::LongLongInt(p.priority)),
    ])
}

/// A stored policy, validated again as [`Policy::new`] does.
fn policy_from(
    kind: PolicyKind,
    vhost: String,
    name: String,
    t: &FieldTable,
) -> Result<Policy, String> {
    let get = |k: &str| t.inner().get(k);
    let apply_to = ApplyTo::parse(&text(t, "apply-to")).map_err(|e| e.to_string())?;
    let priority = get("priority")
        .and_then(as_i128)
        .and_then(|i| i64::try_from(i).ok())
        .unwrap_or(0);
    let Some(AMQPValue::FieldTable(definition)) = get("definition") else {
        return Err("no definition table".to_owned());
    };
    Policy::new(
        kind,
        &vhost,
        &name,
        &text(t, "pattern"),
        apply_to,
        priority,
        definition.clone(),
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
