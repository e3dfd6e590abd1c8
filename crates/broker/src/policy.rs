//! Policies and operator policies: which one applies to a queue or an
//! exchange, and what a queue's settings become once its declared `x-`
//! arguments, its policy and its operator policy are combined — RabbitMQ's
//! rules (rabbitmq.com/docs/parameters#policies, #operator-policy).
//!
//! Invariants:
//! - At most one policy and one operator policy apply to an object: among
//!   those whose pattern matches its name (unanchored, like RabbitMQ's
//!   `re:run`) and whose `apply-to` covers its kind, the highest priority;
//!   ties (RabbitMQ leaves them unspecified) go to the name that sorts
//!   first, so the choice is deterministic.
//! - A [`Policy`] is valid by construction: [`Policy::new`] refuses unknown
//!   keys, wrong types and bad patterns, so applying one never fails.
//! - Numeric limits (`message-ttl`, `expires`, `max-length`,
//!   `max-length-bytes`, `delivery-limit`) take the lowest of the queue
//!   argument, the policy and the operator policy; the other keys take the
//!   queue argument when it is declared, else the policy's value.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_protocol::{AMQPValue, FieldTable};
use regex::Regex;

use crate::args::{as_i128, as_string, type_name, Overflow, QueueArgs};
use crate::name_rules::shortstr_problem;

/// A user policy (`/api/policies`) or an operator policy
/// (`/api/operator-policies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    Policy,
    Operator,
}

impl PolicyKind {
    fn noun(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Operator => "operator policy",
        }
    }
}

/// What kinds of object a policy applies to (`apply-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTo {
    Queues,
    Exchanges,
    All,
}

impl ApplyTo {
    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        match s {
            "queues" => Ok(Self::Queues),
            "exchanges" => Ok(Self::Exchanges),
            "all" => Ok(Self::All),
            other => Err(PolicyError(format!(
                "Validation failed\n\n'{other}' is not a valid apply-to value: use 'queues', 'exchanges' or 'all'\n"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queues => "queues",
            Self::Exchanges => "exchanges",
            Self::All => "all",
        }
    }
}

/// Why a policy was refused; the text is RabbitMQ-like and names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// The settings a policy definition carries, typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySettings {
    pub message_ttl_ms: Option<u64>,
    pub expires_ms: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub delivery_limit: Option<u64>,
    pub overflow: Option<Overflow>,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    pub alternate_exchange: Option<String>,
    /// `max-age` (streams), in milliseconds.
    pub max_age_ms: Option<u64>,
    /// `stream-max-segment-size-bytes` (streams).
    pub stream_max_segment_size_bytes: Option<u64>,
    /// `delayed-retry-min` / `-multiplier` / `-max` (user policies only).
    pub delayed_retry: crate::args::RetryArgs,
}

/// Definition keys of RabbitMQ's that mean nothing on one berth node
/// (mirroring, leader placement, the classic queue storage mode: berth
/// pages every deep queue to disk anyway). They are accepted, kept and
/// shown, so RabbitMQ exports import unchanged, but have no effect.
pub const IGNORED_KEYS: &[&str] = &[
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
    "queue-mode",
    "queue-master-locator",
    "queue-leader-locator",
];

/// Numeric keys: name and smallest allowed value.
const NUMERIC_KEYS: &[(&str, i128)] = &[
    ("message-ttl", 0),
    ("expires", 1),
    ("max-length", 0),
    ("max-length-bytes", 0),
    ("delivery-limit", 0),
];

/// Numeric keys of user policies only: name and smallest allowed value.
const POLICY_NUMERIC_KEYS: &[(&str, i128)] = &[
    ("delayed-retry-min", 1),
    ("delayed-retry-multiplier", 1),
    ("delayed-retry-max", 1),
    ("stream-max-segment-size-bytes", 1),
];

/// String keys (user policies only).
const STRING_KEYS: &[&str] = &[
    "overflow",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "alternate-exchange",
    "max-age",
];

/// One policy, validated.
#[derive(Debug, Clone)]
pub struct Policy {
    pub kind: PolicyKind,
    pub vhost: String,
    pub name: String,
    pub pattern: String,
    re: Regex,
    pub apply_to: ApplyTo,
    pub priority: i64,
    /// The definition as given (integers as `LongLongInt`, strings as
    /// `LongString`), for the API, exports and the store.
    pub definition: FieldTable,
    pub settings: PolicySettings,
}

/// Two policies are the same when their definitions are: the compiled
/// pattern follows from its source.
impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        (
            self.kind,
            &self.vhost,
            &self.name,
            &self.pattern,
            self.apply_to,
            self.priority,
            &self.definition,
        ) == (
            other.kind,
            &other.vhost,
            &other.name,
            &other.pattern,
            other.apply_to,
            other.priority,
            &other.definition,
        )
    }
}

impl Policy {
    /// Validates a policy as RabbitMQ does (the error names what is wrong).
    pub fn new(
        kind: PolicyKind,
        vhost: &str,
        name: &str,
        pattern: &str,
        apply_to: ApplyTo,
        priority: i64,
        definition: FieldTable,
    ) -> Result<Self, PolicyError> {
        let fail = |why: String| PolicyError(format!("Validation failed\n\n{why}\n"));
        if name.is_empty() {
            return Err(fail("a policy name cannot be empty".into()));
        }
        let re = Regex::new(pattern).map_err(|e| {
            fail(format!(
                "<<\"{pattern}\">> is not a valid regular expression: {e}"
            ))
        })?;
        if definition.inner().is_empty() {
            return Err(fail("a policy definition cannot be empty".into()));
        }
        let mut settings = PolicySettings::default();
        let mut unknown = Vec::new();
        for (key, value) in definition.inner() {
            let key = key.as_str();
            let policy_numeric = (kind == PolicyKind::Policy)
                .then(|| POLICY_NUMERIC_KEYS.iter().find(|(k, _)| *k == key))
                .flatten();
            if let Some((_, min)) = NUMERIC_KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .or(policy_numeric)
            {
                let n = match as_i128(value) {
                    Some(n) if n >= *min => u64::try_from(n).unwrap_or(u64::MAX),
                    _ => {
                        return Err(fail(format!(
                            "{} is not a valid {key}: expected an integer >= {min}",
                            shown(value)
                        )))
                    }
                };
                let slot = match key {
                    "message-ttl" => &mut settings.message_ttl_ms,
                    "expires" => &mut settings.expires_ms,
                    "max-length" => &mut settings.max_length,
                    "max-length-bytes" => &mut settings.max_length_bytes,
                    "stream-max-segment-size-bytes" => &mut settings.stream_max_segment_size_bytes,
                    "delayed-retry-min" => &mut settings.delayed_retry.min_ms,
                    "delayed-retry-multiplier" => &mut settings.delayed_retry.multiplier,
                    "delayed-retry-max" => &mut settings.delayed_retry.max_ms,
                    _ => &mut settings.delivery_limit,
                };
                *slot = Some(n);
            } else if STRING_KEYS.contains(&key) && kind == PolicyKind::Policy {
                let Some(s) = as_string(value) else {
                    return Err(fail(format!(
                        "{} is not a valid {key}: expected a string",
                        shown(value)
                    )));
                };
                if let (true, Some(why)) = (key.starts_with("dead-letter-"), shortstr_problem(&s)) {
                    return Err(fail(format!("{key} is {why}")));
                }
                match key {
                    "max-age" => {
                        settings.max_age_ms = Some(crate::interval::parse_ms(&s).ok_or_else(|| {
                            fail(format!(
                                "<<\"{s}\">> is not a valid max-age: expected an integer and a unit Y, M, D, h, m or s, e.g. 7D"
                            ))
                        })?);
                    }
                    "overflow" => {
                        settings.overflow = Some(match s.as_str() {
                            "drop-head" => Overflow::DropHead,
                            "reject-publish" => Overflow::RejectPublish,
                            "reject-publish-dlx" => Overflow::RejectPublishDlx,
                            _ => return Err(fail(format!(
                                "<<\"{s}\">> is not a valid overflow value: use drop-head, reject-publish or reject-publish-dlx"
                            ))),
                        });
                    }
                    "dead-letter-exchange" => settings.dead_letter_exchange = Some(s),
                    "dead-letter-routing-key" => settings.dead_letter_routing_key = Some(s),
                    _ => settings.alternate_exchange = Some(s),
                }
            } else if !(IGNORED_KEYS.contains(&key) && kind == PolicyKind::Policy) {
                unknown.push(format!("<<\"{key}\">>"));
            }
        }
        if !unknown.is_empty() {
            let supported = match kind {
                PolicyKind::Policy => "message-ttl, expires, max-length, max-length-bytes, overflow, dead-letter-exchange, dead-letter-routing-key, delivery-limit, alternate-exchange, delayed-retry-min, delayed-retry-multiplier, delayed-retry-max, max-age, stream-max-segment-size-bytes",
                PolicyKind::Operator => "message-ttl, expires, max-length, max-length-bytes, delivery-limit",
            };
            return Err(fail(format!(
                "[{}] are not recognised {} settings (berth supports {supported}; see docs/MANAGEMENT.md)",
                unknown.join(","),
                kind.noun()
            )));
        }
        Ok(Self {
            kind,
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            pattern: pattern.to_owned(),
            re,
            apply_to,
            priority,
            definition,
            settings,
        })
    }

    /// Does it apply to a queue (`queue = true`) or exchange of this name?
    pub fn matches(&self, name: &str, queue: bool) -> bool {
        let kind_ok = match self.apply_to {
            ApplyTo::All => true,
            ApplyTo::Queues => queue,
            ApplyTo::Exchanges => !queue,
        };
        kind_ok && self.re.is_match(name)
    }
}

fn shown(v: &AMQPValue) -> String {
    as_i128(v)
        .map(|i| i.to_string())
        .or_else(|| as_string(v).map(|s| format!("<<\"{s}\">>")))
        .unwrap_or_else(|| type_name(v).to_owned())
}

/// The policy and operator policy in force on one object.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub policy: Option<Arc<Policy>>,
    pub operator: Option<Arc<Policy>>,
}

fn min_of(values: [Option<u64>; 3]) -> Option<u64> {
    values.into_iter().flatten().min()
}

impl Applied {
    /// A queue's effective settings: its declared arguments combined with
    /// its policies (see the module invariants).
    pub fn queue_args(&self, declared: &QueueArgs, arguments: &FieldTable) -> QueueArgs {
        let p = self.policy.as_ref().map(|p| &p.settings);
        let o = self.operator.as_ref().map(|p| &p.settings);
        let num = |arg: Option<u64>, f: fn(&PolicySettings) -> Option<u64>| {
            min_of([arg, p.and_then(f), o.and_then(f)])
        };
        let mut out = declared.clone();
        out.message_ttl_ms = num(declared.message_ttl_ms, |s| s.message_ttl_ms);
        out.expires_ms = num(declared.expires_ms, |s| s.expires_ms);
        out.max_length = num(declared.max_length, |s| s.max_length);
        out.max_length_bytes = num(declared.max_length_bytes, |s| s.max_length_bytes);
        out.delivery_limit = num(declared.delivery_limit, |s| s.delivery_limit);
        if declared.queue_type == crate::args::QueueType::Stream {
            // RabbitMQ's streams (`policy_precedence`): the policy's
            // retention and segment size win over the arguments.
            let pick =
                |arg: Option<u64>, f: fn(&PolicySettings) -> Option<u64>| p.and_then(f).or(arg);
            out.max_length_bytes = min_of([
                pick(declared.max_length_bytes, |s| s.max_length_bytes),
                o.and_then(|s| s.max_length_bytes),
                None,
            ]);
            out.max_age_ms = pick(declared.max_age_ms, |s| s.max_age_ms);
            out.stream_max_segment_size_bytes = pick(declared.stream_max_segment_size_bytes, |s| {
                s.stream_max_segment_size_bytes
            });
        }
        if !arguments.inner().contains_key("x-overflow") {
            if let Some(v) = p.and_then(|s| s.overflow) {
                out.overflow = v;
            }
        }
        if out.dead_letter_exchange.is_none() {
            out.dead_letter_exchange = p.and_then(|s| s.dead_letter_exchange.clone());
        }
        if out.dead_letter_routing_key.is_none() {
            out.dead_letter_routing_key = p.and_then(|s| s.dead_letter_routing_key.clone());
        }
        // Delayed retry: the queue's arguments, if it sets them, else the
        // policy's, as a whole (mixing the two would make a backoff
        // neither asked for).
        if out.delayed_retry.min_ms.is_none() {
            if let Some(r) = p.map(|s| s.delayed_retry).filter(|r| r.min_ms.is_some()) {
                out.delayed_retry = r;
            }
        }
        out
    }

    /// An exchange's alternate exchange: its own argument wins, then the
    /// policy's.
    pub fn alternate_exchange(&self, declared: Option<String>) -> Option<String> {
        declared.or_else(|| {
            self.policy
                .as_ref()
                .and_then(|p| p.settings.alternate_exchange.clone())
        })
    }

    /// RabbitMQ's `effective_policy_definition`: the policy's definition,
    /// with the operator policy's keys added and, where both set a limit,
    /// the lower value.
    pub fn effective_definition(&self) -> FieldTable {
        let mut out: BTreeMap<String, AMQPValue> = BTreeMap::new();
        if let Some(p) = &self.policy {
            for (k, v) in p.definition.inner() {
                out.insert(k.as_str().to_owned(), v.clone());
            }
        }
        if let Some(o) = &self.operator {
            for (k, v) in o.definition.inner() {
                let lower = match (out.get(k.as_str()).and_then(as_i128), as_i128(v)) {
                    (Some(mine), Some(theirs)) => theirs < mine,
                    _ => true,
                };
                if lower {
                    out.insert(k.as_str().to_owned(), v.clone());
                }
            }
        }
        let mut t = FieldTable::default();
        for (k, v) in out {
            t.insert(k.as_str().into(), v);
        }
        t
    }
}

/// The policies and operator policies of one vhost.
#[derive(Debug, Clone, Default)]
pub struct VhostPolicies {
    pub policies: BTreeMap<String, Arc<Policy>>,
    pub operator: BTreeMap<String, Arc<Policy>>,
}

impl VhostPolicies {
    pub fn map(&self, kind: PolicyKind) -> &BTreeMap<String, Arc<Policy>> {
        match kind {
            PolicyKind::Policy => &self.policies,
            PolicyKind::Operator => &self.operator,
        }
    }

    pub fn map_mut(&mut self, kind: PolicyKind) -> &mut BTreeMap<String, Arc<Policy>> {
        match kind {
            PolicyKind::Policy => &mut self.policies,
            PolicyKind::Operator => &mut self.operator,
        }
    }

    fn pick(map: &BTreeMap<String, Arc<Policy>>, name: &str, queue: bool) -> Option<Arc<Policy>> {
        // BTreeMap iterates by name, and max_by keeps the last maximum, so
        // iterate in reverse: among equal priorities the first name wins.
        map.values()
            .rev()
            .filter(|p| p.matches(name, queue))
            .max_by_key(|p| p.priority)
            .cloned()
    }

    /// The policies in force on the queue `name`.
    pub fn for_queue(&self, name: &str) -> Applied {
        Applied {
            policy: Self::pick(&self.policies, name, true),
            operator: Self::pick(&self.operator, name, true),
        }
    }

    /// The policy in force on the exchange `name` (operator policies carry
    /// only queue limits, so they never apply to exchanges).
    pub fn for_exchange(&self, name: &str) -> Applied {
        Applied {
            policy: Self::pick(&self.policies, name, false),
            operator: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn int(i: i64) -> AMQPValue {
        AMQPValue::LongLongInt(i)
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.as_bytes().to_vec().into())
    }

    fn policy(
        kind: PolicyKind,
        name: &str,
        pattern: &str,
        priority: i64,
        d: FieldTable,
    ) -> Arc<Policy> {
        Arc::new(Policy::new(kind, "/", name, pattern, ApplyTo::All, priority, d).unwrap())
    }

    #[test]
    fn highest_priority_wins_and_ties_go_to_the_first_name() {
        let mut v = VhostPolicies::default();
        for (n, prio) in [("a", 1), ("b", 5), ("c", 5)] {
            v.policies.insert(
                n.into(),
                policy(
                    PolicyKind::Policy,
                    n,
                    "^q",
                    prio,
                    def(&[("max-length", int(1))]),
                ),
            );
        }
        assert_eq!(v.for_queue("q1").policy.unwrap().name, "b");
        assert!(v.for_queue("other").policy.is_none(), "pattern must match");
    }

    #[test]
    fn apply_to_limits_the_kind_of_object() {
        let p = Policy::new(
            PolicyKind::Policy,
            "/",
            "ae",
            ".*",
            ApplyTo::Exchanges,
            0,
            def(&[("alternate-exchange", text("alt"))]),
        )
        .unwrap();
        assert!(p.matches("x", false));
        assert!(!p.matches("x", true));
    }

    #[test]
    fn limits_take_the_lowest_and_strings_prefer_the_queue_argument() {
        let declared_table = def(&[
            ("x-max-length", int(10)),
            ("x-message-ttl", int(1000)),
            ("x-dead-letter-exchange", text("mine")),
        ]);
        let declared = QueueArgs::parse("q", "/", &declared_table).unwrap();
        let applied = Applied {
            policy: Some(policy(
                PolicyKind::Policy,
                "p",
                ".*",
                0,
                def(&[
                    ("max-length", int(20)),
                    ("message-ttl", int(500)),
                    ("dead-letter-exchange", text("theirs")),
                    ("dead-letter-routing-key", text("rk")),
                    ("overflow", text("reject-publish")),
                ]),
            )),
            operator: Some(policy(
                PolicyKind::Operator,
                "o",
                ".*",
                0,
                def(&[("max-length", int(5)), ("expires", int(60000))]),
            )),
        };
        let a = applied.queue_args(&declared, &declared_table);
        assert_eq!(a.max_length, Some(5), "operator policy caps the argument");
        assert_eq!(a.message_ttl_ms, Some(500), "lower policy TTL wins");
        assert_eq!(a.expires_ms, Some(60000));
        assert_eq!(a.dead_letter_exchange.as_deref(), Some("mine"));
        assert_eq!(a.dead_letter_routing_key.as_deref(), Some("rk"));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        let eff = applied.effective_definition();
        assert_eq!(eff.inner().get("max-length"), Some(&int(5)));
        assert_eq!(eff.inner().get("expires"), Some(&int(60000)));
    }

    #[test]
    fn invalid_definitions_are_refused_naming_the_problem() {
        let bad = |kind, d: FieldTable| {
            Policy::new(kind, "/", "p", ".*", ApplyTo::All, 0, d)
                .unwrap_err()
                .0
        };
        assert!(bad(PolicyKind::Policy, def(&[("foo", int(1))])).contains("foo"));
        assert!(bad(PolicyKind::Policy, def(&[("max-length", text("ten"))])).contains("max-length"));
        assert!(bad(PolicyKind::Policy, def(&[("expires", int(0))])).contains("expires"));
        assert!(
            bad(PolicyKind::Policy, def(&[("overflow", text("explode"))])).contains("overflow")
        );
        assert!(bad(
            PolicyKind::Operator,
            def(&[("dead-letter-exchange", text("x"))])
        )
        .contains("operator policy"));
        assert!(bad(
            PolicyKind::Policy,
            def(&[("federation-upstream", text("u"))])
        )
        .contains("federation-upstream"));
        let e = Policy::new(
            PolicyKind::Policy,
            "/",
            "p",
            "(",
            ApplyTo::All,
            0,
            def(&[("max-length", int(1))]),
        )
        .unwrap_err();
        assert!(e.0.contains("regular expression"), "{e}");
        // Issue 16: a dead letter carries these as its exchange and key.
        for key in ["dead-letter-exchange", "dead-letter-routing-key"] {
            let long = "k".repeat(256);
            let e = Policy::new(
                PolicyKind::Policy,
                "/",
                "p",
                ".*",
                ApplyTo::Queues,
                0,
                def(&[(key, text(&long))]),
            )
            .unwrap_err();
            assert!(e.0.contains(&format!("{key} is 256 bytes long")), "{e}");
        }
        assert!(ApplyTo::parse("bindings").is_err());
        // Mirroring keys mean nothing on one node: accepted, no effect.
        let p = Policy::new(
            PolicyKind::Policy,
            "/",
            "p",
            ".*",
            ApplyTo::All,
            0,
            def(&[("ha-mode", text("all"))]),
        )
        .unwrap();
        assert_eq!(p.settings, PolicySettings::default());
    }
}
