//! What `basic.consume` on a stream needs, as RabbitMQ checks it
//! (`rabbit_stream_queue:consume`): a per-consumer prefetch, manual
//! acknowledgements, no channel-wide (global) prefetch, and a valid
//! `x-stream-offset`.

use berth_protocol::FieldTable;

use crate::error::{AmqpError, AmqpResult};

use super::offset::{self, OffsetSpec};

/// Refuses a consume RabbitMQ refuses; else where the consumer starts.
pub fn check(
    queue: &str,
    vhost: &str,
    no_ack: bool,
    prefetch: u16,
    global_prefetch: u16,
    arguments: &FieldTable,
    now_unix_ms: u64,
) -> AmqpResult<OffsetSpec> {
    let rs = format!("queue '{queue}' in vhost '{vhost}'");
    if prefetch == 0 {
        return Err(AmqpError::precondition_failed(format!(
            "consumer prefetch count is not set for '{rs}'"
        )));
    }
    if no_ack {
        return Err(AmqpError::not_implemented(format!(
            "automatic acknowledgement not supported by stream queues {rs}"
        )));
    }
    if global_prefetch > 0 {
        return Err(AmqpError::not_implemented(format!(
            "{rs} does not support global qos"
        )));
    }
    offset::parse(queue, vhost, arguments, now_unix_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_refusals() {
        let none = FieldTable::default();
        let e = check("s", "/", false, 0, 0, &none, 0).unwrap_err();
        assert_eq!(e.reply_code, 406);
        assert!(e
            .text
            .contains("consumer prefetch count is not set for 'queue 's' in vhost '/''"));
        assert_eq!(
            check("s", "/", true, 10, 0, &none, 0)
                .unwrap_err()
                .reply_code,
            540
        );
        assert_eq!(
            check("s", "/", false, 10, 5, &none, 0)
                .unwrap_err()
                .reply_code,
            540
        );
        assert_eq!(
            check("s", "/", false, 10, 0, &none, 0).unwrap(),
            OffsetSpec::Next
        );
    }
}
