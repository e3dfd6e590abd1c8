//! Dead-lettering: why a message left its queue, the message republished
//! for it (with `x-death` and the `x-first-death-*` headers updated as
//! RabbitMQ does), and the rule that stops a dead-letter cycle.
//!
//! Invariants:
//! - A dead letter is rebuilt from the original message; the original is
//!   never changed (other queues may still hold it).
//! - A stored message leaves its source queue's journal only after its
//!   republished copy is durable: a crash in between may leave it in both
//!   (at-least-once), never in neither.
//! - A cycle with no rejection in it is cut where the message would reach a
//!   queue it already died in (RabbitMQ's rule), so expiry or length limits
//!   can never make a message loop forever.

use std::sync::Arc;

use berth_protocol::{AMQPValue, FieldArray, FieldTable, LongString};

use crate::args::{as_string, QueueArgs};
use crate::durable::Done;
use crate::message::Message;

/// Why a message was dead-lettered (the `reason` of `x-death`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathReason {
    Rejected,
    Expired,
    MaxLen,
    DeliveryLimit,
}

impl DeathReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::MaxLen => "maxlen",
            Self::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A dead letter to be republished once the queue lock is released.
pub struct DeadLetter {
    pub msg: Arc<Message>,
    pub reason: DeathReason,
    /// Its id in the source queue's journal, if it is stored there: that
    /// removal is journaled only once the republished copy is durable
    /// (see [`crate::durable::Durability::defer_removal`]).
    pub stored: Option<u64>,
    /// Runs once its removal from the source is durable (a transaction's
    /// `commit-ok` waits for it).
    pub done: Option<Done>,
}

/// The message to republish for a dead letter of queue `queue`, and the
/// dead-letter exchange to publish it to (empty: the default exchange).
/// `None` if the queue has no dead-letter exchange.
pub(crate) fn rewrite(
    queue: &str,
    args: &QueueArgs,
    d: &DeadLetter,
    unix_time_s: u64,
) -> Option<Result<(String, Arc<Message>), String>> {
    let dlx = args.dead_letter_exchange.clone()?;
    let routing_key = args
        .dead_letter_routing_key
        .clone()
        .unwrap_or_else(|| d.msg.routing_key.clone());
    let original_expiration = d.msg.expiration_ms;
    let rewritten = d.msg.rewritten(dlx.clone(), routing_key, |props| {
        let mut headers = props.headers().clone().unwrap_or_default();
        add_x_death(
            &mut headers,
            queue,
            d.reason,
            &d.msg,
            original_expiration,
            unix_time_s,
        );
        *props = props.clone().with_headers(headers);
        if original_expiration.is_some() {
            clear_expiration(props);
        }
    });
    Some(rewritten.map(|m| (dlx, m)).map_err(|e| e.reply_text()))
}

/// May a dead letter that died for `reason` be delivered to `queue`? Not
/// where it already died, unless a rejection is in its history (a cycle
/// with no rejection would loop forever).
pub(crate) fn may_reach(msg: &Message, queue: &str, reason: DeathReason) -> bool {
    reason == DeathReason::Rejected || !died_in(msg, queue) || any_rejection(msg)
}

fn clear_expiration(props: &mut berth_protocol::AMQPProperties) {
    // The generated type has no "unset"; rebuild without `expiration`.
    let mut p = berth_protocol::AMQPProperties::default();
    if let Some(v) = props.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = props.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = props.headers() {
        p = p.with_headers(v.clone());
    }
    if let Some(v) = props.delivery_mode() {
        p = p.with_delivery_mode(*v);
    }
    if let Some(v) = props.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = props.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = props.reply_to() {
        p = p.with_reply_to(v.clone());
    }
    if let Some(v) = props.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = props.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = props.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = props.user_id() {
        p = p.with_user_id(v.clone());
    }
    if let Some(v) = props.app_id() {
        p = p.with_app_id(v.clone());
    }
    if let Some(v) = props.cluster_id() {
        p = p.with_cluster_id(v.clone());
    }
    *props = p;
}

fn x_death_entries(msg: &Message) -> Vec<FieldTable> {
    let headers = msg.headers();
    match headers.as_ref().and_then(|h| h.inner().get("x-death")) {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .filter_map(|v| match v {
                AMQPValue::FieldTable(t) => Some(t.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn died_in(msg: &Message, queue: &str) -> bool {
    x_death_entries(msg)
        .iter()
        .any(|t| t.inner().get("queue").and_then(as_string).as_deref() == Some(queue))
}

fn any_rejection(msg: &Message) -> bool {
    x_death_entries(msg)
        .iter()
        .any(|t| t.inner().get("reason").and_then(as_string).as_deref() == Some("rejected"))
}

fn long_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// Adds or updates this death in `x-death` (most recent first) and sets the
/// `x-first-death-*` headers once.
fn add_x_death(
    headers: &mut FieldTable,
    queue: &str,
    reason: DeathReason,
    msg: &Message,
    original_expiration: Option<u64>,
    now_s: u64,
) {
    let mut entries = x_death_entries(msg);
    let same = |t: &FieldTable| {
        t.inner().get("queue").and_then(as_string).as_deref() == Some(queue)
            && t.inner().get("reason").and_then(as_string).as_deref() == Some(reason.as_str())
    };
    let entry = if let Some(i) = entries.iter().position(same) {
        let mut t = entries.remove(i);
        let count = t
            .inner()
            .get("count")
            .and_then(crate::args::as_i128)
            .unwrap_or(0);
        t.insert(
            "count".into(),
            AMQPValue::LongLongInt(i64::try_from(count + 1).unwrap_or(i64::MAX)),
        );
        t.insert("time".into(), AMQPValue::Timestamp(now_s));
        t
    } else {
        let mut t = FieldTable::default();
        t.insert("count".into(), AMQPValue::LongLongInt(1));
        t.insert("reason".into(), long_str(reason.as_str()));
        t.insert("queue".into(), long_str(queue));
        t.insert("time".into(), AMQPValue::Timestamp(now_s));
        t.insert("exchange".into(), long_str(&msg.exchange));
        t.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![long_str(&msg.routing_key)])),
        );
        if let Some(ms) = original_expiration {
            t.insert("original-expiration".into(), long_str(&ms.to_string()));
        }
        t
    };
    entries.insert(0, entry);
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(
            entries
                .into_iter()
                .map(AMQPValue::FieldTable)
                .collect::<Vec<_>>(),
        )),
    );
    if !headers.contains_key("x-first-death-reason") {
        headers.insert("x-first-death-reason".into(), long_str(reason.as_str()));
        headers.insert("x-first-death-queue".into(), long_str(queue));
        headers.insert("x-first-death-exchange".into(), long_str(&msg.exchange));
    }
}
