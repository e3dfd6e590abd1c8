//! A queue's share of its vhost's totals (`crate::totals`): what it
//! contributes now, and the report of the change since its last one.
//!
//! Invariants:
//! - A queue reports under its own lock, after every change of its state
//!   (`with_state`, `mark_deleted`, and where restore fills it directly),
//!   so its reports reach the totals in the order its states followed
//!   one another.

use crate::totals::{QueueFigures, Tally};

use super::{Queue, QueueState};

impl Queue {
    /// What this queue contributes to its vhost's totals in state `s`.
    fn tally(&self, s: &QueueState) -> Tally {
        let counted = self.counters.totals();
        if s.deleted {
            return Tally::deleted(counted);
        }
        let (ready, ready_bytes) = match s.stream.as_ref() {
            Some(st) => {
                let l = st.stats();
                (l.messages, l.bytes)
            }
            None => (s.ready.len as u64, s.ready.bytes),
        };
        Tally::live(&QueueFigures {
            ready,
            ready_bytes,
            unacked: s.unacked as u64,
            consumers: s.consumers.len() as u64,
            is_stream: s.stream.is_some(),
            counted,
        })
    }

    /// Reports the change since the last report (called holding the lock).
    pub(super) fn report_locked(&self, s: &mut QueueState) {
        let now = self.tally(s);
        if now != s.reported {
            self.env.totals.report(&s.reported, &now);
            s.reported = now;
        }
    }

    /// Reports the queue's state to its vhost's totals: once it is in the
    /// vhost's map, and after restore filled it.
    pub(crate) fn report_totals(&self) {
        let mut s = self.state.lock();
        self.report_locked(&mut s);
    }
}
