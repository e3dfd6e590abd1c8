//! RabbitMQ's stream protocol on `net.stream_listen` (5552 by
//! convention), over the same streams as AMQP 0-9-1's
//! `x-queue-type: stream` (docs/STREAMS.md, "The stream protocol"), so
//! RabbitMQ's stream clients (Java, Go, Rust, .NET, Python `rstream`)
//! work unchanged and read what AMQP clients wrote, and the reverse.
//!
//! Files, one idea each: [`frame`] (bytes to requests and responses to
//! bytes, sans-I/O), [`chunk`] (a Deliver frame's osiris chunk and its
//! CRC), [`message`] (AMQP 1.0 messages to the broker's 0-9-1 ones and
//! back), [`login`] (SASL PLAIN with berth's users), [`connection`] (the
//! task that serves one client, its handshake and heartbeats),
//! `commands` (what each command of an open connection does),
//! [`publish`] (publishers, deduplication and confirms), [`outlet`]
//! (subscriptions: deliveries cut into chunks under credit),
//! [`tracking`] (stored offsets and publisher sequences, on disk),
//! [`accept`] (the accept loop) and [`follower`] (a cluster follower
//! turns clients away).
//!
//! Invariants:
//! - The stream side reaches the broker only through what an AMQP
//!   connection uses (`berth_broker::channel`, the vhost's declare and
//!   delete calls, `crate::permissions::authorise`, `crate::auth::login`),
//!   so both protocols get the same rules, permission verdicts and
//!   durability: one stored copy of each message.
//! - A PublishConfirm is sent only after every journal write its message
//!   needed completed (fdatasync under `store.sync = always`).
//! - Nothing a client sends can panic the server or touch another client:
//!   a bad frame ends only its own connection, with a Close naming the
//!   response code.

pub mod accept;
pub mod chunk;
mod commands;
pub mod connection;
pub mod follower;
pub mod frame;
pub mod login;
pub mod message;
pub mod outlet;
pub mod publish;
pub mod tracking;
