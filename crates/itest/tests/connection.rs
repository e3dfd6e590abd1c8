//! Connection and channel lifecycle: handshake, server properties, login,
//! vhost check, tune negotiation, heartbeats, channels and their limits.

use std::time::{Duration, Instant};

use berth_itest::lapin::options::{ChannelFlowOptions, QueueDeclareOptions};
use berth_itest::lapin::types::{AMQPValue, FieldTable};
use berth_itest::lapin::{Connection, ConnectionProperties};
use berth_itest::*;

/// The capabilities a RabbitMQ client looks for and berth implements.
const CAPABILITIES: &[&str] = &[
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "authentication_failure_close",
    "per_consumer_qos",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_start_advertises_product_version_platform_and_capabilities() {
    within(async {
        let broker = Broker::start();
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        let start = raw.read_start().await;
        assert_eq!((start.version_major, start.version_minor), (0, 9));
        let props = start.server_properties.inner();
        for key in ["product", "version", "platform"] {
            match props.get(key) {
                Some(v) => assert!(
                    value_str(v).is_some_and(|s| !s.is_empty()),
                    "server property {key} should be a non-empty string, is {v:?}"
                ),
                None => panic!("server property {key} missing: {props:?}"),
            }
        }
        let Some(AMQPValue::FieldTable(caps)) = props.get("capabilities") else {
            panic!("no capabilities table in {props:?}");
        };
        for cap in CAPABILITIES {
            assert_eq!(
                caps.inner().get(*cap),
                Some(&AMQPValue::Boolean(true)),
                "capability {cap} should be advertised as true; capabilities: {caps:?}"
            );
        }
        let mechanisms = String::from_utf8_lossy(start.mechanisms.as_bytes()).into_owned();
        let mechanisms: Vec<&str> = mechanisms.split_whitespace().collect();
        assert!(mechanisms.contains(&"PLAIN"), "mechanisms {mechanisms:?}");
        assert!(
            mechanisms.contains(&"AMQPLAIN"),
            "mechanisms {mechanisms:?}"
        );
        let locales = String::from_utf8_lossy(start.locales.as_bytes()).into_owned();
        assert!(
            locales.split_whitespace().any(|l| l == "en_US"),
            "locales {locales:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_amqplain_logins_are_both_accepted() {
    within(async {
        let broker = Broker::start();
        for mechanism in ["plain", "amqplain"] {
            let uri = broker.uri_with(
                "guest",
                "guest",
                "%2f",
                &format!("auth_mechanism={mechanism}"),
            );
            let conn = bounded(
                "connect",
                Connection::connect(&uri, ConnectionProperties::default()),
            )
            .await
            .unwrap_or_else(|e| panic!("login with {mechanism}: {e}"));
            let ch = open_channel(&conn).await;
            let q = declare_queue(&ch, "login", FieldTable::default()).await;
            publish(&ch, "", &q, b"hello").await;
            assert_eq!(drain_strings(&ch, &q).await, ["hello"]);
            bounded("connection.close", conn.close(200, "bye".into()))
                .await
                .expect("connection.close");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_with_403_access_refused() {
    within(async {
        let broker = Broker::start();
        let uri = broker.uri_with("guest", "not-the-password", "%2f", "");
        let result = bounded(
            "connect",
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await;
        expect_reply(result.map(|_| ()), 403, &["PLAIN"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_user_is_refused_with_403_access_refused() {
    within(async {
        let broker = Broker::start();
        let uri = broker.uri_with("nobody-here", "guest", "%2f", "auth_mechanism=amqplain");
        let result = bounded(
            "connect",
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await;
        expect_reply(result.map(|_| ()), 403, &["AMQPLAIN"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_vhost_is_refused_with_530_not_allowed() {
    within(async {
        let broker = Broker::start();
        let vhost = unique("vhost");
        let uri = broker.uri_with("guest", "guest", &vhost, "");
        let result = bounded(
            "connect",
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await;
        expect_reply(result.map(|_| ()), 530, &[&vhost]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_offers_limits_that_the_client_may_lower() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let offered = conn.configuration();
        assert!(
            offered.frame_max() >= 4096,
            "frame_max {}",
            offered.frame_max()
        );
        assert!(
            offered.channel_max() >= 1,
            "channel_max {}",
            offered.channel_max()
        );
        let (server_frame_max, server_channel_max) = (offered.frame_max(), offered.channel_max());

        let uri = broker.uri_with(
            "guest",
            "guest",
            "%2f",
            "frame_max=4096&channel_max=3&heartbeat=5",
        );
        let conn = bounded(
            "connect",
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await
        .expect("connect with lower limits");
        let tuned = conn.configuration();
        assert_eq!(tuned.frame_max(), 4096.min(server_frame_max));
        assert_eq!(tuned.channel_max(), 3.min(server_channel_max));
        // A big message still crosses a connection tuned to the smallest frame.
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "tune", FieldTable::default()).await;
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        publish(&ch, "", &q, &body).await;
        assert_eq!(drain(&ch, &q).await, [body]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_reflects_configured_frame_channel_and_heartbeat_limits() {
    within(async {
        let Some(broker) = Broker::start_with_flags(&[
            "--frame-size-bytes-max",
            "16384",
            "--channels-per-connection-max",
            "8",
            "--heartbeat-s",
            "7",
        ]) else {
            return;
        };
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        let hs = raw.handshake(7).await;
        assert_eq!(hs.tune.frame_max, 16384);
        assert_eq!(hs.tune.channel_max, 8);
        assert_eq!(hs.tune.heartbeat, 7);

        let conn = broker.connect().await;
        assert_eq!(conn.configuration().channel_max(), 8);
        let mut channels = Vec::new();
        for _ in 0..8 {
            channels.push(open_channel(&conn).await);
        }
        // The client refuses a ninth channel itself, so the limit is in force.
        let ninth = bounded("channel.open", conn.create_channel()).await;
        assert!(ninth.is_err(), "a ninth channel should not open: {ninth:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_with_one_second_heartbeat_stays_open() {
    within(async {
        let broker = Broker::start();
        let uri = broker.uri_with("guest", "guest", "%2f", "heartbeat=1");
        let conn = bounded(
            "connect",
            Connection::connect(&uri, ConnectionProperties::default()),
        )
        .await
        .expect("connect");
        assert_eq!(conn.configuration().heartbeat(), 1);
        let ch = open_channel(&conn).await;
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let q = declare_queue(&ch, "heartbeat", FieldTable::default()).await;
        publish(&ch, "", &q, b"still here").await;
        assert_eq!(drain_strings(&ch, &q).await, ["still here"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_is_disconnected_after_missed_heartbeats() {
    within(async {
        let broker = Broker::start();
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(1).await;
        let started = Instant::now();
        // Read (and never answer) until the broker gives up on us.
        let mut heartbeats = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), raw.read_frame()).await {
                Ok(Some(frame)) => {
                    if frame.frame_type == 8 {
                        heartbeats += 1;
                    }
                }
                Ok(None) => break,
                Err(_) => panic!("broker kept a silent peer for over 10 s"),
            }
        }
        let waited = started.elapsed();
        assert!(heartbeats >= 1, "broker should send heartbeats before giving up");
        assert!(
            waited >= Duration::from_millis(1500) && waited <= Duration::from_secs(8),
            "a peer silent with heartbeat 1 s should be dropped after a few seconds, took {waited:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_protocol_header_is_answered_with_amqp_0_9_1_and_closed() {
    within(async {
        let broker = Broker::start();
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.send(b"AMQP\x01\x01\x00\x0a").await;
        let answer = raw.read_to_close().await;
        assert_eq!(answer, PROTOCOL_HEADER);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_is_acknowledged() {
    within(async {
        let broker = Broker::start();
        let (conn, _ch) = broker.channel().await;
        bounded("connection.close", conn.close(200, "done".into()))
            .await
            .expect("connection.close-ok");
        assert!(!conn.status().connected());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_close_is_acknowledged_and_other_channels_carry_on() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let a = open_channel(&conn).await;
        let b = open_channel(&conn).await;
        bounded("channel.close", a.close(200, "done".into()))
            .await
            .expect("channel.close-ok");
        let q = declare_queue(&b, "chan", FieldTable::default()).await;
        publish(&b, "", &q, b"x").await;
        assert_eq!(drain_strings(&b, &q).await, ["x"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_exception_closes_only_its_channel() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let bad = open_channel(&conn).await;
        let good = open_channel(&conn).await;
        let missing = unique("missing");
        let result = bounded(
            "queue.declare passive",
            bad.queue_declare(
                missing.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await;
        expect_reply(result, 404, &[&missing]);
        assert!(
            conn.status().connected(),
            "a channel exception must not close the connection"
        );
        let q = declare_queue(&good, "survivor", FieldTable::default()).await;
        publish(&good, "", &q, b"fine").await;
        assert_eq!(drain_strings(&good, &q).await, ["fine"]);
        // And a new channel opens on the same connection.
        let again = open_channel(&conn).await;
        publish(&again, "", &q, b"again").await;
        assert_eq!(drain_strings(&again, &q).await, ["again"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_channels_on_one_connection_work_independently() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let mut channels = Vec::new();
        for _ in 0..200 {
            channels.push(open_channel(&conn).await);
        }
        let mut queues = Vec::new();
        for (i, ch) in channels.iter().enumerate() {
            let q = declare_queue(ch, "many", FieldTable::default()).await;
            publish(ch, "", &q, format!("m{i}").as_bytes()).await;
            queues.push(q);
        }
        // Close every other channel; the rest keep their own state.
        for ch in channels.iter().step_by(2) {
            bounded("channel.close", ch.close(200, "bye".into()))
                .await
                .expect("channel.close");
        }
        for (i, (ch, q)) in channels.iter().zip(&queues).enumerate().skip(1).step_by(2) {
            assert_eq!(drain_strings(ch, q).await, [format!("m{i}")]);
        }
        let ch = open_channel(&conn).await;
        for (i, q) in queues.iter().enumerate().step_by(2) {
            assert_eq!(drain_strings(&ch, q).await, [format!("m{i}")]);
            bounded(
                "queue.delete",
                ch.queue_delete(q.as_str().into(), Default::default()),
            )
            .await
            .expect("queue.delete");
        }
        for q in queues.iter().skip(1).step_by(2) {
            bounded(
                "queue.delete",
                ch.queue_delete(q.as_str().into(), Default::default()),
            )
            .await
            .expect("queue.delete");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_flow_active_is_confirmed() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let active = bounded(
            "channel.flow",
            ch.channel_flow(ChannelFlowOptions { active: true }),
        )
        .await
        .expect("channel.flow-ok");
        assert!(active);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_over_configured_maximum_is_refused_with_406() {
    within(async {
        let Some(broker) = Broker::start_with_flags(&["--message-size-bytes-max", "1024"]) else {
            return;
        };
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "maxsize", FieldTable::default()).await;
        publish(&ch, "", &q, &[7u8; 1024]).await;
        assert_eq!(
            drain(&ch, &q).await.len(),
            1,
            "a message at the limit is accepted"
        );
        let err = publish_fails(&ch, "", &q, &[7u8; 1025], Default::default()).await;
        assert_reply(&err, 406, &["1025", "1024"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_secret_is_acknowledged_and_the_connection_carries_on() {
    within(async {
        let broker = Broker::start();
        let (conn, ch) = broker.channel().await;
        bounded(
            "connection.update-secret",
            conn.update_secret("guest".into(), "rotation".into()),
        )
        .await
        .expect("connection.update-secret-ok");
        let q = declare_queue(&ch, "after-update-secret", FieldTable::default()).await;
        publish(&ch, "", &q, b"x").await;
        assert_eq!(drain_strings(&ch, &q).await, ["x"]);
    })
    .await;
}
