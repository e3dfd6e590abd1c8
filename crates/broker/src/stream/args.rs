//! What a stream's declaration may carry, as RabbitMQ decides it
//! (`rabbit_stream_queue:declare` and the argument checks of its queue
//! type): durable, not exclusive, not auto-delete, and none of the
//! arguments a log cannot honour (TTL, dead-lettering, priorities, length
//! in messages, overflow, delivery limit, expiry, single active consumer).

use berth_protocol::FieldTable;

use crate::error::{AmqpError, AmqpResult};

/// Arguments a stream refuses with 406, as RabbitMQ does.
pub const REFUSED_ARGUMENTS: &[&str] = &[
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-priority",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-delivery-limit",
    "x-single-active-consumer",
    "x-queue-mode",
];

/// Refuses the first argument a stream does not support.
pub fn check_supported(queue: &str, vhost: &str, table: &FieldTable) -> AmqpResult<()> {
    match REFUSED_ARGUMENTS
        .iter()
        .find(|k| table.inner().contains_key(**k))
    {
        Some(key) => Err(AmqpError::precondition_failed(format!(
            "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}'"
        ))),
        None => Ok(()),
    }
}

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
