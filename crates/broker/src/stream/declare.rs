//! What a stream's declaration may be, as RabbitMQ decides it
//! (`rabbit_stream_queue:declare`): durable, not exclusive, not
//! auto-delete. Its arguments are checked with the others
//! (`args.rs`, `STREAM_REFUSED_ARGUMENTS`).

use crate::error::{AmqpError, AmqpResult};

/// Refuses the queue properties a stream cannot have, with RabbitMQ's text.
pub fn check_properties(
    queue: &str,
    vhost: &str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> AmqpResult<()> {
    let property = if auto_delete {
        "auto-delete"
    } else if exclusive {
        "exclusive-owner"
    } else if !durable {
        "non-durable"
    } else {
        return Ok(());
    };
    Err(AmqpError::precondition_failed(format!(
        "invalid property '{property}' for queue '{queue}' in vhost '{vhost}'"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_are_refused_with_rabbitmq_texts() {
        let t = |d, e, a| check_properties("s", "/", d, e, a).unwrap_err().text;
        assert!(t(false, false, false).contains("invalid property 'non-durable' for queue 's'"));
        assert!(t(true, true, false).contains("invalid property 'exclusive-owner'"));
        assert!(t(true, false, true).contains("invalid property 'auto-delete'"));
        assert!(check_properties("s", "/", true, false, false).is_ok());
    }
}
