//! MQTT black-box tests: the real `berth` binary with `--mqtt-listen`,
//! driven by Debian's `mosquitto_pub` / `mosquitto_sub` (package
//! `mosquitto-clients`, installed by scripts/test.sh), the lapin AMQP
//! client, and raw sockets for what no well-behaved client sends.
//!
//! What they pin: MQTT and AMQP clients see each other's messages through
//! `amq.topic` with RabbitMQ's topic mapping; a QoS 1 message PUBACKed to
//! a persistent session's publisher survives `kill -9`; a wrong password,
//! a malformed packet, an oversized one and a refused QoS 2 publish each
//! get their reason code and end only their own connection.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use common::{connect, temp_dir, Broker};
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use mqtt5_protocol::packet::connect::ConnectPacket;
use mqtt5_protocol::packet::publish::PublishPacket;
use mqtt5_protocol::packet::subscribe::SubscribePacket;
use mqtt5_protocol::packet::MqttPacket;
use mqtt5_protocol::types::{ConnectOptions, ProtocolVersion};
use mqtt5_protocol::{FixedHeader, Packet, QoS, ReasonCode};

/// Every wait on a client is bounded by this.
const WAIT: Duration = Duration::from_secs(15);

fn start(data: &std::path::Path) -> Broker {
    Broker::start(&[data], &["--mqtt-listen", "127.0.0.1:0"])
}

fn host_port(b: &Broker) -> (String, String) {
    let addr = b
        .addr("mqtt")
        .expect("the ready line names the MQTT listener");
    let (h, p) = addr.rsplit_once(':').expect("ADDR:PORT");
    (h.to_owned(), p.to_owned())
}

/// Runs a mosquitto client against `b` as guest with `args` added.
fn mosquitto(bin: &str, b: &Broker, args: &[&str]) -> Output {
    let (h, p) = host_port(b);
    Command::new(bin)
        .args(["-h", &h, "-p", &p, "-u", "guest", "-P", "guest"])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {bin} ({e}): install Debian's mosquitto-clients (scripts/test.sh does)"
            )
        })
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}, stdout {:?}, stderr {:?}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A raw MQTT connection, for packets no client library would send.
struct Raw {
    s: TcpStream,
    buf: BytesMut,
    version: u8,
}

impl Raw {
    fn open(b: &Broker, version: u8) -> Raw {
        let s = TcpStream::connect(b.addr("mqtt").unwrap()).expect("connect");
        s.set_read_timeout(Some(WAIT)).unwrap();
        Raw {
            s,
            buf: BytesMut::new(),
            version,
        }
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send");
    }

    fn send(&mut self, p: &impl MqttPacket) {
        let mut b = BytesMut::new();
        p.encode(&mut b).expect("encode");
        self.send_bytes(&b);
    }

    fn connect(&mut self, client_id: &str, password: &str) -> Packet {
        let o = ConnectOptions::new(client_id).with_credentials("guest", password);
        self.connect_with(o)
    }

    fn connect_with(&mut self, o: ConnectOptions) -> Packet {
        let c = if self.version == 5 {
            ConnectPacket::new(o.with_protocol_version(ProtocolVersion::V5))
        } else {
            ConnectPacket::new_v311(o.with_protocol_version(ProtocolVersion::V311))
        };
        self.send(&c);
        self.recv().expect("an answer to CONNECT")
    }

    /// The next packet, or `None` once the server closed the connection.
    fn recv(&mut self) -> Option<Packet> {
        loop {
            if self.buf.len() >= 2 {
                let mut head = &self.buf[..];
                if let Ok(fixed) = FixedHeader::decode(&mut head) {
                    let size = fixed.encoded_len() + fixed.remaining_length as usize;
                    if self.buf.len() >= size {
                        let mut packet = self.buf.split_to(size).freeze();
                        packet.advance(fixed.encoded_len());
                        let p = Packet::decode_from_body_with_version(
                            fixed.packet_type,
                            &fixed,
                            &mut packet,
                            self.version,
                        )
                        .expect("the server sends well-formed packets");
                        return Some(p);
                    }
                }
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("no packet within {WAIT:?}: {e}"),
            }
        }
    }

    /// The reason code of the v5 DISCONNECT the server ends with, then
    /// the close.
    fn expect_disconnect(&mut self) -> ReasonCode {
        match self.recv() {
            Some(Packet::Disconnect(d)) => {
                assert!(
                    self.recv().is_none(),
                    "the connection closes after DISCONNECT"
                );
                d.reason_code
            }
            other => panic!("expected a DISCONNECT, got {other:?}"),
        }
    }
}

fn connack_code(p: &Packet) -> ReasonCode {
    match p {
        Packet::ConnAck(a) => a.reason_code,
        other => panic!("expected a CONNACK, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mqtt_and_amqp_clients_see_each_others_messages() {
    let dir = temp_dir("mqtt-interop", 0);
    let b = start(dir.path());
    let conn = connect(&b.uri).await;
    let ch = conn.create_channel().await.unwrap();

    // MQTT -> AMQP: `sensors/+/temp` is `sensors.*.temp` on amq.topic.
    ch.queue_declare(
        "from-mqtt".into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        "from-mqtt".into(),
        "amq.topic".into(),
        "sensors.*.temp".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let o = mosquitto(
        "mosquitto_pub",
        &b,
        &["-q", "1", "-t", "sensors/k1/temp", "-m", "21.5"],
    );
    assert!(o.status.success(), "publish: {}", text(&o));
    let got = ch
        .basic_get("from-mqtt".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the MQTT message reached the AMQP queue");
    assert_eq!(got.delivery.data, b"21.5");
    assert_eq!(got.delivery.routing_key.as_str(), "sensors.k1.temp");
    let props = &got.delivery.properties;
    assert_eq!(*props.delivery_mode(), Some(2), "QoS 1 is persistent");
    let qos = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-mqtt-publish-qos").cloned());
    assert_eq!(qos, Some(AMQPValue::ShortShortInt(1)));

    // AMQP -> MQTT: a persistent subscriber's queue is durable, so it
    // can be seen (passively declared) once the subscription exists.
    let (h, p) = host_port(&b);
    let sub = Command::new("mosquitto_sub")
        .args(["-h", &h, "-p", &p, "-u", "guest", "-P", "guest"])
        .args([
            "-c", "-i", "reader", "-q", "1", "-t", "cmd/+", "-C", "1", "-v", "-W", "15",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mosquitto_sub");
    let deadline = Instant::now() + WAIT;
    loop {
        let probe = conn.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = probe
            .queue_declare(
                "mqtt-subscription-readerqos1".into(),
                passive,
                FieldTable::default(),
            )
            .await;
        if declared.is_ok_and(|q| q.consumer_count() == 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the MQTT subscription never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ch.basic_publish(
        "amq.topic".into(),
        "cmd.dev1".into(),
        BasicPublishOptions::default(),
        b"reboot",
        BasicProperties::default().with_delivery_mode(2),
    )
    .await
    .unwrap();
    let o = sub.wait_with_output().unwrap();
    assert!(o.status.success(), "subscribe: {}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "cmd/dev1 reboot\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pubacked_qos1_message_to_a_persistent_session_survives_kill9() {
    let dir = temp_dir("mqtt-kill9", 0);
    let mut b = start(dir.path());
    // The session and its subscription, kept after the client leaves.
    let o = mosquitto(
        "mosquitto_sub",
        &b,
        &[
            "-c",
            "-i",
            "keeper",
            "-q",
            "1",
            "-t",
            "sensors/#",
            "-W",
            "1",
        ],
    );
    assert!(
        o.status.code() == Some(27),
        "subscribe, then time out: {}",
        text(&o)
    );
    // Each exit 0 means its PUBACK came, i.e. the broker confirmed it.
    for i in 0..5 {
        let (t, m) = (format!("sensors/s{i}"), format!("m{i}"));
        let o = mosquitto("mosquitto_pub", &b, &["-q", "1", "-t", &t, "-m", &m]);
        assert!(o.status.success(), "publish {i}: {}", text(&o));
    }
    b.kill9();
    let b = start(dir.path());
    let o = mosquitto(
        "mosquitto_sub",
        &b,
        &[
            "-c",
            "-i",
            "keeper",
            "-q",
            "1",
            "-t",
            "sensors/#",
            "-C",
            "5",
            "-W",
            "15",
            "-v",
        ],
    );
    assert!(o.status.success(), "resume the session: {}", text(&o));
    let want: String = (0..5).map(|i| format!("sensors/s{i} m{i}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        want,
        "log:\n{}",
        b.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_its_reason_code_and_leaves_other_clients_alone() {
    let dir = temp_dir("mqtt-bad-input", 0);
    let b = start(dir.path());
    // A bystander, subscribed before the trouble starts.
    let mut bystander = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&bystander.connect("bystander", "guest")),
        ReasonCode::Success
    );
    bystander.send(&SubscribePacket::new(1).add_filter("watch/#", QoS::AtLeastOnce));
    assert!(matches!(bystander.recv(), Some(Packet::SubAck(_))));

    // A wrong password: 3.1.1 return code 4, 5.0 reason code 0x86.
    let o = Command::new("mosquitto_pub")
        .args(["-h", &host_port(&b).0, "-p", &host_port(&b).1])
        .args(["-u", "guest", "-P", "wrong", "-t", "watch/x", "-m", "no"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bad user name or password"),
        "{}",
        text(&o)
    );
    let mut v5 = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&v5.connect("intruder", "wrong")),
        ReasonCode::BadUsernameOrPassword
    );
    assert!(v5.recv().is_none(), "closed after a refused CONNECT");

    // Not MQTT at all: closed without an answer.
    let mut http = Raw::open(&b, 4);
    http.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(http.recv().is_none());

    // A CONNECT announcing 256 MiB: refused from its header.
    let mut huge = Raw::open(&b, 4);
    huge.send_bytes(&[0x10, 0xFF, 0xFF, 0xFF, 0x7F]);
    assert!(huge.recv().is_none());

    // A malformed packet after a good CONNECT (type 0 is reserved).
    let mut bad = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&bad.connect("bad", "guest")),
        ReasonCode::Success
    );
    bad.send_bytes(&[0x00, 0x00]);
    assert_eq!(bad.expect_disconnect(), ReasonCode::MalformedPacket);

    // A retained publish, which CONNACK said is not available.
    let mut retained = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&retained.connect("retainer", "guest")),
        ReasonCode::Success
    );
    retained.send(&PublishPacket::new("watch/x", &b"kept"[..], QoS::AtMostOnce).with_retain(true));
    assert_eq!(retained.expect_disconnect(), ReasonCode::RetainNotSupported);

    // The bystander still gets what is published.
    let o = mosquitto(
        "mosquitto_pub",
        &b,
        &["-q", "1", "-t", "watch/x", "-m", "still-here"],
    );
    assert!(o.status.success(), "{}", text(&o));
    match bystander.recv() {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.topic_name, "watch/x");
            assert_eq!(&p.payload[..], b"still-here");
        }
        other => panic!("the bystander lost its subscription: {other:?}"),
    }
    assert!(b.errors().is_empty(), "errors logged: {:?}", b.errors());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_qos2_publish_is_routed_once_across_a_resend_and_a_client_reconnect() {
    let dir = temp_dir("mqtt-qos2", 0);
    let b = start(dir.path());
    let conn = connect(&b.uri).await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        "once".into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        "once".into(),
        "amq.topic".into(),
        "orders.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let session = || {
        ConnectOptions::new("exactly")
            .with_credentials("guest", "guest")
            .with_clean_start(false)
            .with_session_expiry_interval(300)
    };
    let publish = |dup| {
        PublishPacket::new("orders/1", &b"pay"[..], QoS::ExactlyOnce)
            .with_packet_id(7)
            .with_dup(dup)
    };
    let mut c = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&c.connect_with(session())),
        ReasonCode::Success
    );
    c.send(&publish(false));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == 7));
    // Sent again (the PUBREC might have been lost): not routed again.
    c.send(&publish(true));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == 7));
    // The client goes away before PUBREL and comes back to the session.
    drop(c);
    let mut c = Raw::open(&b, 5);
    let deadline = Instant::now() + WAIT;
    loop {
        // The old connection may still hold the id for a moment.
        match c.connect_with(session()) {
            Packet::ConnAck(a) if a.reason_code == ReasonCode::Success => {
                assert!(a.session_present, "the session was kept");
                break;
            }
            other => assert!(Instant::now() < deadline, "reconnect: {other:?}"),
        }
        c = Raw::open(&b, 5);
    }
    c.send(&publish(true));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == 7));
    c.send(&mqtt5_protocol::packet::pubrel::PubRelPacket::new(7));
    assert!(matches!(c.recv(), Some(Packet::PubComp(r)) if r.packet_id == 7));
    let q = ch
        .queue_declare(
            "once".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(q.message_count(), 1, "one QoS 2 publish, one message");
}
