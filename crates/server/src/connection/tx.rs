//! The `tx` class: select, commit and rollback. A commit's journal writes
//! are waited for in [`super::awaiting_store`]; `commit-ok` goes out from there
//! when a commit had to wait.
//!
//! Invariants:
//! - A channel is in tx mode or confirm mode, never both.
//! - `tx.commit-ok` is sent only once every journal write of the commit
//!   completed.

use std::sync::Arc;

use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::methods::tx;
use berth_protocol::AMQPClass;

use super::exception::not_from_client;
use super::Conn;

impl Conn {
    /// A `tx` method on an open channel.
    pub(super) fn tx_method(&mut self, channel: u16, m: tx::AMQPMethod) -> AmqpResult<()> {
        let ch = Arc::clone(&self.slot(channel).ch);
        match m {
            tx::AMQPMethod::Select(_) => {
                if self.slot(channel).confirms.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                ch.tx_select();
                self.send_method(
                    channel,
                    &AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})),
                );
                Ok(())
            }
            tx::AMQPMethod::Commit(_) => self.tx_commit(channel),
            tx::AMQPMethod::Rollback(_) => {
                ch.tx_rollback()?;
                self.send_method(
                    channel,
                    &AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
                );
                Ok(())
            }
            other => Err(not_from_client(&AMQPClass::Tx(other))),
        }
    }

    /// `tx.commit`: routes the buffered publishes; `commit-ok` now if none
    /// was journaled, else once the journal has them all.
    fn tx_commit(&mut self, channel: u16) -> AmqpResult<()> {
        let now = Self::now();
        let ch = Arc::clone(&self.slot(channel).ch);
        let mut waits = 0usize;
        let published = {
            let mut completion = self.tx_completion(channel, &mut waits);
            ch.tx_commit(now, &mut completion)?
        };
        let partial = published.iter().any(|p| p.result.rejected);
        for p in published {
            self.after_publish(channel, &p, None);
        }
        self.tx_waits += waits;
        let slot = self.slot(channel);
        slot.tx_waiting += waits;
        if partial {
            // What fitted stays enqueued, as in RabbitMQ; the
            // client learns that the rest was refused.
            return Err(AmqpError::precondition_failed("partial tx completion"));
        }
        if slot.tx_waiting == 0 {
            self.send_method(
                channel,
                &AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
            );
        } else {
            slot.tx_commit_pending = true;
        }
        Ok(())
    }
}
