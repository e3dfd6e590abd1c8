//! When a connection is not read: the memory and disk alarms, flow pauses
//! behind backlogged queues, too many journal completions pending, the
//! journal's queues of writes at their bound, an output buffer at twice
//! its bound; and consumers paused by a full output buffer resuming once
//! it drained.
//!
//! Invariants:
//! - Back-pressure stops reading from the socket (TCP does the rest); it
//!   never drops or refuses a frame.
//! - Every pause ends: a flow pause after [`limits::FLOW_PAUSE_MS_MAX`], the
//!   alarms once memory in use is below the watermark and the disks have
//!   space, the completion bound as the journal completes writes, a full
//!   output buffer once the writer took it (a peer that never reads holds
//!   at most its bounded buffers until it goes away), a full journal queue
//!   once its writer took requests (the task awaits that; no thread waits).
//! - While the journal's queues are full, not even frames already read are
//!   handled: each connection adds at most the one frame it was handling
//!   when the queue filled (see `Journal::poll_room`).
//! - Journal completions in flight to this connection (its `stored`
//!   channel) are at most [`limits::COMPLETIONS_PER_CONNECTION_MAX`]: each
//!   is counted when its write is submitted and the socket is not read at
//!   the bound, so the channel needs no bound of its own (a bounded one
//!   would make a store thread wait on a client).

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::queue::Queue;
use berth_protocol::methods::connection as conn;
use berth_protocol::AMQPClass;

use super::Conn;
use crate::limits;

/// A connection's back-pressure state.
pub(super) struct Flow {
    /// This connection published something: the memory alarm applies to it.
    pub(super) has_published: bool,
    /// We stopped reading because of the memory alarm.
    blocked: bool,
    /// The client understands `connection.blocked`.
    pub(super) blocked_notify: bool,
    /// Not reading until this queue has caught up, or until the deadline
    /// (see [`limits::FLOW_PAUSE_MS_MAX`]).
    pause: Option<(Arc<Queue>, Instant)>,
    /// Message bytes in memory above which the alarm goes off.
    memory_high_watermark_bytes: u64,
}

impl Flow {
    pub(super) fn new(memory_high_watermark_bytes: u64) -> Self {
        Self {
            has_published: false,
            blocked: false,
            blocked_notify: false,
            pause: None,
            memory_high_watermark_bytes,
        }
    }

    /// A publish went to a queue whose consumers are not keeping up: stop
    /// reading until it caught up (unless already paused).
    pub(super) fn pause_for(&mut self, backlogged: Option<&Arc<Queue>>) {
        if let (None, Some(q)) = (&self.pause, backlogged) {
            let until = Instant::now() + Duration::from_millis(limits::FLOW_PAUSE_MS_MAX);
            self.pause = Some((Arc::clone(q), until));
        }
    }

    /// Ends the flow pause once its queue caught up or its time is over.
    pub(super) fn end_pause_if_over(&mut self, now: Instant) {
        if let Some((q, until)) = &self.pause {
            if now >= *until || q.caught_up(now) {
                self.pause = None;
            }
        }
    }

    pub(super) fn is_paused(&self) -> bool {
        self.pause.is_some()
    }
}

impl Conn {
    /// Whether the socket may be read now.
    pub(super) fn may_read(&self) -> bool {
        self.journal_has_room()
            && !self.flow.blocked
            && !self.flow.is_paused()
            && self.completions.unconfirmed() + self.tx_waits
                < limits::COMPLETIONS_PER_CONNECTION_MAX
            && !self.out.is_full()
    }

    /// Whether the journal takes more writes now; when not, the connection
    /// handles no frame and awaits `Broker::poll_journal_room` (its main
    /// loop).
    pub(super) fn journal_has_room(&self) -> bool {
        self.shared.broker.journal_has_room()
    }

    /// The resource alarms: publishing connections stop being read while
    /// memory in use (messages, output buffers, bodies being assembled) is
    /// above the watermark or a data directory is low on space (TCP
    /// back-pressure does the rest), and are told so if they asked.
    pub(super) fn update_blocked(&mut self) {
        let memory_over = crate::memory::used_bytes() > self.flow.memory_high_watermark_bytes;
        let reason = if memory_over {
            Some("low on memory")
        } else if self.shared.disk.is_on() {
            Some("low on disk")
        } else {
            None
        };
        let over = reason.is_some();
        if over && self.flow.has_published && !self.flow.blocked {
            self.flow.blocked = true;
            let reason = reason.unwrap_or_default();
            tracing::warn!(peer = %self.peer, reason, "resource alarm: blocking publishing connection");
            if self.flow.blocked_notify {
                self.send_method(
                    0,
                    &AMQPClass::Connection(conn::AMQPMethod::Blocked(conn::Blocked {
                        reason: reason.into(),
                    })),
                );
            }
        } else if !over && self.flow.blocked {
            self.flow.blocked = false;
            if self.flow.blocked_notify {
                self.send_method(
                    0,
                    &AMQPClass::Connection(conn::AMQPMethod::Unblocked(conn::Unblocked {})),
                );
            }
        }
    }

    /// The output buffer drained below its bound: consumers paused by it
    /// deliver again.
    pub(super) fn resume_consumers(&self) {
        let now = Self::now();
        for s in self.channels.values() {
            s.ch.resume(now);
        }
    }
}
