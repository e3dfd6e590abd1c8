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

use bytes::BytesMut;

use super::frame::{key, Frame};
use crate::in_order::{InOrder, Owed};

/// A declared publisher.
pub struct Publisher {
    pub stream: String,
    pub reference: Option<String>,
    /// The highest publishing id stored or being stored (deduplication).
    pub last_id: Option<u64>,
}

pub use crate::in_order::Stored;

/// What one published message is owed: a confirm, or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub publisher_id: u8,
    pub publishing_id: u64,
    pub error: Option<u16>,
}

impl Owed for Due {
    fn failed(&mut self, why: String) {
        tracing::warn!(error = %why, "a stream protocol publish was not stored");
        self.error = Some(super::frame::code::INTERNAL_ERROR);
    }
}

/// Confirms owed, in publish order.
pub type Confirms = InOrder<Due>;

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
            c.owe(
                Due {
                    publisher_id: 1,
                    publishing_id: id,
                    error: None,
                },
                waits,
            );
        }
        // A duplicate: nothing to wait for.
        c.owe(
            Due {
                publisher_id: 1,
                publishing_id: 4,
                error: None,
            },
            0,
        );
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
