//! MQTT 3.1.1 and 5.0 on `net.mqtt_listen`, mapped onto the broker as
//! RabbitMQ's MQTT plugin maps it (docs/MQTT.md): a client logs in as an
//! AMQP user of a vhost, a PUBLISH goes to `amq.topic` with its topic as
//! the routing key, and a subscription is a queue bound to `amq.topic`,
//! so AMQP and MQTT clients see each other's messages.
//!
//! Files, one idea each: [`accept`] (the accept loop of a plain, TLS or
//! WebSocket listener), [`stream`] (what carries a connection), [`ws`]
//! (the WebSocket upgrade and its pump), [`codec`] (bytes to packets and
//! back, sans-I/O, over the `mqtt5-protocol` crate), [`topic`] (topic
//! names and filters to routing and binding keys, and matching),
//! [`connect`] (a CONNECT up to its CONNACK), [`login`] (CONNECT to a
//! user and vhost, by password or client certificate), [`session`] (the
//! queues of a client's session), [`outlet`] (the broker's deliveries as
//! PUBLISH packets), [`publish`] (a client's PUBLISH to a broker message
//! and its PUBACK), [`properties`] (5.0 properties ↔ AMQP), [`retained`]
//! (the vhosts' retained messages), [`will`] (will messages),
//! [`clients`] (one connection per client id, kept QoS 2 state),
//! [`listed`] (the management API's entry), [`connection`] (the task
//! that serves one client) and `packets` (what each packet of a
//! connected client does).
//!
//! Invariants:
//! - The MQTT side reaches the broker only through what an AMQP
//!   connection uses (`berth_broker::channel`, the vhost's declare and
//!   bind calls, `crate::permissions::authorise`, `crate::auth::login`),
//!   so both protocols get the same rules, the same permission verdicts
//!   and the same durability.
//! - A PUBACK (QoS 1) or PUBREC (QoS 2) is sent only after every journal
//!   write its message needed completed (the AMQP publisher confirm's
//!   rule).
//! - Nothing a client sends can panic the server or touch another client:
//!   a bad packet ends only its own connection.

pub mod accept;
pub mod clients;
pub mod codec;
pub mod connect;
pub mod connection;
pub mod follower;
pub mod listed;
pub mod login;
pub mod outlet;
mod packets;
pub mod properties;
pub mod publish;
pub mod retained;
pub mod session;
pub mod stream;
pub mod topic;
pub mod will;
pub mod ws;

/// The exchange MQTT publishes to and binds subscriptions on, as
/// RabbitMQ's `mqtt.exchange` default.
pub const EXCHANGE: &str = "amq.topic";
