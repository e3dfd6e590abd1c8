//! The one place where the server turns what went wrong into AMQP
//! exceptions: frame, decode and content errors become [`AmqpError`]s with
//! the spec's reply codes; an error closes its channel or the whole
//! connection as its code says (the broker's `is_connection_error`); the
//! `channel.close` / `connection.close` frames are sent from here.
//!
//! Invariants:
//! - A soft error (a channel exception) never ends the connection; a hard
//!   one always does, after `connection.close`.
//! - An exception about a method names that method's class and method ids,
//!   taken from the protocol crate's named constants.

use berth_broker::AmqpError;
use berth_protocol::codec::{DecodeError, CLASS_BASIC, METHOD_BASIC_PUBLISH};
use berth_protocol::content::ContentError;
use berth_protocol::frame::FrameError;
use berth_protocol::methods::{channel as chan, connection as conn};
use berth_protocol::reply::{FRAME_ERROR, SYNTAX_ERROR, UNEXPECTED_FRAME};
use berth_protocol::AMQPClass;

use super::{ChanState, Conn};

/// Why a connection ended.
#[derive(Debug)]
pub(super) enum End {
    /// Closed cleanly (by either side's close handshake or EOF).
    Done,
    /// The peer sent `connection.close`: `close-ok` is due once the
    /// channels are closed, then the socket is drained until the peer
    /// closes it.
    PeerClose,
    /// A connection exception to report to the peer.
    Error(AmqpError),
    /// The socket failed; nothing more can be said to the peer.
    Io(std::io::Error),
}

impl From<std::io::Error> for End {
    fn from(e: std::io::Error) -> Self {
        End::Io(e)
    }
}

impl From<AmqpError> for End {
    fn from(e: AmqpError) -> Self {
        End::Error(e)
    }
}

/// A frame that is not a valid frame: 501 FRAME_ERROR.
pub(super) fn frame_error(e: &FrameError) -> AmqpError {
    AmqpError::new(FRAME_ERROR, e.to_string())
}

/// A method or content header that does not parse: 540 for a method we do
/// not know, 502 for malformed arguments.
pub(super) fn decode_error(e: &DecodeError) -> AmqpError {
    match e {
        DecodeError::UnknownMethod {
            class_id,
            method_id,
        } => AmqpError::not_implemented(e.to_string()).during(*class_id, *method_id),
        DecodeError::Malformed {
            class_id,
            method_id,
        } => AmqpError::new(SYNTAX_ERROR, e.to_string()).during(*class_id, *method_id),
        _ => AmqpError::new(SYNTAX_ERROR, e.to_string()),
    }
}

/// A content frame that does not fit the publish being assembled. Only an
/// oversized message is a channel exception (406, as RabbitMQ); the rest
/// breaks the frame sequence and ends the connection.
pub(super) fn content_error(e: ContentError) -> AmqpError {
    match e {
        ContentError::Header(d) => decode_error(&d),
        ContentError::TooLarge { .. } => {
            AmqpError::precondition_failed(e.to_string()).during(CLASS_BASIC, METHOD_BASIC_PUBLISH)
        }
        ContentError::BodyOverrun { .. } => AmqpError::new(FRAME_ERROR, e.to_string()),
        ContentError::MethodMidContent { .. } => AmqpError::new(UNEXPECTED_FRAME, e.to_string())
            .during(CLASS_BASIC, METHOD_BASIC_PUBLISH),
        ContentError::WrongClass { .. }
        | ContentError::NoPublish { .. }
        | ContentError::OutOfOrder { .. }
        | ContentError::WrongChannel { .. }
        | ContentError::NotContent { .. } => AmqpError::new(UNEXPECTED_FRAME, e.to_string()),
    }
}

/// A method a server sends, or one berth does not take from a client.
pub(super) fn not_from_client(m: &AMQPClass) -> AmqpError {
    AmqpError::command_invalid(format!(
        "method {}.{} is not valid from a client",
        m.get_amqp_class_id(),
        m.get_amqp_method_id()
    ))
}

impl Conn {
    /// Raises `e` on `channel`: a channel exception closes the channel and
    /// the connection goes on; a connection exception ends the connection.
    pub(super) fn raise(&mut self, channel: u16, e: AmqpError) -> Result<(), End> {
        if e.is_connection_error() {
            Err(e.into())
        } else {
            self.channel_exception(channel, e);
            Ok(())
        }
    }

    /// Closes a channel with an exception: the broker side is cleaned up
    /// at once; the slot waits for the client's `close-ok`.
    pub(super) fn channel_exception(&mut self, channel: u16, e: AmqpError) {
        tracing::debug!(peer = %self.peer, channel, code = e.reply_code, "channel error: {}", e.reply_text());
        if let Some(slot) = self.channels.get_mut(&channel) {
            slot.state = ChanState::Closing;
            if let Some(c) = &slot.confirms {
                c.close();
            }
            slot.content.reset();
            slot.assembling.set(0);
            slot.ch.close(Self::now());
        }
        self.send_method(
            channel,
            &AMQPClass::Channel(chan::AMQPMethod::Close(chan::Close {
                reply_code: e.reply_code,
                reply_text: e.reply_text().into(),
                class_id: e.class_id,
                method_id: e.method_id,
            })),
        );
    }

    /// Sends `connection.close`; the caller then waits (bounded) for
    /// `close-ok`.
    pub(super) fn send_connection_close(&self, e: &AmqpError) {
        self.send_method(
            0,
            &AMQPClass::Connection(conn::AMQPMethod::Close(conn::Close {
                reply_code: e.reply_code,
                reply_text: e.reply_text().into(),
                class_id: e.class_id,
                method_id: e.method_id,
            })),
        );
    }
}
