//! The broker: vhosts, exchanges, bindings, queues, consumers, acks, TTL,
//! dead-lettering and limits. It owns the rules of AMQP 0-9-1 as RabbitMQ
//! implements them, and does no networking: the server feeds it decoded
//! methods and gives it an [`channel::Outlet`] to write deliveries to.
//!
//! Persistent messages in durable queues go to a [`durable::Journal`]; a
//! deep queue keeps only compact entries for them and reads bodies back
//! from the journal when it delivers them.
//!
//! Modules depend on each other one way only (checked by
//! `tests/layering.rs`): a queue sees its surroundings through
//! [`queue::QueueEnv`] and [`queue::QueueOwner`], and delivers through
//! [`queue::ConsumerChannel`], which the channel implements.

pub mod access;
pub mod args;
mod broker;
pub mod channel;
pub mod clock;
pub mod counters;
pub mod dead_letter;
pub mod delayed;
pub mod delayed_args;
pub mod durable;
pub mod error;
pub mod events;
pub mod exchange;
pub mod interval;
pub mod limits;
pub mod message;
pub mod meta;
pub mod name_rules;
mod paging;
pub mod password;
pub mod policy;
pub mod queue;
pub mod quorum_args;
mod ready;
mod restore;
pub mod routing;
mod server_named;
pub mod stream;
pub mod timers;
pub mod totals;
pub mod vhost;

pub use broker::Broker;
pub use error::{AmqpError, AmqpResult};
pub use restore::{Recovered, RestoreReport, StoredBody};
