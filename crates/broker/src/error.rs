//! The one place where broker failures become AMQP exceptions.
//!
//! Every rule the broker enforces fails with an [`AmqpError`]: a reply code
//! from the spec and a text that tells the user what was wrong. Whether it
//! closes the channel or the whole connection follows from the code, as the
//! spec's "soft" and "hard" error classes say. The server fills in the class
//! and method ids of the method being handled.

use berth_protocol::reply::{self, *};

/// An AMQP channel or connection exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpError {
    pub reply_code: u16,
    /// Human text without the `CODE_NAME - ` prefix (added by [`Self::reply_text`]).
    pub text: String,
    /// Class id of the offending method; 0 when not tied to one.
    pub class_id: u16,
    /// Method id of the offending method; 0 when not tied to one.
    pub method_id: u16,
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reply_text())
    }
}

impl std::error::Error for AmqpError {}

impl AmqpError {
    pub fn new(reply_code: u16, text: impl Into<String>) -> Self {
        Self {
            reply_code,
            text: text.into(),
            class_id: 0,
            method_id: 0,
        }
    }

    /// Names the method the error is about, unless one is already named.
    #[must_use]
    pub fn during(mut self, class_id: u16, method_id: u16) -> Self {
        if self.class_id == 0 && self.method_id == 0 {
            self.class_id = class_id;
            self.method_id = method_id;
        }
        self
    }

    /// `reply-text` as RabbitMQ formats it: `NOT_FOUND - no queue 'q' in vhost '/'`.
    /// Truncated to fit a shortstr.
    pub fn reply_text(&self) -> String {
        let mut s = format!("{} - {}", reply::name(self.reply_code), self.text);
        if s.len() > 255 {
            let mut cut = 255;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        s
    }

    /// Whether this error closes the whole connection rather than a channel.
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self.reply_code,
            CONNECTION_FORCED
                | INVALID_PATH
                | FRAME_ERROR
                | SYNTAX_ERROR
                | COMMAND_INVALID
                | CHANNEL_ERROR
                | UNEXPECTED_FRAME
                | RESOURCE_ERROR
                | NOT_ALLOWED
                | NOT_IMPLEMENTED
                | INTERNAL_ERROR
        )
    }

    pub fn access_refused(text: impl Into<String>) -> Self {
        Self::new(ACCESS_REFUSED, text)
    }
    pub fn not_found(text: impl Into<String>) -> Self {
        Self::new(NOT_FOUND, text)
    }
    pub fn resource_locked(text: impl Into<String>) -> Self {
        Self::new(RESOURCE_LOCKED, text)
    }
    pub fn precondition_failed(text: impl Into<String>) -> Self {
        Self::new(PRECONDITION_FAILED, text)
    }
    pub fn command_invalid(text: impl Into<String>) -> Self {
        Self::new(COMMAND_INVALID, text)
    }
    pub fn channel_error(text: impl Into<String>) -> Self {
        Self::new(CHANNEL_ERROR, text)
    }
    pub fn not_allowed(text: impl Into<String>) -> Self {
        Self::new(NOT_ALLOWED, text)
    }
    pub fn not_implemented(text: impl Into<String>) -> Self {
        Self::new(NOT_IMPLEMENTED, text)
    }
    pub fn internal(text: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, text)
    }
}

/// Result of a broker operation.
pub type AmqpResult<T> = Result<T, AmqpError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_text_is_prefixed_with_the_code_name() {
        let e = AmqpError::not_found("no queue 'q' in vhost '/'");
        assert_eq!(e.reply_text(), "NOT_FOUND - no queue 'q' in vhost '/'");
    }

    #[test]
    fn hard_and_soft_errors_are_told_apart() {
        assert!(!AmqpError::precondition_failed("x").is_connection_error());
        assert!(!AmqpError::resource_locked("x").is_connection_error());
        assert!(AmqpError::channel_error("x").is_connection_error());
        assert!(AmqpError::not_implemented("x").is_connection_error());
    }

    #[test]
    fn long_reply_text_is_cut_to_a_shortstr() {
        let e = AmqpError::not_found("é".repeat(300));
        assert!(e.reply_text().len() <= 255);
    }
}
