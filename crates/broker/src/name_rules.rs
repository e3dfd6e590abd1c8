//! The one rule for the names and keys an entrance accepts: exchange and
//! queue names, routing keys (of a publish, a binding,
//! `x-dead-letter-routing-key`) and dead-letter exchange names must fit
//! an AMQP shortstr, as they must on the wire.
//!
//! Invariants:
//! - A name this module accepts is stored and restored unchanged: the
//!   message payload's u8 lengths (docs/FORMAT.md, "Message payload")
//!   hold it whole, and the metadata keys hold any bytes (`meta/key.rs`).
//!   Over AMQP a name cannot break the rule (the frame's u8 length); the
//!   HTTP API, definitions and policies are where it is enforced.
//! - Any UTF-8 is accepted, a zero byte included, as RabbitMQ accepts it.

use crate::error::{AmqpError, AmqpResult};
use crate::limits::SHORTSTR_BYTES_MAX;

/// Why `value` cannot be an AMQP shortstr, if it cannot.
pub fn shortstr_problem(value: &str) -> Option<String> {
    (value.len() > SHORTSTR_BYTES_MAX).then(|| {
        format!(
            "{} bytes long, but at most {SHORTSTR_BYTES_MAX} bytes of UTF-8 fit an AMQP shortstr; shorten it",
            value.len()
        )
    })
}

/// Refuses `value` (the `what` of an operation, e.g. `routing key`) with
/// PRECONDITION_FAILED if it does not fit a shortstr.
pub fn check_shortstr(what: &str, value: &str) -> AmqpResult<()> {
    match shortstr_problem(value) {
        None => Ok(()),
        Some(why) => Err(AmqpError::precondition_failed(format!("{what} is {why}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortstr_is_at_most_255_bytes_of_any_utf8() {
        assert!(check_shortstr("queue name", &"a".repeat(255)).is_ok());
        assert!(check_shortstr("queue name", "odd\0name").is_ok());
        // 85 three-byte characters: 255 bytes.
        assert!(check_shortstr("queue name", &"€".repeat(85)).is_ok());
        let e = check_shortstr("queue name", &"€".repeat(86)).unwrap_err();
        assert_eq!(
            e.reply_text(),
            "PRECONDITION_FAILED - queue name is 258 bytes long, but at most 255 bytes of UTF-8 fit an AMQP shortstr; shorten it"
        );
    }
}
