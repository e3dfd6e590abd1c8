//! Every limit and default of the broker core, with its unit in its name:
//! the one place to look a number up or change it.

use crate::error::{AmqpError, AmqpResult};

/// Default of `store.queue_resident_messages_max`: ready messages per queue
/// whose bodies stay in memory; beyond it, bodies already written to the
/// journal are read back when needed.
pub const RESIDENT_MESSAGES_MAX_DEFAULT: usize = 4096;

/// Default of `store.queue_resident_bytes_max`: body bytes per queue that
/// stay in memory, whatever the count above allows (4096 messages of 16 KB;
/// larger messages page out sooner, so a backlog of large messages does not
/// hold a leader's memory).
pub const RESIDENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// Bytes of an AMQP shortstr: every exchange and queue name and routing
/// key (`name_rules.rs` holds the HTTP API, definitions and policies to it too).
pub const SHORTSTR_BYTES_MAX: usize = 255;

/// Bytes a stored message payload holds beside the body and the
/// properties: exchange and routing key (shortstrs, at most 255 bytes
/// each, with their length bytes) and the properties length (docs/FORMAT.md,
/// "Message payload"). The properties fit in one content-header frame.
pub const MESSAGE_PAYLOAD_NAMES_BYTES_MAX: u64 = 1 + 255 + 1 + 255 + 4;

/// Delayed messages one delayed exchange routes per timer turn once they
/// are due; the rest follow on the next turns (a burst coming due never
/// holds the timer tick for long).
pub const DELAYED_ROUTED_PER_TURN_MAX: usize = 10_000;

/// A due delayed message whose write completed but which the journal has
/// not written yet (a cluster's completion is the commit; the member's
/// store writes the record when it applies the entry) is read again this
/// much later.
pub const DELAYED_UNWRITTEN_RETRY_MS: u64 = 10;

/// The delivery limit of a queue with delayed retry that sets none
/// (`x-delivery-limit`), as RabbitMQ 4's quorum queues default it.
pub const DELAYED_RETRY_DELIVERY_LIMIT_DEFAULT: u64 = 20;

/// Stored delayed messages whose due times (8 bytes each, not their
/// bodies) are read back together at restore.
pub const RESTORE_READ_BATCH_MESSAGES: usize = 65_536;

/// Restored messages whose bodies stay on disk put back into their queue
/// under one lock: the queue is scheduled and reported once per run, not
/// per message (10,000,000 messages at a restart).
pub const RESTORE_PAGED_RUN_MESSAGES: usize = 65_536;

/// Restored messages at a queue's head whose stored times (when each was
/// enqueued, its own `expiration`) are read at once to learn when they
/// expire: 18 bytes each, in one read where they lie close together
/// (`queue/times.rs`).
pub const RESTORED_TIMES_READ_MAX: usize = 64;

/// Threads that put queues' messages back at a restart (at most one per
/// core): queues are independent, so a restart uses the cores it has.
pub const RESTORE_THREADS_MAX: usize = 8;

/// Enqueues between two paging scans of a queue past its resident window.
pub const PAGE_SCAN_EVERY_MESSAGES: u64 = 64;

/// Paged-out messages read back together when a queue needs one…
pub const READ_AHEAD_MESSAGES: usize = 64;
/// …or fewer, so that their bodies hold at most this many bytes (the one
/// needed is read whatever its size): large messages are read back a few
/// at a time, not 64 of them into memory at once.
pub const READ_AHEAD_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// Default of a stream's `x-stream-max-segment-size-bytes`: a logical
/// segment (what retention removes whole) closes before it passes this
/// many stored bytes (RabbitMQ's default, 500 MB).
pub const STREAM_SEGMENT_BYTES_DEFAULT: u64 = 500_000_000;

/// A stream's newest messages kept in memory until the journal can read
/// them back: past twice this many, the written ones are let go.
pub const STREAM_TAIL_MESSAGES_MAX: usize = 256;

/// Stream messages read back from the journal together for a reader that
/// is behind (one chunk, which every reader at those offsets shares).
pub const STREAM_READ_AHEAD_MESSAGES: usize = 256;

/// About how many stored bytes one read-ahead batch of a stream reader
/// takes (fewer messages when they are large, at least one).
pub const STREAM_READ_AHEAD_BYTES: u64 = 1 << 20;

/// Stored bytes of the read-back chunks a stream keeps for its other
/// readers (`stream/chunks.rs`), per stream being read: readers that drift
/// apart by up to this much still read each stored byte once (PerfTest's
/// ten readers of a 1 KB stream drift further than 4 MiB apart).
pub const STREAM_READ_CHUNKS_BYTES_MAX: u64 = 32 << 20;

/// Largest gap of offsets a stream's restart accepts between two stored
/// entries (writes lost before a crash are at most what was in flight);
/// an entry past a larger one is taken for damage, reported and skipped,
/// so a corrupt offset cannot make the offset map grow without bound.
pub const STREAM_RESTORE_GAP_OFFSETS_MAX: u64 = 1 << 20;

/// How often a stream with `max-age` checks its retention when nothing is
/// published to it.
pub const STREAM_RETENTION_CHECK_MS: u64 = 1000;

/// Ready messages above which a queue whose consumers are busy counts as
/// backlogged: they are not keeping up, and publishers to it are slowed
/// down (flow control) so the backlog, and the latency it adds, stays
/// bounded. A queue whose consumers deliver nothing (all stuck at their
/// prefetch limit) is not backlogged: it grows, as in RabbitMQ.
pub const FLOW_READY_MAX: usize = 256;

/// A queue whose last delivery is older than this has no busy consumers.
pub const FLOW_ACTIVE_MS: u64 = 100;

/// Length of the random tail of a server-named queue (`amq.gen-…`), in
/// characters, as RabbitMQ names them.
pub const SERVER_NAMED_TAIL_CHARS: usize = 22;

/// Publishes, acks and nacks one open transaction may hold before
/// `tx.commit`; one more is refused with 406 (RabbitMQ has no such limit;
/// a transaction this large is a client bug or an attack).
pub const TX_OPERATIONS_MAX: usize = 65_536;

/// Default of `limits.queues_max` (per vhost). RabbitMQ's `max-queues`
/// vhost limit is unlimited by default; berth bounds it
/// (docs/ARCHITECTURE.md, invariant 3) far above what applications declare.
pub const QUEUES_MAX_DEFAULT: usize = 100_000;

/// Default of `limits.exchanges_max` (per vhost, the standard `amq.*`
/// exchanges included).
pub const EXCHANGES_MAX_DEFAULT: usize = 10_000;

/// Default of `limits.bindings_per_exchange_max`.
pub const BINDINGS_PER_EXCHANGE_MAX_DEFAULT: usize = 100_000;

/// Default of `limits.consumers_per_channel_max` (RabbitMQ's
/// `consumer_max_per_channel`, unlimited there by default).
pub const CONSUMERS_PER_CHANNEL_MAX_DEFAULT: usize = 4096;

/// Default of `limits.delayed_in_memory_per_exchange_max`: messages one
/// delayed exchange holds in memory only (transient ones, or any of a
/// non-durable exchange). Their bytes count towards the memory watermark
/// as every message's do; this bounds their number (~200 bytes each
/// besides the body).
pub const DELAYED_IN_MEMORY_PER_EXCHANGE_MAX_DEFAULT: usize = 1_000_000;

/// How many of each thing a client can make the broker hold. The server
/// sets them from `[limits]` (docs/CONFIG.md); going past one is refused
/// with 406 PRECONDITION_FAILED, as RabbitMQ refuses its `max-queues` and
/// `consumer_max_per_channel`, and nothing is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountLimits {
    pub queues_max: usize,
    pub exchanges_max: usize,
    pub bindings_per_exchange_max: usize,
    pub consumers_per_channel_max: usize,
    pub delayed_in_memory_per_exchange_max: usize,
}

impl Default for CountLimits {
    fn default() -> Self {
        Self {
            queues_max: QUEUES_MAX_DEFAULT,
            exchanges_max: EXCHANGES_MAX_DEFAULT,
            bindings_per_exchange_max: BINDINGS_PER_EXCHANGE_MAX_DEFAULT,
            consumers_per_channel_max: CONSUMERS_PER_CHANNEL_MAX_DEFAULT,
            delayed_in_memory_per_exchange_max: DELAYED_IN_MEMORY_PER_EXCHANGE_MAX_DEFAULT,
        }
    }
}

impl CountLimits {
    /// A new queue when the vhost has `queues` (RabbitMQ's text).
    pub fn check_new_queue(&self, queues: usize, name: &str, vhost: &str) -> AmqpResult<()> {
        if queues >= self.queues_max {
            return Err(AmqpError::precondition_failed(format!(
                "cannot declare queue '{name}' in vhost '{vhost}': vhost queue limit ({}) is reached (limits.queues_max)",
                self.queues_max
            )));
        }
        Ok(())
    }

    /// A new exchange when the vhost has `exchanges`.
    pub fn check_new_exchange(&self, exchanges: usize, name: &str, vhost: &str) -> AmqpResult<()> {
        if exchanges >= self.exchanges_max {
            return Err(AmqpError::precondition_failed(format!(
                "cannot declare exchange '{name}' in vhost '{vhost}': vhost exchange limit ({}) is reached (limits.exchanges_max)",
                self.exchanges_max
            )));
        }
        Ok(())
    }

    /// A binding from an exchange that has `bindings`.
    pub fn check_new_binding(
        &self,
        bindings: usize,
        exchange: &str,
        vhost: &str,
    ) -> AmqpResult<()> {
        if bindings >= self.bindings_per_exchange_max {
            return Err(AmqpError::precondition_failed(format!(
                "cannot bind to exchange '{exchange}' in vhost '{vhost}': it has {bindings} bindings, the limit (limits.bindings_per_exchange_max)"
            )));
        }
        Ok(())
    }

    /// A new consumer on a channel that has `consumers` (RabbitMQ's text).
    pub fn check_new_consumer(&self, consumers: usize) -> AmqpResult<()> {
        if consumers >= self.consumers_per_channel_max {
            return Err(AmqpError::precondition_failed(format!(
                "reached maximum ({}) of consumers per channel (limits.consumers_per_channel_max)",
                self.consumers_per_channel_max
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_count_is_refused_at_its_limit_and_not_below() {
        let l = CountLimits {
            queues_max: 2,
            exchanges_max: 3,
            bindings_per_exchange_max: 4,
            consumers_per_channel_max: 5,
            delayed_in_memory_per_exchange_max: 6,
        };
        assert!(l.check_new_queue(1, "q", "/").is_ok());
        let e = l.check_new_queue(2, "q", "/").unwrap_err();
        assert_eq!(e.reply_code, 406);
        assert!(
            e.reply_text().contains("vhost queue limit (2) is reached"),
            "{}",
            e.reply_text()
        );
        assert!(l.check_new_exchange(2, "x", "/").is_ok());
        assert!(l.check_new_exchange(3, "x", "/").is_err());
        assert!(l.check_new_binding(3, "x", "/").is_ok());
        assert!(l.check_new_binding(4, "x", "/").is_err());
        assert!(l.check_new_consumer(4).is_ok());
        assert!(l.check_new_consumer(5).is_err());
    }
}
