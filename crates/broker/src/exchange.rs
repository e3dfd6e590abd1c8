//! Exchanges and their bindings: given a message, which queues and
//! exchanges it goes to next.
//!
//! Invariants:
//! - A binding (source, destination, routing key, arguments) exists at most
//!   once per exchange.
//! - Routing never blocks on anything but this exchange's bindings lock, held
//!   for reading.

use std::collections::HashMap;
use std::sync::Arc;

use berth_protocol::{AMQPValue, FieldTable};
use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::args::{as_string, values_equal};
use crate::delayed::Delayed;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::policy::Applied;
use crate::queue::Queue;

/// The exchange types berth implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    /// Parses `exchange.declare`'s `type`; anything else is 503 as in RabbitMQ.
    pub fn parse(kind: &str) -> AmqpResult<Self> {
        match kind {
            "direct" => Ok(Self::Direct),
            "fanout" => Ok(Self::Fanout),
            "topic" => Ok(Self::Topic),
            "headers" => Ok(Self::Headers),
            other => Err(AmqpError::command_invalid(format!(
                "invalid exchange type '{other}'; berth implements direct, fanout, topic and headers"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Fanout => "fanout",
            Self::Topic => "topic",
            Self::Headers => "headers",
        }
    }
}

/// Where one exchange sends a message: inline up to four destinations (a
/// publish that meets one binding allocates no list).
pub type Hops = SmallVec<[Destination; 4]>;

/// Where a binding sends matching messages.
#[derive(Clone)]
pub enum Destination {
    Queue(Arc<Queue>),
    /// An exchange-to-exchange binding, by destination exchange name.
    Exchange(String),
}

impl Destination {
    fn same(&self, other: &Destination) -> bool {
        match (self, other) {
            (Destination::Queue(a), Destination::Queue(b)) => a.name == b.name,
            (Destination::Exchange(a), Destination::Exchange(b)) => a == b,
            _ => false,
        }
    }
}

/// One binding.
#[derive(Clone)]
pub struct Binding {
    pub destination: Destination,
    pub routing_key: String,
    pub arguments: FieldTable,
    /// Topic patterns split once at bind time.
    words: Vec<String>,
}

#[derive(Default)]
struct Bindings {
    list: Vec<Binding>,
    /// Direct exchanges: routing key → indexes into `list`.
    by_key: HashMap<String, Vec<usize>>,
}

impl Bindings {
    fn reindex(&mut self) {
        self.by_key.clear();
        for (i, b) in self.list.iter().enumerate() {
            self.by_key
                .entry(b.routing_key.clone())
                .or_default()
                .push(i);
        }
    }
}

/// Arguments of `exchange.declare` other than the name.
#[derive(Debug, Clone, Default)]
pub struct ExchangeDeclare {
    pub kind: String,
    pub passive: bool,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

/// An exchange.
pub struct Exchange {
    pub name: String,
    /// How it routes (a delayed exchange: its `x-delayed-type`).
    pub kind: ExchangeKind,
    /// A delayed exchange's pending messages (`x-delayed-message`).
    pub delayed: Option<Arc<Delayed>>,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    bindings: RwLock<Bindings>,
    /// The policy in force (for `alternate-exchange`).
    applied: RwLock<Applied>,
}

impl Exchange {
    pub fn new(
        name: String,
        kind: ExchangeKind,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> Self {
        Self {
            name,
            kind,
            delayed: None,
            durable,
            auto_delete,
            internal,
            arguments,
            bindings: RwLock::default(),
            applied: RwLock::default(),
        }
    }

    /// A delayed exchange (`x-delayed-message`) routing as `self.kind`
    /// when its messages are due.
    #[must_use]
    pub fn with_delayed(mut self, delayed: Delayed) -> Self {
        self.delayed = Some(Arc::new(delayed));
        self
    }

    /// The type clients declared: `x-delayed-message` for a delayed
    /// exchange, else how it routes.
    pub fn type_name(&self) -> &'static str {
        match self.delayed {
            Some(_) => crate::delayed::DELAYED_EXCHANGE_TYPE,
            None => self.kind.as_str(),
        }
    }

    /// A redeclaration must match the exchange as it is (406 otherwise,
    /// with RabbitMQ's text). `kind` is how the declaration routes (a
    /// delayed one: its `x-delayed-type`).
    pub fn check_equivalent(
        &self,
        kind: ExchangeKind,
        d: &ExchangeDeclare,
        vhost: &str,
    ) -> AmqpResult<()> {
        let name = &self.name;
        let mismatch = |arg: &str, got: String, cur: String| {
            Err(AmqpError::precondition_failed(format!(
                "inequivalent arg '{arg}' for exchange '{name}' in vhost '{vhost}': received '{got}' but current is '{cur}'"
            )))
        };
        if self.type_name() != d.kind {
            return mismatch("type", d.kind.clone(), self.type_name().into());
        }
        if self.kind != kind {
            let arg = crate::delayed::DELAYED_TYPE_ARG;
            return mismatch(arg, kind.as_str().into(), self.kind.as_str().into());
        }
        for (arg, got, cur) in [
            ("durable", d.durable, self.durable),
            ("auto_delete", d.auto_delete, self.auto_delete),
            ("internal", d.internal, self.internal),
        ] {
            if got != cur {
                return mismatch(arg, got.to_string(), cur.to_string());
            }
        }
        Ok(())
    }

    /// The alternate exchange: the `alternate-exchange` argument if set,
    /// else the policy's (RabbitMQ's precedence).
    pub fn alternate_exchange(&self) -> Option<String> {
        let declared = self
            .arguments
            .inner()
            .get("alternate-exchange")
            .and_then(as_string);
        self.applied.read().alternate_exchange(declared)
    }

    /// The policy in force, for the management API.
    pub fn applied_policies(&self) -> Applied {
        self.applied.read().clone()
    }

    /// Puts a policy in force.
    pub fn set_policies(&self, applied: Applied) {
        *self.applied.write() = applied;
    }

    /// Adds a binding; binding twice is a no-op, as in AMQP. Returns whether
    /// it was new.
    pub fn bind(
        &self,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> bool {
        let mut b = self.bindings.write();
        if b.list.iter().any(|x| {
            x.destination.same(&destination)
                && x.routing_key == routing_key
                && &x.arguments == arguments
        }) {
            return false;
        }
        b.list.push(Binding {
            destination,
            routing_key: routing_key.to_owned(),
            arguments: arguments.clone(),
            words: topic_words(routing_key).map(str::to_owned).collect(),
        });
        let i = b.list.len() - 1;
        b.by_key.entry(routing_key.to_owned()).or_default().push(i);
        true
    }

    /// Removes a binding; returns whether it existed.
    pub fn unbind(
        &self,
        destination: &Destination,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> bool {
        let mut b = self.bindings.write();
        let before = b.list.len();
        b.list.retain(|x| {
            !(x.destination.same(destination)
                && x.routing_key == routing_key
                && &x.arguments == arguments)
        });
        let removed = b.list.len() != before;
        if removed {
            b.reindex();
        }
        removed
    }

    /// Removes every binding to `destination`; returns them.
    pub fn unbind_all(&self, destination: &Destination) -> Vec<Binding> {
        let mut b = self.bindings.write();
        let (gone, kept): (Vec<Binding>, Vec<Binding>) = b
            .list
            .drain(..)
            .partition(|x| x.destination.same(destination));
        b.list = kept;
        if !gone.is_empty() {
            b.reindex();
        }
        gone
    }

    /// Every binding of this exchange.
    pub fn bindings(&self) -> Vec<Binding> {
        self.bindings.read().list.clone()
    }

    pub fn has_bindings(&self) -> bool {
        !self.bindings.read().list.is_empty()
    }

    pub fn binding_count(&self) -> usize {
        self.bindings.read().list.len()
    }

    /// Where this exchange sends `msg` (one hop; the caller follows
    /// exchange destinations).
    pub fn route(&self, msg: &Message, out: &mut Hops) {
        let b = self.bindings.read();
        match self.kind {
            ExchangeKind::Direct => {
                if let Some(ix) = b.by_key.get(&msg.routing_key) {
                    out.extend(ix.iter().map(|i| b.list[*i].destination.clone()));
                }
            }
            ExchangeKind::Fanout => out.extend(b.list.iter().map(|x| x.destination.clone())),
            ExchangeKind::Topic => {
                let key: Vec<&str> = topic_words(&msg.routing_key).collect();
                out.extend(
                    b.list
                        .iter()
                        .filter(|x| topic_matches(&x.words, &key))
                        .map(|x| x.destination.clone()),
                );
            }
            ExchangeKind::Headers => {
                let headers = msg.headers();
                out.extend(
                    b.list
                        .iter()
                        .filter(|x| headers_match(&x.arguments, headers.as_ref()))
                        .map(|x| x.destination.clone()),
                );
            }
        }
    }
}

/// The dot-separated words of a routing or binding key. The empty key has
/// no words (so `*` does not match it and `#` does), but empty words inside
/// a key count: `a..b` has three, as in RabbitMQ.
pub fn topic_words(key: &str) -> impl Iterator<Item = &str> {
    let mut words = key.split('.');
    if key.is_empty() {
        words.next();
    }
    words
}

/// Topic matching: `*` is exactly one word, `#` zero or more.
pub fn topic_matches<P: AsRef<str>>(pattern: &[P], key: &[&str]) -> bool {
    match pattern.split_first() {
        None => key.is_empty(),
        Some((p, rest)) if p.as_ref() == "#" => {
            // '#' absorbs 0..=n words; try the shortest first.
            (0..=key.len()).any(|skip| topic_matches(rest, &key[skip..]))
        }
        Some((p, rest)) => match key.split_first() {
            None => false,
            Some((k, krest)) => {
                (p.as_ref() == "*" || p.as_ref() == *k) && topic_matches(rest, krest)
            }
        },
    }
}

/// Headers matching: `x-match` = `all` (default) or `any`; keys starting
/// with `x-` are not matched (RabbitMQ 3.10 adds `all-with-x`/`any-with-x`,
/// which match them too). A binding value of type void matches on presence.
pub fn headers_match(binding: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mode = binding
        .inner()
        .get("x-match")
        .and_then(as_string)
        .unwrap_or_else(|| "all".to_owned());
    let with_x = mode.ends_with("-with-x");
    let any = mode.starts_with("any");
    let empty = FieldTable::default();
    let headers = headers.unwrap_or(&empty);
    let mut considered = binding
        .inner()
        .iter()
        .filter(|(k, _)| k.as_str() != "x-match" && (with_x || !k.as_str().starts_with("x-")))
        .peekable();
    if considered.peek().is_none() {
        // No criteria: `all` matches everything, `any` nothing.
        return !any;
    }
    let mut check = considered.map(|(k, v)| match headers.inner().get(k.as_str()) {
        None => false,
        Some(h) => matches!(v, AMQPValue::Void) || values_equal(v, h),
    });
    if any {
        check.any(|m| m)
    } else {
        check.all(|m| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: &str, k: &str) -> bool {
        let p: Vec<&str> = topic_words(p).collect();
        let k: Vec<&str> = topic_words(k).collect();
        topic_matches(&p, &k)
    }

    #[test]
    fn topic_star_matches_exactly_one_word() {
        assert!(t("a.*.c", "a.b.c"));
        assert!(!t("a.*.c", "a.c"));
        assert!(!t("a.*", "a.b.c"));
    }

    #[test]
    fn empty_key_has_no_words_but_empty_words_count() {
        assert!(!t("*", ""));
        assert!(t("#", ""));
        assert!(t("", ""));
        assert!(!t("", "a"));
        assert!(t("*.*", ".b"));
        assert!(t("a.*.c", "a..c"));
        assert!(!t("*", "."));
    }

    #[test]
    fn topic_hash_matches_zero_or_more_words() {
        assert!(t("a.#", "a"));
        assert!(t("a.#", "a.b.c"));
        assert!(t("#", "anything.at.all"));
        assert!(t("#.c", "c"));
        assert!(t("a.#.c", "a.c"));
        assert!(t("a.#.c", "a.x.y.c"));
        assert!(!t("a.#.c", "a.x.y.d"));
        assert!(t("#.#", "a"));
    }

    #[test]
    fn topic_literal_words_must_match() {
        assert!(t("stock.usd.nyse", "stock.usd.nyse"));
        assert!(!t("stock.usd.nyse", "stock.eur.nyse"));
    }

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn headers_all_needs_every_key_any_needs_one() {
        let h = table(&[
            ("format", AMQPValue::LongString("pdf".into())),
            ("type", AMQPValue::LongString("report".into())),
        ]);
        let all = table(&[
            ("x-match", AMQPValue::LongString("all".into())),
            ("format", AMQPValue::LongString("pdf".into())),
            ("type", AMQPValue::LongString("log".into())),
        ]);
        let any = table(&[
            ("x-match", AMQPValue::LongString("any".into())),
            ("format", AMQPValue::LongString("pdf".into())),
            ("type", AMQPValue::LongString("log".into())),
        ]);
        assert!(!headers_match(&all, Some(&h)));
        assert!(headers_match(&any, Some(&h)));
        assert!(!headers_match(&any, None));
    }

    #[test]
    fn headers_compare_integers_across_widths() {
        let h = table(&[("n", AMQPValue::LongLongInt(5))]);
        let b = table(&[("n", AMQPValue::LongInt(5))]);
        assert!(headers_match(&b, Some(&h)));
    }
}
