//! A published message as the broker routes and stores it.
//!
//! Properties stay in the publisher's wire encoding; the few fields the broker
//! acts on (delivery mode, priority, expiration, headers) are decoded once at
//! publish time. One `Arc<Message>` is shared by every queue it was routed to.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use berth_protocol::codec::{decode_properties, encode_properties};
use berth_protocol::{AMQPProperties, AMQPValue, FieldTable};
use bytes::Bytes;

use crate::error::{AmqpError, AmqpResult};
use crate::name_rules::check_shortstr;

/// Bytes held by all live messages (bodies and properties), for the memory
/// alarm. Counted when a message is built and released when its last
/// reference goes, so no queue bookkeeping can get it wrong.
static MESSAGE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Next [`Message::id`].
static NEXT_MESSAGE_ID: AtomicU64 = AtomicU64::new(1);

/// Bytes currently held by messages in this process.
pub fn message_bytes() -> u64 {
    MESSAGE_BYTES.load(Ordering::Relaxed)
}

/// A message, immutable once published.
#[derive(Debug)]
pub struct Message {
    /// Exchange it was published to.
    pub exchange: String,
    pub routing_key: String,
    /// Raw property flags + property list, re-sent as-is on delivery.
    pub properties: Bytes,
    pub body: Bytes,
    /// `delivery-mode = 2`.
    pub persistent: bool,
    /// `priority` property; 0 when absent.
    pub priority: u8,
    /// `expiration` property, parsed (milliseconds).
    pub expiration_ms: Option<u64>,
    /// Unique in this broker process (events name messages by it).
    pub id: u64,
    /// Whether its write is known to be durable (see [`Commit`]); a queue
    /// that reads only committed messages (a quorum queue) delivers it
    /// only once it is.
    commit: AtomicU8,
}

/// Where a message's journal write stands, for queues that deliver only
/// what is durable (quorum queues: on a majority of disks in a cluster,
/// fdatasynced on one node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Durable, or never waited for (the default).
    Committed,
    /// Written, not yet durable: not to be delivered yet.
    Awaiting,
    /// The write failed: the publisher was nacked, the message is dropped
    /// where it waits (a nack means "maybe not stored": it is never
    /// delivered, and its removal is journaled after the write).
    Failed,
}

const COMMITTED: u8 = 0;
const AWAITING: u8 = 1;
const FAILED: u8 = 2;

impl Message {
    /// Builds a message from a publish, checking the properties the broker
    /// interprets. A malformed `expiration` is refused as RabbitMQ does.
    pub fn new(
        exchange: String,
        routing_key: String,
        properties: Bytes,
        body: Bytes,
    ) -> AmqpResult<Arc<Self>> {
        let props = decode_properties(&properties)
            .map_err(|e| AmqpError::new(berth_protocol::reply::SYNTAX_ERROR, e.to_string()))?;
        Self::from_props(exchange, routing_key, &props, properties, body)
    }

    /// A message as [`crate::durable::encode_message`] stored it, or why it
    /// cannot be rebuilt.
    pub fn from_stored(payload: &Bytes) -> Result<Arc<Self>, String> {
        let (exchange, routing_key, properties, body) = crate::durable::decode_message(payload)
            .ok_or_else(|| "stored payload does not decode".to_owned())?;
        Self::new(exchange, routing_key, properties, body).map_err(|e| e.reply_text())
    }

    /// [`Message::new`] for a client's publish: a `user_id` property must
    /// name the authenticated user, as RabbitMQ validates it.
    pub fn published(
        exchange: String,
        routing_key: String,
        properties: Bytes,
        body: Bytes,
        user: &str,
    ) -> AmqpResult<Arc<Self>> {
        let props = decode_properties(&properties)
            .map_err(|e| AmqpError::new(berth_protocol::reply::SYNTAX_ERROR, e.to_string()))?;
        if let Some(claimed) = props.user_id() {
            if claimed.as_str() != user {
                return Err(AmqpError::precondition_failed(format!(
                    "user_id property set to '{}' but authenticated user was '{user}'",
                    claimed.as_str()
                )));
            }
        }
        Self::from_props(exchange, routing_key, &props, properties, body)
    }

    fn from_props(
        exchange: String,
        routing_key: String,
        props: &AMQPProperties,
        properties: Bytes,
        body: Bytes,
    ) -> AmqpResult<Arc<Self>> {
        check_shortstr("exchange name", &exchange)?;
        check_shortstr("routing key", &routing_key)?;
        let expiration_ms = match props.expiration() {
            None => None,
            Some(s) => Some(s.as_str().parse::<u64>().map_err(|_| {
                AmqpError::precondition_failed(format!(
                    "invalid expiration '{}': expected a non-negative integer of milliseconds",
                    s.as_str()
                ))
            })?),
        };
        MESSAGE_BYTES.fetch_add((body.len() + properties.len()) as u64, Ordering::Relaxed);
        Ok(Arc::new(Self {
            exchange,
            routing_key,
            properties,
            body,
            persistent: props.delivery_mode() == &Some(2),
            priority: props.priority().unwrap_or(0),
            expiration_ms,
            id: NEXT_MESSAGE_ID.fetch_add(1, Ordering::Relaxed),
            commit: AtomicU8::new(COMMITTED),
        }))
    }

    /// Where its journal write stands.
    pub fn commit(&self) -> Commit {
        match self.commit.load(Ordering::Acquire) {
            AWAITING => Commit::Awaiting,
            FAILED => Commit::Failed,
            _ => Commit::Committed,
        }
    }

    /// Its write is under way: hold it back until [`Message::committed`].
    pub(crate) fn await_commit(&self) {
        self.commit.store(AWAITING, Ordering::Release);
    }

    /// Its write completed (`ok`) or failed.
    pub(crate) fn committed(&self, ok: bool) {
        let to = if ok { COMMITTED } else { FAILED };
        self.commit.store(to, Ordering::Release);
    }

    /// Bytes this message costs in memory, for limits and metrics.
    #[must_use]
    pub fn size_bytes(&self) -> u64 {
        (self.body.len() + self.properties.len()) as u64
    }

    /// Body bytes: what `x-max-length-bytes` and RabbitMQ's
    /// `message_bytes` count (properties are not included).
    #[must_use]
    pub fn body_bytes(&self) -> u64 {
        self.body.len() as u64
    }

    /// A copy with rewritten properties (dead-lettering adds `x-death`), a new
    /// exchange and routing key.
    pub fn rewritten(
        &self,
        exchange: String,
        routing_key: String,
        edit: impl FnOnce(&mut AMQPProperties),
    ) -> AmqpResult<Arc<Self>> {
        let mut props = decode_properties(&self.properties)
            .map_err(|e| AmqpError::internal(format!("stored properties do not parse: {e}")))?;
        edit(&mut props);
        let raw = encode_properties(&props);
        Self::from_props(exchange, routing_key, &props, raw, self.body.clone())
    }

    /// The `headers` property (for the headers exchange and
    /// dead-lettering), decoded from the properties when asked. It is not
    /// kept decoded: a decoded table costs ~20 times its wire size in
    /// memory, and a client can send tables as large as a frame.
    pub fn headers(&self) -> Option<FieldTable> {
        // The properties were decoded once when the message was built.
        decode_properties(&self.properties)
            .ok()
            .and_then(|p| p.headers().clone())
    }

    /// A header as a string, if present and textual.
    pub fn header_str(&self, key: &str) -> Option<String> {
        match self.headers()?.inner().get(key)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            _ => None,
        }
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        MESSAGE_BYTES.fetch_sub(self.size_bytes(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(p: AMQPProperties) -> Bytes {
        encode_properties(&p)
    }

    #[test]
    fn interpreted_properties_are_decoded() {
        let m = Message::new(
            "x".into(),
            "k".into(),
            props(
                AMQPProperties::default()
                    .with_delivery_mode(2)
                    .with_priority(7)
                    .with_expiration("1500".into()),
            ),
            Bytes::from_static(b"body"),
        )
        .unwrap();
        assert!(m.persistent);
        assert_eq!(m.priority, 7);
        assert_eq!(m.expiration_ms, Some(1500));
    }

    #[test]
    fn non_numeric_expiration_is_refused_with_406() {
        let e = Message::new(
            "x".into(),
            "k".into(),
            props(AMQPProperties::default().with_expiration("soon".into())),
            Bytes::new(),
        )
        .unwrap_err();
        assert_eq!(e.reply_code, 406);
    }
}
