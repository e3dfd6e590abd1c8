//! Acknowledgements owed to a publisher in the order it published, each
//! released only once every journal write its message needed completed:
//! the publisher-confirm rule that MQTT's PUBACK/PUBREC
//! (`mqtt/publish.rs`) and the stream protocol's PublishConfirm
//! (`stream_proto/publish.rs`) follow alike. (AMQP 0-9-1's confirms may
//! go out of order with `multiple`, and have their own bookkeeping:
//! `connection/awaiting_store.rs`.)
//!
//! Invariants:
//! - [`InOrder::due`] hands out a front run only: nothing owed is
//!   released before an earlier one, nor while a write of its own runs.
//! - A failed write marks its item ([`Owed::failed`]): it is never
//!   released as a success.
//! - A completion is matched by its number, not by arrival order; one
//!   for a number not owed is logged and ignored.

use std::collections::VecDeque;

use berth_broker::durable::Done;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// A journal write finished for the publish numbered `seq`.
pub struct Stored {
    pub seq: u64,
    pub result: Result<(), String>,
}

/// What a protocol owes for one publish.
pub trait Owed {
    /// One of its journal writes failed with `why`.
    fn failed(&mut self, why: String);
}

struct Waiting<T> {
    seq: u64,
    /// Journal writes still running.
    waits: usize,
    item: T,
}

/// What is owed, in publish order.
pub struct InOrder<T> {
    next_seq: u64,
    owed: VecDeque<Waiting<T>>,
    tx: UnboundedSender<Stored>,
}

impl<T: Owed> InOrder<T> {
    /// Completions are sent to `tx`; the connection hands each back to
    /// [`InOrder::stored`].
    pub fn new(tx: UnboundedSender<Stored>) -> Self {
        Self {
            next_seq: 0,
            owed: VecDeque::new(),
            tx,
        }
    }

    /// How many are owed.
    pub fn len(&self) -> usize {
        self.owed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// The number the next publish will have.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// What is owed, front first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.owed.iter().map(|w| &w.item)
    }

    /// The completion of one journal write of publish `seq`; `waits`
    /// counts them.
    pub fn completion<'a>(&self, seq: u64, waits: &'a mut usize) -> impl FnMut() -> Done + 'a {
        let tx = self.tx.clone();
        move || -> Done {
            *waits += 1;
            let tx = tx.clone();
            Box::new(move |r| {
                let _connection_may_be_gone = tx.send(Stored {
                    seq,
                    result: r.map_err(|e| e.to_string()),
                });
            })
        }
    }

    /// The next publish was handled with `waits` journal writes running
    /// (0: nothing to wait for); `item` is what it is owed.
    pub fn owe(&mut self, item: T, waits: usize) {
        self.owed.push_back(Waiting {
            seq: self.next_seq,
            waits,
            item,
        });
        self.next_seq += 1;
    }

    /// A journal write finished.
    pub fn stored(&mut self, s: Stored) {
        let Some(front) = self.owed.front().map(|w| w.seq) else {
            return;
        };
        let Some(w) = s
            .seq
            .checked_sub(front)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.owed.get_mut(i))
        else {
            return;
        };
        if w.seq != s.seq {
            tracing::error!(seq = s.seq, "a journal completion for a publish not owed");
            return;
        }
        w.waits = w.waits.saturating_sub(1);
        if let Err(e) = s.result {
            w.item.failed(e);
        }
    }

    /// `first` and every completion already waiting in `rx` behind it.
    pub fn stored_all(&mut self, first: Stored, rx: &mut UnboundedReceiver<Stored>) {
        self.stored(first);
        while let Ok(more) = rx.try_recv() {
            self.stored(more);
        }
    }

    /// What is due now: from the front, while nothing is waited for.
    pub fn due(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        while self.owed.front().is_some_and(|w| w.waits == 0) {
            out.push(self.owed.pop_front().expect("front exists").item);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Ack(u32, bool);

    impl Owed for Ack {
        fn failed(&mut self, _why: String) {
            self.1 = false;
        }
    }

    #[test]
    fn released_in_publish_order_only_after_their_writes_and_failures_stay_failures() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut owed = InOrder::new(tx);
        let mut dones = Vec::new();
        for id in [1u32, 2, 3] {
            let seq = owed.next_seq();
            let mut waits = 0;
            if id != 3 {
                let mut make = owed.completion(seq, &mut waits);
                dones.push(make());
            }
            owed.owe(Ack(id, true), waits);
        }
        assert!(owed.due().is_empty(), "nothing stored yet");
        // The second write completes first, and fails: nothing is due
        // while the first still waits.
        dones.pop().expect("second")(Err(berth_broker::durable::JournalError::new("disk gone")));
        owed.stored(rx.try_recv().expect("sent"));
        assert!(owed.due().is_empty());
        dones.pop().expect("first")(Ok(()));
        owed.stored(rx.try_recv().expect("sent"));
        assert_eq!(
            owed.due(),
            vec![Ack(1, true), Ack(2, false), Ack(3, true)],
            "in order, the failed one failed"
        );
        assert!(owed.is_empty());
    }
}
