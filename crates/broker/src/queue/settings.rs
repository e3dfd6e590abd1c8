//! A queue's settings in force: its declared `x-` arguments combined with
//! the policy and operator policy that apply to it
//! ([`crate::policy::Applied::queue_args`]), and what a change of them does
//! at once.
//!
//! Invariants:
//! - Readers take a snapshot (`Arc<QueueArgs>`) and never hold the settings
//!   lock while they work; the settings lock is never taken while waiting
//!   for the queue lock.
//! - A change acts on the queue as RabbitMQ does: a lower length limit
//!   drops (or dead-letters) from the head at once, a new `expires` restarts
//!   its deadline; a new `message-ttl` applies to messages enqueued from then
//!   on (the expiry of a queued message is fixed when it is enqueued).

use std::sync::Arc;
use std::time::Instant;

use super::{Effects, Queue, QueueState};
use crate::args::QueueArgs;
use crate::dead_letter::DeathReason;
use crate::message::Message;
use crate::policy::Applied;

/// What is in force, and why.
pub(super) struct Effective {
    pub(super) args: Arc<QueueArgs>,
    pub(super) applied: Applied,
}

impl Effective {
    /// Settings with no policy: the declared arguments.
    pub(super) fn declared(args: &QueueArgs) -> Self {
        Self {
            args: Arc::new(args.clone()),
            applied: Applied::default(),
        }
    }
}

impl Queue {
    /// The settings in force (declared arguments and policies combined).
    pub fn args(&self) -> Arc<QueueArgs> {
        Arc::clone(&self.effective.read().args)
    }

    /// The policy and operator policy in force, for the management API.
    pub fn applied_policies(&self) -> Applied {
        self.effective.read().applied.clone()
    }

    /// Puts the given policies in force and acts on the change.
    pub fn set_policies(self: &Arc<Self>, applied: Applied, now: Instant) {
        let args = applied.queue_args(&self.declared_args, &self.arguments);
        let changed = {
            let mut e = self.effective.write();
            let changed = *e.args != args;
            *e = Effective {
                args: Arc::new(args),
                applied,
            };
            changed
        };
        if changed {
            self.with_state(now, |q, s, fx| {
                if s.deleted {
                    return;
                }
                // A new deadline (x-expires, TTL) is registered afresh.
                s.timer_at = None;
                q.trim_to_limits(s, now, fx);
                q.stream_retention(s, q.env.clock.unix_time_us() / 1000, fx);
            });
        }
    }

    pub(super) fn would_overflow(&self, s: &QueueState, msg: &Message) -> bool {
        let a = self.args();
        a.max_length.is_some_and(|max| s.ready.len as u64 >= max)
            || a.max_length_bytes
                .is_some_and(|max| s.ready.bytes + msg.body_bytes() > max)
    }

    /// Drops (dead-letters) from the head until the queue is within its
    /// length limits.
    pub(super) fn trim_to_limits(&self, s: &mut QueueState, now: Instant, fx: &mut Effects) {
        let a = self.args();
        loop {
            let over = a.max_length.is_some_and(|max| s.ready.len as u64 > max)
                || a.max_length_bytes.is_some_and(|max| s.ready.bytes > max);
            if !over {
                break;
            }
            match s.ready.pop_front() {
                Some(e) => self.drop_entry(s, e, Some(DeathReason::MaxLen), now, fx),
                None => break,
            }
        }
    }
}
