//! AMQP 0-9-1 frames and methods, sans-I/O: bytes in, typed values out, and
//! back. No sockets, no async.
//!
//! Method arguments use the `amq-protocol` crate's generated types, re-exported
//! here so upper layers name one crate; the per-message hot path is coded by
//! hand in [`codec`]. [`content`] assembles a publish's content frames into
//! one message.

pub mod codec;
pub mod content;
pub mod frame;

pub use amq_protocol::protocol::{self as methods, basic::AMQPProperties, AMQPClass};
pub use amq_protocol::types::{
    AMQPValue, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};

/// AMQP 0-9-1 reply codes used by berth, named as in the spec.
pub mod reply {
    pub const REPLY_SUCCESS: u16 = 200;
    pub const CONTENT_TOO_LARGE: u16 = 311;
    pub const NO_ROUTE: u16 = 312;
    pub const NO_CONSUMERS: u16 = 313;
    pub const CONNECTION_FORCED: u16 = 320;
    pub const INVALID_PATH: u16 = 402;
    pub const ACCESS_REFUSED: u16 = 403;
    pub const NOT_FOUND: u16 = 404;
    pub const RESOURCE_LOCKED: u16 = 405;
    pub const PRECONDITION_FAILED: u16 = 406;
    pub const FRAME_ERROR: u16 = 501;
    pub const SYNTAX_ERROR: u16 = 502;
    pub const COMMAND_INVALID: u16 = 503;
    pub const CHANNEL_ERROR: u16 = 504;
    pub const UNEXPECTED_FRAME: u16 = 505;
    pub const RESOURCE_ERROR: u16 = 506;
    pub const NOT_ALLOWED: u16 = 530;
    pub const NOT_IMPLEMENTED: u16 = 540;
    pub const INTERNAL_ERROR: u16 = 541;

    /// The spec's name of a reply code, as RabbitMQ prefixes reply texts.
    pub fn name(code: u16) -> &'static str {
        match code {
            REPLY_SUCCESS => "OK",
            CONTENT_TOO_LARGE => "CONTENT_TOO_LARGE",
            NO_ROUTE => "NO_ROUTE",
            NO_CONSUMERS => "NO_CONSUMERS",
            CONNECTION_FORCED => "CONNECTION_FORCED",
            INVALID_PATH => "INVALID_PATH",
            ACCESS_REFUSED => "ACCESS_REFUSED",
            NOT_FOUND => "NOT_FOUND",
            RESOURCE_LOCKED => "RESOURCE_LOCKED",
            PRECONDITION_FAILED => "PRECONDITION_FAILED",
            FRAME_ERROR => "FRAME_ERROR",
            SYNTAX_ERROR => "SYNTAX_ERROR",
            COMMAND_INVALID => "COMMAND_INVALID",
            CHANNEL_ERROR => "CHANNEL_ERROR",
            UNEXPECTED_FRAME => "UNEXPECTED_FRAME",
            RESOURCE_ERROR => "RESOURCE_ERROR",
            NOT_ALLOWED => "NOT_ALLOWED",
            NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
            _ => "INTERNAL_ERROR",
        }
    }
}
