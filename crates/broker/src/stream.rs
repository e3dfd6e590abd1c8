//! Streams (`x-queue-type: stream`): append-only queues that any number of
//! consumers read from any offset, with RabbitMQ's semantics over AMQP
//! 0-9-1 (docs/STREAMS.md).
//!
//! A stream lives in its queue's log group like every other queue: each
//! message is one journal publish record whose payload is a stream entry
//! ([`entry`]: offset, timestamp, message). Consuming never removes
//! anything; retention ([`retention`]) removes whole logical segments from
//! the head. This module holds the pure parts (argument rules, offsets,
//! the entry codec, the in-memory log); `queue/stream.rs` joins them to a
//! queue's lock, its consumers and the journal.

pub mod chunks;
pub mod consume;
pub mod declare;
pub mod entry;
pub mod log;
pub mod offset;
pub mod retention;
