//! The settings of `[net]`, `[management]` and `[tls]`: where berth
//! listens and with which certificate.

use std::net::SocketAddr;

use super::slot::{field, list, maybe, non_empty, one, Refusal};
use super::Setting;
use crate::limits;

/// Checks that every listen address is `ADDRESS:PORT`; `example` is shown
/// to the operator with a refused one.
fn listen_addresses(addresses: &[String], example: &str) -> Result<(), Refusal> {
    match addresses.iter().find(|a| a.parse::<SocketAddr>().is_err()) {
        Some(bad) => Err(Refusal::new(
            bad.clone(),
            format!("expected ADDRESS:PORT, e.g. {example}"),
        )),
        None => Ok(()),
    }
}

pub(super) static NET: &[Setting] = &[
    Setting {
        key: "net.amqp_listen",
        flag: "amqp-listen",
        value_name: "ADDR:PORT",
        default_note: "",
        doc: "AMQP listen addresses; port 0 picks a free port. The broker logs one line \
              `berth ready amqp=ADDR[,ADDR...]` once all are bound.",
        slot: &list(field!(net.amqp_listen), || {
            vec!["0.0.0.0:5672".into(), "[::]:5672".into()]
        })
        .check(|a| {
            non_empty(a, "at least one address is needed")?;
            listen_addresses(a, "0.0.0.0:5672 or [::1]:5672")
        }),
    },
    Setting {
        key: "net.http_listen",
        flag: "http-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "HTTP listen addresses for the management API (RabbitMQ's paths and JSON, basic \
              auth with a stored user that has a management tag; see \
              [MANAGEMENT.md](MANAGEMENT.md) and [SECURITY.md](SECURITY.md)) and Prometheus \
              `/metrics`, `/metrics/per-object`. Off by default, as RabbitMQ's management \
              plugin; e.g. `0.0.0.0:15672`. The ready line then also says `http=ADDR`.",
        slot: &list(field!(net.http_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:15672")),
    },
    Setting {
        key: "net.amqps_listen",
        flag: "amqps-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "AMQP over TLS (1.2 and 1.3) listen addresses, 5671 by convention; needs \
              `tls.cert_file` and `tls.key_file`. The ready line then also says \
              `amqps=ADDR`. See [SECURITY.md](SECURITY.md).",
        slot: &list(field!(net.amqps_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:5671")),
    },
    Setting {
        key: "net.https_listen",
        flag: "https-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "HTTPS listen addresses for the same API as `net.http_listen`, over TLS 1.2 and \
              1.3 with the `[tls]` certificate, key and client-certificate settings (shared \
              with AMQPS; one SIGHUP reloads both); 15671 by RabbitMQ's convention. The ready \
              line then also says `https=ADDR`.",
        slot: &list(field!(net.https_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:15671")),
    },
    Setting {
        key: "net.mqtt_listen",
        flag: "mqtt-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "MQTT 3.1.1 and 5.0 listen addresses, 1883 by convention: MQTT clients log in \
              as AMQP users, publish to `amq.topic` and subscribe through queues bound to it \
              (see [MQTT.md](MQTT.md)). Off by default, as RabbitMQ's MQTT plugin is until \
              enabled. The ready line then also says `mqtt=ADDR`.",
        slot: &list(field!(net.mqtt_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:1883")),
    },
    Setting {
        key: "net.stream_listen",
        flag: "stream-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "RabbitMQ stream protocol listen addresses, 5552 by convention: RabbitMQ's \
              stream clients (Java, Go, Rust, .NET, Python `rstream`, `stream-perf-test`) \
              create, publish to and read the same streams as AMQP 0-9-1's \
              `x-queue-type: stream` (see [STREAMS.md](STREAMS.md#the-stream-protocol)). Off \
              by default, as RabbitMQ's `rabbitmq_stream` plugin is until enabled. The ready \
              line then also says `stream=ADDR`.",
        slot: &list(field!(net.stream_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:5552")),
    },
    Setting {
        key: "net.mqtts_listen",
        flag: "mqtts-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "MQTT over TLS (1.2 and 1.3) listen addresses, 8883 by convention, with the \
              `[tls]` certificate, key and client-certificate settings (shared with AMQPS); a \
              client that sends no password logs in as its verified certificate's user. The \
              ready line then also says `mqtts=ADDR`. See [MQTT.md](MQTT.md).",
        slot: &list(field!(net.mqtts_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:8883")),
    },
    Setting {
        key: "net.mqtt_ws_listen",
        flag: "mqtt-ws-listen",
        value_name: "ADDR:PORT",
        default_note: "off",
        doc: "MQTT over WebSocket listen addresses for browsers, as RabbitMQ's Web MQTT: the \
              path `/ws`, subprotocol `mqtt`; 15675 by RabbitMQ's convention. The ready line \
              then also says `mqtt-ws=ADDR`. See [MQTT.md](MQTT.md).",
        slot: &list(field!(net.mqtt_ws_listen), Vec::new)
            .check(|a| listen_addresses(a, "0.0.0.0:15675")),
    },
    Setting {
        key: "net.heartbeat_s",
        flag: "heartbeat-s",
        value_name: "SECONDS",
        default_note: "",
        doc: "heartbeat proposed in `connection.tune`; the client's `tune-ok` value is used. \
              A peer silent for two intervals is disconnected. 0 = off.",
        slot: &one(field!(net.heartbeat_s), || limits::DEFAULT_HEARTBEAT_S),
    },
    Setting {
        key: "net.handshake_timeout_ms",
        flag: "handshake-timeout-ms",
        value_name: "MS",
        default_note: "",
        doc: "time a client has to complete the AMQP handshake",
        slot: &one(field!(net.handshake_timeout_ms), || {
            limits::DEFAULT_HANDSHAKE_TIMEOUT_MS
        }),
    },
    Setting {
        key: "net.tls_handshake_timeout_ms",
        flag: "tls-handshake-timeout-ms",
        value_name: "MS",
        default_note: "",
        doc: "time a client has to complete the TLS handshake on an AMQPS or HTTPS listener \
              (the AMQP handshake then has `net.handshake_timeout_ms`). An HTTPS listener \
              runs at most 256 handshakes at once (`HTTPS_HANDSHAKES_MAX`), 16 per source \
              address (`HTTPS_HANDSHAKES_PER_ADDRESS_MAX`)",
        slot: &one(field!(net.tls_handshake_timeout_ms), || {
            limits::DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS
        })
        .check(|ms| {
            if *ms == 0 {
                return Err(Refusal::new("0", "must be at least 1"));
            }
            Ok(())
        }),
    },
];

pub(super) static MANAGEMENT: &[Setting] = &[Setting {
    key: "management.load_definitions",
    flag: "load-definitions",
    value_name: "FILE",
    default_note: "",
    doc: "a RabbitMQ definitions file (JSON) imported at startup: exchanges, queues, \
          bindings; what it cannot import is logged (see \
          [MANAGEMENT.md](MANAGEMENT.md#definitions)). An unreadable or refused file stops \
          startup.",
    slot: &maybe(field!(management.load_definitions)),
}];

pub(super) static TLS: &[Setting] = &[
    Setting {
        key: "tls.cert_file",
        flag: "tls-cert-file",
        value_name: "FILE",
        default_note: "",
        doc: "server certificate chain (PEM, leaf first) for AMQPS and HTTPS; reread on SIGHUP",
        slot: &maybe(field!(tls.cert_file)),
    },
    Setting {
        key: "tls.key_file",
        flag: "tls-key-file",
        value_name: "FILE",
        default_note: "",
        doc: "its private key (PEM: PKCS#8, PKCS#1 or SEC1); reread on SIGHUP",
        slot: &maybe(field!(tls.key_file)),
    },
    Setting {
        key: "tls.ca_file",
        flag: "tls-ca-file",
        value_name: "FILE",
        default_note: "",
        doc: "CA certificates (PEM) that client certificates are verified against; reread on \
              SIGHUP",
        slot: &maybe(field!(tls.ca_file)),
    },
    Setting {
        key: "tls.verify_peer",
        flag: "tls-verify-peer",
        value_name: "BOOL",
        default_note: "",
        doc: "ask clients for a certificate and verify it (needed for `EXTERNAL`)",
        slot: &one(field!(tls.verify_peer), || false),
    },
    Setting {
        key: "tls.fail_if_no_peer_cert",
        flag: "tls-fail-if-no-peer-cert",
        value_name: "BOOL",
        default_note: "",
        doc: "with `verify_peer`: refuse clients that present no certificate",
        slot: &one(field!(tls.fail_if_no_peer_cert), || false),
    },
    Setting {
        key: "tls.cert_login_from",
        flag: "tls-cert-login-from",
        value_name: "FROM",
        default_note: "",
        doc: "what of a verified client certificate is the `EXTERNAL` user name (RabbitMQ's \
              `ssl_cert_login_from`): `common_name`, `distinguished_name` (RFC 4514, e.g. \
              `CN=app,O=Example,C=US`) or `subject_alternative_name` (also \
              `subject_alt_name`). RabbitMQ's default is `distinguished_name`; berth keeps \
              `common_name`.",
        slot: &one(field!(tls.cert_login_from), Default::default),
    },
    Setting {
        key: "tls.cert_login_san_type",
        flag: "tls-cert-login-san-type",
        value_name: "TYPE",
        default_note: "",
        doc: "with `subject_alternative_name`: `dns`, `email`, `uri` or `other_name` (a string \
              value) (RabbitMQ's `ssl_cert_login_san_type`; `ip` is not supported)",
        slot: &one(field!(tls.cert_login_san_type), Default::default),
    },
    Setting {
        key: "tls.cert_login_san_index",
        flag: "tls-cert-login-san-index",
        value_name: "N",
        default_note: "",
        doc: "with `subject_alternative_name`: which SAN of that type, counting from 0 \
              (RabbitMQ's `ssl_cert_login_san_index`)",
        slot: &one(field!(tls.cert_login_san_index), || 0),
    },
];
