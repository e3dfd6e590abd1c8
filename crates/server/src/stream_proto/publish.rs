//! Publishers and their confirms: a Publish frame's messages go to the
//! stream through the broker (the default exchange, routing key = the
//! stream's name, as an AMQP publish to it), each confirmed once every
//! journal write it needed completed — after fdatasync under
//! `store.sync = always`, the AMQP publisher confirm's rule.
//!
//! Deduplication (RabbitMQ's, for a publisher declared with a
//! reference): a message whose publishing id is not above the last one
//! of that reference on that stream is not stored again, and is
//! confirmed. The last id comes from the tracking file
//! ([`super::tracking`]) when the publisher is declared, then from what
//! this connection accepted.
//!
//! Invariants:
//! - A confirm is never sent before its message's writes completed; a
//!   failed write is a PublishError, never a confirm.
//! - Confirms go in publish order (a duplicate's waits for the messages
//!   before it), so a publisher's confirmed ids only grow.
//! - The confirms owed are bounded: the connection stops reading at
//!   `STREAM_PROTO_PUBLISHES_UNCONFIRMED_MAX`.

use std::collections::VecDeque;

use berth_broker::durable::Done;
use bytes::BytesMut;
use tokio::sync::mpsc::UnboundedSender;

use super::frame::{key, Frame};

/// A declared publisher.
pub struct Publisher {
    pub stream: String,
    pub reference: Option<String>,
    /// The highest publishing id stored or being stored (deduplication).
    pub last_id: Option<u64>,
}

/// A journal write finished for the publish numbered `seq`.
pub struct Stored {
    pub seq: u64,
    pub result: Result<(), String>,
}

struct Owed {
    seq: u64,
    publisher_id: u8,
    publishing_id: u64,
    waits: usize,
    /// The error code, if it failed.
    error: Option<u16>,
}

/// What a due message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub publisher_id: u8,
    pub publishing_id: u64,
    pub error: Option<u16>,
}

/// Confirms owed, in publish order.
pub struct Confirms {
    next_seq: u64,
    owed: VecDeque<Owed>,
    tx: UnboundedSender<Stored>,
}

impl Confirms {
    pub fn new(tx: UnboundedSender<Stored>) -> Self {
        Self {
            next_seq: 0,
            owed: VecDeque::new(),
            tx,
        }
    }

    pub fn len(&self) -> usize {
        self.owed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
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

    /// A message was handed to the broker with `waits` writes running
    /// (0: a duplicate, or nothing to store), or refused with `error`.
    pub fn owe(&mut self, publisher_id: u8, publishing_id: u64, waits: usize, error: Option<u16>) {
        self.owed.push_back(Owed {
            seq: self.next_seq,
            publisher_id,
            publishing_id,
            waits,
            error,
        });
        self.next_seq += 1;
    }

    /// A journal write finished.
    pub fn stored(&mut self, s: Stored) {
        let Some(front) = self.owed.front().map(|o| o.seq) else {
            return;
        };
        let Some(o) = s
            .seq
            .checked_sub(front)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.owed.get_mut(i))
        else {
            return;
        };
        o.waits = o.waits.saturating_sub(1);
        if let Err(e) = s.result {
            tracing::warn!(error = %e, "a stream protocol publish was not stored");
            o.error = Some(super::frame::code::INTERNAL_ERROR);
        }
    }

    /// The messages due now: from the front, while nothing is waited for.
    pub fn due(&mut self) -> Vec<Due> {
        let mut out = Vec::new();
        while self.owed.front().is_some_and(|o| o.waits == 0) {
            let o = self.owed.pop_front().expect("front exists");
            out.push(Due {
                publisher_id: o.publisher_id,
                publishing_id: o.publishing_id,
                error: o.error,
            });
        }
        out
    }
}

/// Writes PublishConfirm and PublishError frames for `due`: one frame
/// per run of one publisher's confirms or errors.
pub fn write_due(due: &[Due], out: &mut BytesMut) {
    let mut i = 0;
    while i < due.len() {
        let (p, failed) = (due[i].publisher_id, due[i].error.is_some());
        let run = due[i..]
            .iter()
            .take_while(|d| d.publisher_id == p && d.error.is_some() == failed)
            .count();
        let items = &due[i..i + run];
        if failed {
            let mut f = Frame::begin(out, key::PUBLISH_ERROR, 1);
            f.u8(p).u32(run as u32);
            for d in items {
                f.u64(d.publishing_id).u16(d.error.unwrap_or_default());
            }
            f.finish();
        } else {
            let mut f = Frame::begin(out, key::PUBLISH_CONFIRM, 1);
            f.u8(p).u32(run as u32);
            for d in items {
                f.u64(d.publishing_id);
            }
            f.finish();
        }
        i += run;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirms_wait_for_their_writes_and_keep_publish_order() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut c = Confirms::new(tx);
        let mut dones = Vec::new();
        for id in [5u64, 6] {
            let seq = c.next_seq();
            let mut waits = 0;
            {
                let mut make = c.completion(seq, &mut waits);
                dones.push(make());
            }
            c.owe(1, id, waits, None);
        }
        c.owe(1, 4, 0, None); // a duplicate: nothing to wait for
        assert!(c.due().is_empty(), "nothing stored yet");
        dones.pop().unwrap()(Err(berth_broker::durable::JournalError::new("disk gone")));
        c.stored(rx.try_recv().unwrap());
        assert!(c.due().is_empty(), "the first still waits");
        dones.pop().unwrap()(Ok(()));
        c.stored(rx.try_recv().unwrap());
        let due = c.due();
        assert_eq!(due.len(), 3);
        assert_eq!(due[0].error, None);
        assert!(due[1].error.is_some(), "a failed write is no confirm");
        let mut out = BytesMut::new();
        write_due(&due, &mut out);
        // confirm [5], error [6], confirm [4]
        assert_eq!(&out[4..6], &[0, 3]);
    }
}
