//! The `confirm` class: `confirm.select` puts a channel in publisher
//! confirm mode (the bookkeeping is in [`super::awaiting_store`]).
//!
//! Invariant: a channel is in confirm mode or tx mode, never both.

use std::sync::Arc;

use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::methods::confirm;
use berth_protocol::AMQPClass;

use super::exception::not_from_client;
use super::Conn;

impl Conn {
    /// A `confirm` method on an open channel.
    pub(super) fn confirm_method(
        &mut self,
        channel: u16,
        m: confirm::AMQPMethod,
    ) -> AmqpResult<()> {
        match m {
            confirm::AMQPMethod::Select(s) => {
                let ch = Arc::clone(&self.slot(channel).ch);
                if ch.is_transactional() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                let slot = self.slot(channel);
                if slot.confirms.is_none() {
                    slot.confirms = Some(Arc::default());
                }
                if !s.nowait {
                    self.send_method(
                        channel,
                        &AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                Ok(())
            }
            other => Err(not_from_client(&AMQPClass::Confirm(other))),
        }
    }
}
