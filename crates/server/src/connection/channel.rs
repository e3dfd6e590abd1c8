//! The `channel` class (and the obsolete `access` class): opening a channel,
//! its close handshake in both directions, and `channel.flow`.
//!
//! Invariants:
//! - At most the negotiated `channel_max` channels are open at once.
//! - A channel we are closing takes nothing but `close` / `close-ok`; every
//!   other frame on it is dropped until the client answers.
//! - Each opening of a channel number is a new generation, so journal
//!   completions of an earlier life of the number never touch this one.

use std::sync::Arc;

use berth_broker::channel::Channel;
use berth_broker::{AmqpError, AmqpResult};
use berth_protocol::codec::{self, DecodeError, Method};
use berth_protocol::content::ContentAssembler;
use berth_protocol::methods::{access, channel as chan};
use berth_protocol::AMQPClass;

use super::exception::{decode_error, not_from_client, End};
use super::{ChanState, Conn, Slot};

impl Conn {
    /// A method on a channel that is not open: only `channel.open` is valid.
    pub(super) fn unopened_channel_method(
        &mut self,
        channel: u16,
        payload: &[u8],
        decoded: Result<Method, DecodeError>,
    ) -> Result<(), End> {
        match decoded {
            Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::Open(_)))) => {
                if self.channels.len() >= usize::from(self.channel_max) {
                    return Err(AmqpError::not_allowed(format!(
                        "number of channels opened ({}) has reached the negotiated channel_max ({})",
                        self.channels.len(),
                        self.channel_max
                    ))
                    .into());
                }
                let session = Arc::clone(self.session.as_ref().expect("open after handshake"));
                self.generations += 1;
                let ch = Channel::new(channel, session);
                self.registry_channel(channel, Some(&ch));
                self.channels.insert(
                    channel,
                    Slot {
                        state: ChanState::Open,
                        ch,
                        content: ContentAssembler::new(channel),
                        assembling: crate::memory::Counted::new(&crate::memory::ASSEMBLING_BYTES),
                        confirms: None,
                        last_queue: None,
                        tx_waiting: 0,
                        tx_commit_pending: false,
                        generation: self.generations,
                    },
                );
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::OpenOk(chan::OpenOk {})),
                );
                Ok(())
            }
            Err(e) => Err(decode_error(&e).into()),
            Ok(_) => {
                let (c, m) = codec::method_ids(payload).unwrap_or((0, 0));
                Err(AmqpError::channel_error("expected 'channel.open'")
                    .during(c, m)
                    .into())
            }
        }
    }

    /// A method on a channel we are closing: waits for the close handshake.
    pub(super) fn closing_channel_method(
        &mut self,
        channel: u16,
        decoded: Result<Method, DecodeError>,
    ) {
        match decoded {
            Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::CloseOk(_)))) => {
                self.channels.remove(&channel);
                self.registry_channel(channel, None);
            }
            // The two closes crossed: answer the peer's, and keep waiting
            // for its close-ok to ours (as RabbitMQ does), which must not
            // find the number free.
            Ok(Method::Other(AMQPClass::Channel(chan::AMQPMethod::Close(_)))) => {
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::CloseOk(chan::CloseOk {})),
                );
            }
            // Everything else is dropped while the close handshake runs.
            _ => {}
        }
    }

    /// A `channel` method on an open channel.
    pub(super) fn channel_class_method(
        &mut self,
        channel: u16,
        m: chan::AMQPMethod,
    ) -> AmqpResult<()> {
        match m {
            chan::AMQPMethod::Open(_) => Err(AmqpError::channel_error(format!(
                "second 'channel.open' seen on channel {channel}"
            ))),
            chan::AMQPMethod::Close(_) => {
                self.slot(channel).ch.close(Self::now());
                self.channels.remove(&channel);
                self.registry_channel(channel, None);
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::CloseOk(chan::CloseOk {})),
                );
                Ok(())
            }
            chan::AMQPMethod::CloseOk(_) | chan::AMQPMethod::FlowOk(_) => Ok(()),
            chan::AMQPMethod::Flow(f) => {
                if !f.active {
                    return Err(AmqpError::not_implemented("active=false"));
                }
                self.send_method(
                    channel,
                    &AMQPClass::Channel(chan::AMQPMethod::FlowOk(chan::FlowOk { active: true })),
                );
                Ok(())
            }
            other => Err(not_from_client(&AMQPClass::Channel(other))),
        }
    }

    /// `access.request`, kept for old clients: always granted.
    pub(super) fn access_class_method(
        &mut self,
        channel: u16,
        m: access::AMQPMethod,
    ) -> AmqpResult<()> {
        match m {
            access::AMQPMethod::Request(_) => {
                self.send_method(
                    channel,
                    &AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
                Ok(())
            }
            other => Err(not_from_client(&AMQPClass::Access(other))),
        }
    }
}
