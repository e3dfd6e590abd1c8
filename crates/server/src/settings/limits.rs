//! The settings of `[limits]`, `[auth]` and `[log]`: the bounds the broker
//! enforces and who may log in. Fixed bounds and defaults have their home
//! in [`crate::limits`] (the server's) and [`berth_broker::limits`] (the
//! broker's); this table names them.

use super::slot::{field, list, non_empty, one, Refusal};
use super::Setting;
use crate::limits;
use crate::mechanism::Mechanism;
use berth_broker::limits as broker;

pub(super) static LIMITS: &[Setting] = &[
    Setting {
        key: "limits.frame_size_bytes_max",
        flag: "frame-size-bytes-max",
        value_name: "BYTES",
        default_note: "",
        doc: "`frame_max` proposed and enforced (min 4096). Larger frames close the connection \
              with 501.",
        slot: &one(field!(limits.frame_size_bytes_max), || {
            limits::DEFAULT_FRAME_SIZE_BYTES_MAX
        })
        .check(|f| {
            if *f < berth_protocol::frame::FRAME_MIN_SIZE {
                return Err(Refusal::new(
                    f.to_string(),
                    "must be at least 4096 (the AMQP minimum)",
                ));
            }
            Ok(())
        }),
    },
    Setting {
        key: "limits.channels_per_connection_max",
        flag: "channels-per-connection-max",
        value_name: "N",
        default_note: "",
        doc: "`channel_max` proposed and enforced",
        slot: &one(field!(limits.channels_per_connection_max), || {
            limits::DEFAULT_CHANNELS_PER_CONNECTION_MAX
        })
        .check(|n| {
            if *n == 0 {
                return Err(Refusal::new("0", "must be at least 1"));
            }
            Ok(())
        }),
    },
    Setting {
        key: "limits.message_size_bytes_max",
        flag: "message-size-bytes-max",
        value_name: "BYTES",
        default_note: "128 MiB",
        doc: "largest message body; larger publishes close the channel with 406. With \
              `limits.frame_size_bytes_max` it must leave every message room in one store \
              record (129 MiB less 64 KiB): a larger sum is refused at startup",
        slot: &one(field!(limits.message_size_bytes_max), || {
            limits::DEFAULT_MESSAGE_SIZE_BYTES_MAX
        }),
    },
    Setting {
        key: "limits.consumer_timeout_ms",
        flag: "consumer-timeout-ms",
        value_name: "MS",
        default_note: "30 min",
        doc: "a delivery unacked for longer closes its channel with 406 PRECONDITION_FAILED \
              (as RabbitMQ's `consumer_timeout`); a queue's `x-consumer-timeout` overrides \
              it. 0 = never.",
        slot: &one(field!(limits.consumer_timeout_ms), || {
            limits::DEFAULT_CONSUMER_TIMEOUT_MS
        }),
    },
    Setting {
        key: "limits.connection_output_bytes_max",
        flag: "connection-output-bytes-max",
        value_name: "BYTES",
        default_note: "4 MiB",
        doc: "output buffered for one connection before queues stop delivering to its \
              consumers; at twice this the connection stops being read too (so its \
              `basic.return`s, confirms and replies stop growing): a client that does not \
              read never makes the broker buffer without bound",
        slot: &one(field!(limits.connection_output_bytes_max), || {
            limits::DEFAULT_CONNECTION_OUTPUT_BYTES_MAX
        }),
    },
    Setting {
        key: "limits.connections_max",
        flag: "connections-max",
        value_name: "N",
        default_note: "",
        doc: "open connections allowed (0 = limited only by file descriptors, two per plain \
              connection and one per TLS connection; the soft limit is raised to the hard \
              limit at startup)",
        slot: &one(field!(limits.connections_max), || 0),
    },
    Setting {
        key: "limits.memory_high_watermark_bytes",
        flag: "memory-high-watermark-bytes",
        value_name: "BYTES",
        default_note: "= 40% of RAM",
        doc: "memory in use (message bytes, plus every connection's buffered output and the \
              bodies of publishes still arriving) above which publishing connections are \
              blocked (`connection.blocked`) until consumers drain them",
        slot: &one(field!(limits.memory_high_watermark_bytes), || 0),
    },
    Setting {
        key: "limits.disk_free_bytes_min",
        flag: "disk-free-bytes-min",
        value_name: "BYTES",
        default_note: "50 MB, RabbitMQ's `disk_free_limit`",
        doc: "free space on any data directory's filesystem (checked every 250 ms) below which \
              publishing connections are blocked (`connection.blocked`, reason `low on disk`) \
              until space returns; nothing stored is touched. 0 = off.",
        slot: &one(field!(limits.disk_free_bytes_min), || {
            limits::DEFAULT_DISK_FREE_BYTES_MIN
        }),
    },
    Setting {
        key: "limits.queues_max",
        flag: "queues-max",
        value_name: "N",
        default_note: "",
        doc: "queues per vhost (RabbitMQ's `max-queues` vhost limit); one more is refused with \
              406 PRECONDITION_FAILED `cannot declare queue 'q' in vhost '/': vhost queue \
              limit (N) is reached`",
        slot: &one(field!(limits.queues_max), || broker::QUEUES_MAX_DEFAULT),
    },
    Setting {
        key: "limits.exchanges_max",
        flag: "exchanges-max",
        value_name: "N",
        default_note: "",
        doc: "exchanges per vhost, the standard `amq.*` ones included; one more is refused \
              with 406",
        slot: &one(field!(limits.exchanges_max), || {
            broker::EXCHANGES_MAX_DEFAULT
        }),
    },
    Setting {
        key: "limits.bindings_per_exchange_max",
        flag: "bindings-per-exchange-max",
        value_name: "N",
        default_note: "",
        doc: "bindings whose source is one exchange; one more is refused with 406",
        slot: &one(field!(limits.bindings_per_exchange_max), || {
            broker::BINDINGS_PER_EXCHANGE_MAX_DEFAULT
        }),
    },
    Setting {
        key: "limits.consumers_per_channel_max",
        flag: "consumers-per-channel-max",
        value_name: "N",
        default_note: "",
        doc: "consumers on one channel (RabbitMQ's `consumer_max_per_channel`); one more is \
              refused with 406 `reached maximum (N) of consumers per channel`",
        slot: &one(field!(limits.consumers_per_channel_max), || {
            broker::CONSUMERS_PER_CHANNEL_MAX_DEFAULT
        }),
    },
    Setting {
        key: "limits.delayed_in_memory_per_exchange_max",
        flag: "delayed-in-memory-per-exchange-max",
        value_name: "N",
        default_note: "",
        doc: "messages one delayed exchange holds in memory only (transient ones, or any of a \
              non-durable exchange; stored ones do not count); one more publish is refused \
              with 406 PRECONDITION_FAILED (docs/DELAYED.md)",
        slot: &one(field!(limits.delayed_in_memory_per_exchange_max), || {
            broker::DELAYED_IN_MEMORY_PER_EXCHANGE_MAX_DEFAULT
        }),
    },
];

pub(super) static AUTH: &[Setting] = &[
    Setting {
        key: "auth.vhosts",
        flag: "vhost",
        value_name: "NAME",
        default_note: "",
        doc: "vhosts created (durably) at startup if missing; more are created and deleted at \
              runtime through the HTTP API or `berth vhost`. A vhost deleted at runtime that \
              is still listed here comes back at the next start.",
        slot: &list(field!(auth.vhosts), || vec!["/".into()])
            .check(|v| non_empty(v, "at least one vhost is needed")),
    },
    Setting {
        key: "auth.default_user",
        flag: "default-user",
        value_name: "NAME",
        default_note: "",
        doc: "user created once, when the store is new: tag `administrator`, all permissions \
              on the first of `auth.vhosts` (RabbitMQ's `default_user`). Empty = create none. \
              Users are then managed with the HTTP API or `berth user` (see \
              [SECURITY.md](SECURITY.md)).",
        slot: &one(field!(auth.default_user), || "guest".into()),
    },
    Setting {
        key: "auth.default_pass",
        flag: "default-pass",
        value_name: "PASSWORD",
        default_note: "",
        doc: "that user's password",
        slot: &one(field!(auth.default_pass), || "guest".into()),
    },
    Setting {
        key: "auth.loopback_users",
        flag: "loopback-user",
        value_name: "NAME",
        default_note: "",
        doc: "users allowed to log in from loopback addresses only (AMQP and HTTP); \
              `--loopback-user none` = nobody is restricted",
        slot: &list(field!(auth.loopback_users), || vec!["guest".into()]).cleared_by("none"),
    },
    Setting {
        key: "auth.login_failures_per_s_max",
        flag: "login-failures-per-s-max",
        value_name: "N",
        default_note: "",
        doc: "login budget of one source address (an IPv4 address or an IPv6 /64), shared by \
              all its AMQP connections and HTTP requests: N logins at once, then N per \
              second; a login that succeeds gives its turn back. Beyond it an attempt waits \
              for its turn before its password is checked, and is refused unchecked when \
              the turns are booked more than 5 s ahead (`LOGIN_WAIT_MS_MAX`). See \
              [SECURITY.md](SECURITY.md#logins)",
        slot: &one(field!(auth.login_failures_per_s_max), || {
            limits::DEFAULT_LOGIN_FAILURES_PER_S_MAX
        })
        .check(|n| {
            if *n == 0 {
                return Err(Refusal::new(
                    "0",
                    "must be at least 1 (logins per second from one address)",
                ));
            }
            Ok(())
        }),
    },
    Setting {
        key: "auth.mechanisms",
        flag: "mechanism",
        value_name: "NAME",
        default_note: "",
        doc: "login mechanisms offered, in this order (RabbitMQ's `auth_mechanisms`): `PLAIN`, \
              `AMQPLAIN`, `EXTERNAL`. `EXTERNAL` (the user named by the client's TLS \
              certificate) is offered only when listed, and then only to a connection whose \
              verified certificate names a user; a client that picks a mechanism it was not \
              offered is refused",
        slot: &list(field!(auth.mechanisms), || {
            vec![Mechanism::Plain, Mechanism::Amqplain]
        })
        .check(|list| distinct_mechanisms(list)),
    },
];

/// At least one mechanism, none twice.
fn distinct_mechanisms(list: &[Mechanism]) -> Result<(), Refusal> {
    non_empty(list, "at least one login mechanism is needed")?;
    for (i, m) in list.iter().enumerate() {
        if list[..i].contains(m) {
            return Err(Refusal::new(m.name(), "listed twice"));
        }
    }
    Ok(())
}

pub(super) static LOG: &[Setting] = &[Setting {
    key: "log.log_level",
    flag: "log-level",
    value_name: "LEVEL",
    default_note: "",
    doc: "`error`, `warn`, `info`, `debug`, `trace` or a tracing filter; `RUST_LOG` overrides \
          it. Logs go to stderr. A cluster member logs one warning when a peer becomes \
          unreachable and one line when it answers again; openraft's report of every failed \
          attempt in between is left out unless the filter names `openraft` (e.g. \
          `info,openraft=warn`). See CLUSTERING.md.",
    slot: &one(field!(log.log_level), || "info".into()),
}];
