//! Message lifecycle events (`event_log.enabled`): what happened to which
//! message in which queue, encoded by the broker and handed to an
//! [`EventSink`] (the server's is the store's per-group event log).
//!
//! The broker knows the meaning (queue, vhost, connection, user); the sink
//! only frames, stamps and orders opaque bytes, so the store learns nothing
//! of AMQP. When the event log is off, [`Durability::events`] is `None` and
//! each hook costs one branch.
//!
//! Payload layout (docs/FORMAT.md, "Event payload"), little-endian:
//! `version u8 (1) | kind u8 | reason u8 | msg u64 | size u64 |
//! connection u64 | vhost, queue, user, detail: each u8 length + UTF-8`.
//!
//! Invariants:
//! - An encoded payload is at most [`EVENT_BYTES_MAX`] bytes (each string
//!   is cut to 255 bytes at a character boundary).
//! - [`decode`] never panics, whatever the bytes.
//!
//! [`Durability::events`]: crate::durable::Durability::events

use std::sync::Arc;

use crate::dead_letter::DeathReason;
pub use crate::durable::EventSink;

/// Largest encoded event: the fixed part and four 255-byte strings.
pub const EVENT_BYTES_MAX: usize = FIXED_BYTES + 4 * 256;
const FIXED_BYTES: usize = 3 + 3 * 8;
const VERSION: u8 = 1;

/// What happened to a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    /// Routed to the queue (accepted).
    Published = 1,
    /// Handed to a consumer (`basic.deliver`) or fetched (`basic.get-ok`).
    Delivered = 2,
    /// Acked by the client (or delivered with `no_ack`).
    Acked = 3,
    /// Came back to the queue (nack/reject with requeue, channel closed,
    /// `basic.recover`).
    Requeued = 4,
    /// Nacked or rejected without requeue.
    Rejected = 5,
    /// Republished through the queue's dead-letter exchange; the reason
    /// says why it left.
    DeadLettered = 6,
    /// Its TTL ran out and the queue has no dead-letter exchange.
    Expired = 7,
    /// Dropped by a length limit (`x-overflow`) or the delivery limit, with
    /// no dead-letter exchange; the reason says which.
    Dropped = 8,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Delivered => "delivered",
            Self::Acked => "acked",
            Self::Requeued => "requeued",
            Self::Rejected => "rejected",
            Self::DeadLettered => "dead_lettered",
            Self::Expired => "expired",
            Self::Dropped => "dropped",
        }
    }

    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Published,
            2 => Self::Delivered,
            3 => Self::Acked,
            4 => Self::Requeued,
            5 => Self::Rejected,
            6 => Self::DeadLettered,
            7 => Self::Expired,
            8 => Self::Dropped,
            _ => return None,
        })
    }
}

/// Reason codes on the wire (0 = none), named as `x-death` names them.
fn reason_code(r: Option<DeathReason>) -> u8 {
    match r {
        None => 0,
        Some(DeathReason::Rejected) => 1,
        Some(DeathReason::Expired) => 2,
        Some(DeathReason::MaxLen) => 3,
        Some(DeathReason::DeliveryLimit) => 4,
    }
}

fn reason_name(code: u8) -> &'static str {
    match code {
        1 => "rejected",
        2 => "expired",
        3 => "maxlen",
        4 => "delivery_limit",
        _ => "",
    }
}

/// One event as the broker reports it.
pub struct Event<'a> {
    pub kind: EventKind,
    pub reason: Option<DeathReason>,
    pub vhost: &'a str,
    pub queue: &'a str,
    /// A durable queue's store id (its events go to its log group).
    pub queue_store_id: Option<u64>,
    /// The message's id in this broker process ([`crate::message::Message::id`]).
    pub msg: u64,
    /// Body bytes.
    pub size: u64,
    /// The connection that caused it, where known (0: the broker itself,
    /// e.g. TTL expiry).
    pub connection: u64,
    pub user: &'a str,
    /// Kind-specific: `exchange/routing_key` for a publish, the consumer
    /// tag for a delivery.
    pub detail: &'a str,
}

/// Who caused what a queue operation does: the client (connection and
/// user) whose publish, ack or nack it is, or the broker itself (TTL
/// expiry, `x-expires`, the management API): the default. Passed with
/// every operation that can cause events, down to the dead letters it
/// republishes, so each event names its cause.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub connection: u64,
    /// `None`: the broker (or the event log is off, and no one asks).
    pub user: Option<Arc<str>>,
}

impl Origin {
    /// A client's connection and user.
    pub fn client(connection: u64, user: &Arc<str>) -> Self {
        Self {
            connection,
            user: Some(Arc::clone(user)),
        }
    }

    /// The user's name, or "" for the broker.
    pub fn user(&self) -> &str {
        self.user.as_deref().unwrap_or("")
    }
}

/// Sends `ev` to `sink`.
pub fn emit(sink: &dyn EventSink, ev: &Event<'_>) {
    let mut buf = Vec::with_capacity(FIXED_BYTES + 64);
    let key = ev
        .queue_store_id
        .unwrap_or_else(|| name_key(ev.vhost, ev.queue));
    encode(&mut buf, ev);
    sink.append(key, &buf);
}

/// The group key of a queue without a store id: FNV-1a of its vhost and
/// name, so one queue's events stay in one group.
fn name_key(vhost: &str, queue: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in vhost.bytes().chain([0]).chain(queue.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn encode(out: &mut Vec<u8>, ev: &Event<'_>) {
    out.push(VERSION);
    out.push(ev.kind as u8);
    out.push(reason_code(ev.reason));
    out.extend_from_slice(&ev.msg.to_le_bytes());
    out.extend_from_slice(&ev.size.to_le_bytes());
    out.extend_from_slice(&ev.connection.to_le_bytes());
    for s in [ev.vhost, ev.queue, ev.user, ev.detail] {
        let mut end = s.len().min(255);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        out.push(u8::try_from(end).expect("at most 255"));
        out.extend_from_slice(&s.as_bytes()[..end]);
    }
    debug_assert!(out.len() <= EVENT_BYTES_MAX);
}

/// An event read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedEvent {
    pub kind: EventKind,
    /// `x-death` style reason ("rejected", "expired", "maxlen",
    /// "delivery_limit"), or "".
    pub reason: &'static str,
    pub msg: u64,
    pub size: u64,
    pub connection: u64,
    pub vhost: String,
    pub queue: String,
    pub user: String,
    pub detail: String,
}

/// Decodes a payload written by [`emit`]; `None` if it is not one.
pub fn decode(b: &[u8]) -> Option<DecodedEvent> {
    if b.len() < FIXED_BYTES || b[0] != VERSION {
        return None;
    }
    let long = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let mut at = FIXED_BYTES;
    let mut strings = Vec::with_capacity(4);
    for _ in 0..4 {
        let n = usize::from(*b.get(at)?);
        let s = b.get(at + 1..at + 1 + n)?;
        strings.push(String::from_utf8_lossy(s).into_owned());
        at += 1 + n;
    }
    let detail = strings.pop()?;
    let user = strings.pop()?;
    let queue = strings.pop()?;
    let vhost = strings.pop()?;
    Some(DecodedEvent {
        kind: EventKind::from_u8(b[1])?,
        reason: reason_name(b[2]),
        msg: long(3),
        size: long(11),
        connection: long(19),
        vhost,
        queue,
        user,
        detail,
    })
}

/// The event for a message leaving a queue for good with `reason`
/// (`None`: no event, e.g. an ack, which the channel reports).
pub fn left_kind(reason: Option<DeathReason>, dead_lettered: bool) -> Option<EventKind> {
    match (reason?, dead_lettered) {
        (_, true) => Some(EventKind::DeadLettered),
        (DeathReason::Expired, false) => Some(EventKind::Expired),
        (DeathReason::Rejected, false) => None,
        (DeathReason::MaxLen | DeathReason::DeliveryLimit, false) => Some(EventKind::Dropped),
    }
}

/// A queue as events name it: vhost, name, store id.
pub type QueueName<'a> = (&'a str, &'a str, Option<u64>);

/// A message (`msg`, 0 if its body was on disk only) left queue `q` for
/// good with `reason`, caused by `origin`: reports it if the event log is
/// on and the reason makes an event (see [`left_kind`]).
pub fn left(
    sink: Option<&dyn EventSink>,
    q: QueueName<'_>,
    reason: Option<DeathReason>,
    dead_lettered: bool,
    (msg, size): (u64, u64),
    origin: &Origin,
) {
    let (Some(sink), Some(kind)) = (sink, left_kind(reason, dead_lettered)) else {
        return;
    };
    emit(
        sink,
        &Event {
            kind,
            reason,
            vhost: q.0,
            queue: q.1,
            queue_store_id: q.2,
            msg,
            size,
            connection: origin.connection,
            user: origin.user(),
            detail: "",
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Capture(Mutex<Vec<(u64, Vec<u8>)>>);
    impl EventSink for Capture {
        fn append(&self, key: u64, payload: &[u8]) {
            self.0.lock().push((key, payload.to_vec()));
        }
    }

    fn ev<'a>(queue: &'a str, detail: &'a str) -> Event<'a> {
        Event {
            kind: EventKind::DeadLettered,
            reason: Some(DeathReason::Expired),
            vhost: "/",
            queue,
            queue_store_id: None,
            msg: 42,
            size: 7,
            connection: 0,
            user: "",
            detail,
        }
    }

    #[test]
    fn round_trip_with_the_publishing_origin() {
        let sink = Capture::default();
        let origin = Origin::client(9, &Arc::from("guest"));
        let from_client = Event {
            connection: origin.connection,
            user: origin.user(),
            ..ev("q1", "amq.direct/k")
        };
        emit(&sink, &from_client);
        emit(&sink, &ev("q1", ""));
        let got = sink.0.lock();
        let a = decode(&got[0].1).expect("decodes");
        assert_eq!(a.kind, EventKind::DeadLettered);
        assert_eq!(a.reason, "expired");
        assert_eq!((a.msg, a.size, a.connection), (42, 7, 9));
        assert_eq!((a.queue.as_str(), a.user.as_str()), ("q1", "guest"));
        assert_eq!(a.detail, "amq.direct/k");
        let b = decode(&got[1].1).expect("decodes");
        assert_eq!(
            (b.connection, b.user.as_str()),
            (0, ""),
            "an event of the broker names no client"
        );
        assert_eq!(got[0].0, got[1].0, "one queue, one group key");
    }

    #[test]
    fn long_names_are_cut_at_a_char_boundary_and_decode_never_panics() {
        let sink = Capture::default();
        let long = "é".repeat(300);
        emit(&sink, &ev(&long, &long));
        let bytes = sink.0.lock()[0].1.clone();
        assert!(bytes.len() <= EVENT_BYTES_MAX);
        let d = decode(&bytes).expect("decodes");
        assert_eq!(d.queue.len(), 254);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_none(), "cut at {cut}");
        }
    }
}
