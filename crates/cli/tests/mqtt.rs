//! MQTT black-box tests: the real `berth` binary with `--mqtt-listen`,
//! driven by Debian's `mosquitto_pub` / `mosquitto_sub` (package
//! `mosquitto-clients`, installed by scripts/test.sh), the lapin AMQP
//! client, and raw sockets for what no well-behaved client sends.
//!
//! What they pin: MQTT and AMQP clients see each other's messages through
//! `amq.topic` with RabbitMQ's topic mapping; a QoS 1 message PUBACKed to
//! a persistent session's publisher survives `kill -9`; a wrong password,
//! a malformed packet, an oversized one and a refused QoS 2 publish each
//! get their reason code and end only their own connection; retained
//! messages survive `kill -9` and reach new subscriptions with the retain
//! flag; a QoS 2 delivery completes once across a client reconnect.

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

    // A topic alias above the maximum CONNACK told (64).
    let mut alias = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&alias.connect("aliaser", "guest")),
        ReasonCode::Success
    );
    alias.send(&PublishPacket::new("watch/x", &b"kept"[..], QoS::AtMostOnce).with_topic_alias(65));
    assert_eq!(alias.expect_disconnect(), ReasonCode::TopicAliasInvalid);

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

impl Raw {
    /// A v5 persistent session of `client_id`, retried while an older
    /// connection of it still holds the id.
    fn resume(b: &Broker, client_id: &str) -> (Raw, bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut c = Raw::open(b, 5);
            let o = ConnectOptions::new(client_id)
                .with_credentials("guest", "guest")
                .with_clean_start(false)
                .with_session_expiry_interval(300);
            match c.connect_with(o) {
                Packet::ConnAck(a) if a.reason_code == ReasonCode::Success => {
                    return (c, a.session_present)
                }
                other => assert!(Instant::now() < deadline, "reconnect: {other:?}"),
            }
        }
    }

    /// The packets the server sends before its answer to a PINGREQ sent
    /// now (what it had queued for us, in order).
    fn drain(&mut self) -> Vec<Packet> {
        self.s.write_all(&[0xC0, 0x00]).expect("PINGREQ");
        let mut got = Vec::new();
        loop {
            match self.recv() {
                Some(Packet::PingResp) => return got,
                Some(p) => got.push(p),
                None => panic!("closed; got {got:?}"),
            }
        }
    }
}

/// The (topic, payload, retain) of each PUBLISH among `packets`.
fn publishes(packets: &[Packet]) -> Vec<(String, String, bool)> {
    packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some((
                p.topic_name.clone(),
                String::from_utf8_lossy(&p.payload).into_owned(),
                p.retain,
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn retained_messages_survive_kill9_and_reach_new_subscriptions() {
    use mqtt5_protocol::packet::subscribe::{RetainHandling, SubscriptionOptions, TopicFilter};
    let dir = temp_dir("mqtt-retained", 0);
    let mut b = start(dir.path());
    let mut p = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&p.connect("retainer", "guest")),
        ReasonCode::Success
    );
    let retained = |topic: &str, body: &'static [u8], id| {
        PublishPacket::new(topic, body, QoS::AtLeastOnce)
            .with_packet_id(id)
            .with_retain(true)
    };
    // Kept, replaced, cleared (an empty payload), kept at QoS 0.
    for (i, (topic, body)) in [
        ("home/t1", &b"21"[..]),
        ("home/t2", b"22"),
        ("home/t1", b"23"),
        ("home/t2", b""),
        ("home/t3", b"24"),
    ]
    .into_iter()
    .enumerate()
    {
        p.send(&retained(topic, body, 10 + i as u16));
        assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.packet_id == 10 + i as u16));
    }
    let want = vec![
        ("home/t1".to_owned(), "23".to_owned(), true),
        ("home/t3".to_owned(), "24".to_owned(), true),
    ];
    let sorted = |mut v: Vec<(String, String, bool)>| {
        v.sort();
        v
    };
    // A 3.1.1 subscriber gets them with the retain flag after its SUBACK.
    let mut s = Raw::open(&b, 4);
    assert_eq!(
        connack_code(&s.connect("watcher", "guest")),
        ReasonCode::Success
    );
    s.send(&SubscribePacket::new_v311(1).add_filter("home/#", QoS::AtLeastOnce));
    assert!(matches!(s.recv(), Some(Packet::SubAck(_))));
    assert_eq!(sorted(publishes(&s.drain())), want);
    // A message to an established subscription has no retain flag (3.1.1
    // §3.3.1.3), unless a v5 subscription asked for it as published.
    let mut rap = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&rap.connect("rap", "guest")),
        ReasonCode::Success
    );
    let options = |retain_handling, retain_as_published| SubscriptionOptions {
        qos: QoS::AtMostOnce,
        retain_as_published,
        retain_handling,
        ..Default::default()
    };
    let mut sub = SubscribePacket::new(2);
    sub.filters.push(TopicFilter::with_options(
        "home/#",
        options(RetainHandling::DoNotSend, true),
    ));
    rap.send(&sub);
    assert!(matches!(rap.recv(), Some(Packet::SubAck(_))));
    assert!(
        publishes(&rap.drain()).is_empty(),
        "retain handling 2 sends none"
    );
    p.send(&retained("home/t4", b"25", 20));
    assert!(matches!(p.recv(), Some(Packet::PubAck(_))));
    let got = publishes(&s.drain());
    assert_eq!(got, vec![("home/t4".into(), "25".into(), false)]);
    assert_eq!(
        publishes(&rap.drain()),
        vec![("home/t4".into(), "25".into(), true)]
    );
    // Retain handling 1: sent for a new subscription only.
    let mut sub = SubscribePacket::new(3);
    sub.filters.push(TopicFilter::with_options(
        "home/#",
        options(RetainHandling::SendAtSubscribeIfNew, false),
    ));
    rap.send(&sub);
    assert!(matches!(rap.recv(), Some(Packet::SubAck(_))));
    assert!(publishes(&rap.drain()).is_empty(), "not a new subscription");

    // Everything PUBACKed survives kill -9.
    b.kill9();
    let b = start(dir.path());
    let mut s = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&s.connect("after", "guest")),
        ReasonCode::Success
    );
    s.send(&SubscribePacket::new(1).add_filter("home/+", QoS::AtMostOnce));
    assert!(matches!(s.recv(), Some(Packet::SubAck(_))));
    let mut want = want;
    want.push(("home/t4".into(), "25".into(), true));
    assert_eq!(
        sorted(publishes(&s.drain())),
        want,
        "log:\n{}",
        b.log_tail()
    );
    assert!(b.errors().is_empty(), "errors logged: {:?}", b.errors());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_qos2_delivery_completes_once_across_a_client_reconnect() {
    let dir = temp_dir("mqtt-qos2-out", 0);
    let b = start(dir.path());
    let (mut c, _) = Raw::resume(&b, "receiver");
    c.send(&SubscribePacket::new(1).add_filter("q2/#", QoS::ExactlyOnce));
    match c.recv() {
        Some(Packet::SubAck(a)) => {
            assert_eq!(
                a.reason_codes,
                vec![mqtt5_protocol::packet::suback::SubAckReasonCode::GrantedQoS2]
            )
        }
        other => panic!("expected a SUBACK, got {other:?}"),
    }
    for m in ["one", "two"] {
        let o = mosquitto("mosquitto_pub", &b, &["-q", "2", "-t", "q2/x", "-m", m]);
        assert!(o.status.success(), "publish: {}", text(&o));
    }
    let first = |c: &mut Raw| match c.recv() {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.qos, QoS::ExactlyOnce, "delivered at QoS 2");
            (
                p.packet_id.unwrap(),
                String::from_utf8_lossy(&p.payload).into_owned(),
                p.dup,
            )
        }
        other => panic!("expected a PUBLISH, got {other:?}"),
    };
    let (id1, m1, _) = first(&mut c);
    assert_eq!(m1, "one");
    c.send(&mqtt5_protocol::packet::pubrec::PubRecPacket::new(id1));
    // PUBLISH "two" and PUBREL of "one", in either order.
    let mut rel = None;
    let mut two = None;
    while rel.is_none() || two.is_none() {
        match c.recv() {
            Some(Packet::PubRel(r)) => rel = Some(r.packet_id),
            Some(Packet::Publish(p)) => two = p.packet_id,
            other => panic!("expected PUBREL or PUBLISH, got {other:?}"),
        }
    }
    assert_eq!(rel, Some(id1));
    // Gone before PUBCOMP of "one" and before PUBREC of "two".
    drop(c);
    let (mut c, present) = Raw::resume(&b, "receiver");
    assert!(present, "the session was kept");
    // The PUBREL of "one" again, and "two" again with DUP; "one" is not
    // delivered again.
    let mut got = Vec::new();
    while got.len() < 2 {
        match c.recv() {
            Some(Packet::PubRel(r)) => got.push(format!("PUBREL {}", r.packet_id == id1)),
            Some(Packet::Publish(p)) => {
                got.push(format!(
                    "{} dup={}",
                    String::from_utf8_lossy(&p.payload),
                    p.dup
                ));
                c.send(&mqtt5_protocol::packet::pubrec::PubRecPacket::new(
                    p.packet_id.unwrap(),
                ));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        got,
        vec!["PUBREL true".to_owned(), "two dup=true".to_owned()]
    );
    c.send(&mqtt5_protocol::packet::pubcomp::PubCompPacket::new(id1));
    match c.recv() {
        Some(Packet::PubRel(r)) => c.send(&mqtt5_protocol::packet::pubcomp::PubCompPacket::new(
            r.packet_id,
        )),
        other => panic!("expected the PUBREL of two, got {other:?}"),
    }
    assert!(publishes(&c.drain()).is_empty(), "nothing delivered twice");
    assert!(b.errors().is_empty(), "errors logged: {:?}", b.errors());
}

#[tokio::test(flavor = "multi_thread")]
async fn v5_properties_and_topic_aliases_cross_over_to_amqp_and_back() {
    use lapin::types::ShortString;
    let dir = temp_dir("mqtt-v5-props", 0);
    let b = start(dir.path());
    let conn = connect(&b.uri).await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        "requests".into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        "requests".into(),
        "amq.topic".into(),
        "req.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let mut c = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&c.connect("requester", "guest")),
        ReasonCode::Success
    );
    c.send(&SubscribePacket::new(1).add_filter("replies/#", QoS::AtMostOnce));
    assert!(matches!(c.recv(), Some(Packet::SubAck(_))));
    // The first PUBLISH sets alias 3, the second uses it (empty topic).
    let mut first = PublishPacket::new("req/dev1", &b"ping"[..], QoS::AtLeastOnce)
        .with_packet_id(1)
        .with_topic_alias(3);
    first.properties.set_response_topic("replies/dev1".into());
    first
        .properties
        .set_correlation_data(bytes::Bytes::from_static(b"c-1"));
    first.properties.set_content_type("text/plain".into());
    first
        .properties
        .add_user_property("site".into(), "north".into());
    c.send(&first);
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.packet_id == 1));
    let second = PublishPacket::new("", &b"again"[..], QoS::AtLeastOnce)
        .with_packet_id(2)
        .with_topic_alias(3);
    c.send(&second);
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.packet_id == 2));
    let get = || async {
        ch.basic_get("requests".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a request")
    };
    let req = get().await;
    let p = &req.delivery.properties;
    assert_eq!(req.delivery.routing_key.as_str(), "req.dev1");
    assert_eq!(
        p.reply_to().as_ref().map(ShortString::as_str),
        Some("replies.dev1")
    );
    assert_eq!(
        p.correlation_id().as_ref().map(ShortString::as_str),
        Some("c-1")
    );
    assert_eq!(
        p.content_type().as_ref().map(ShortString::as_str),
        Some("text/plain")
    );
    let site = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("site").cloned());
    assert_eq!(site, Some(AMQPValue::LongString("north".into())));
    let again = get().await;
    assert_eq!(
        again.delivery.routing_key.as_str(),
        "req.dev1",
        "the alias named the topic"
    );
    assert_eq!(again.delivery.data, b"again");
    // The AMQP service answers on reply_to with the correlation id.
    let mut headers = FieldTable::default();
    headers.insert("status".into(), AMQPValue::LongString("ok".into()));
    ch.basic_publish(
        "amq.topic".into(),
        p.reply_to().clone().unwrap(),
        BasicPublishOptions::default(),
        b"pong",
        BasicProperties::default()
            .with_correlation_id(p.correlation_id().clone().unwrap())
            .with_headers(headers),
    )
    .await
    .unwrap();
    match c.recv() {
        Some(Packet::Publish(r)) => {
            assert_eq!(r.topic_name, "replies/dev1");
            assert_eq!(&r.payload[..], b"pong");
            assert_eq!(r.properties.get_user_property_value("status"), Some("ok"));
            assert!(matches!(
                r.properties.get(mqtt5_protocol::PropertyId::CorrelationData),
                Some(mqtt5_protocol::PropertyValue::BinaryData(d)) if &d[..] == b"c-1"
            ));
        }
        other => panic!("expected the reply, got {other:?}"),
    }
    // A `$` topic is not for clients to reach each other (MQTT 5.0
    // §4.7.2): PUBACK 0x90, and a `#` subscription gets nothing.
    c.send(&SubscribePacket::new(2).add_filter("#", QoS::AtMostOnce));
    assert!(matches!(c.recv(), Some(Packet::SubAck(_))));
    c.send(&PublishPacket::new("$SYS/x", &b"no"[..], QoS::AtLeastOnce).with_packet_id(5));
    match c.recv() {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason_code, ReasonCode::TopicNameInvalid),
        other => panic!("expected a PUBACK, got {other:?}"),
    }
    assert!(publishes(&c.drain()).is_empty(), "a $ topic is not routed");
    // An alias never set is a protocol error.
    c.send(&PublishPacket::new("", &b"lost"[..], QoS::AtMostOnce).with_topic_alias(9));
    assert_eq!(c.expect_disconnect(), ReasonCode::ProtocolError);
    assert!(b.errors().is_empty(), "errors logged: {:?}", b.errors());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_will_is_sent_when_its_session_expires_before_its_delay() {
    use mqtt5_protocol::types::WillMessage;
    let dir = temp_dir("mqtt-will-delay", 0);
    let b = start(dir.path());
    let mut watcher = Raw::open(&b, 5);
    assert_eq!(
        connack_code(&watcher.connect("watcher", "guest")),
        ReasonCode::Success
    );
    watcher.send(&SubscribePacket::new(1).add_filter("wills/#", QoS::AtMostOnce));
    assert!(matches!(watcher.recv(), Some(Packet::SubAck(_))));
    // Will delay 60 s, session expiry 1 s: the will goes after 1 s.
    let mut will = WillMessage::new("wills/dev1", b"gone".to_vec());
    will.properties.will_delay_interval = Some(60);
    let o = ConnectOptions::new("mortal")
        .with_credentials("guest", "guest")
        .with_clean_start(true)
        .with_session_expiry_interval(1)
        .with_will(will);
    let mut c = Raw::open(&b, 5);
    assert_eq!(connack_code(&c.connect_with(o)), ReasonCode::Success);
    let lost = Instant::now();
    drop(c);
    match watcher.recv() {
        Some(Packet::Publish(p)) => assert_eq!(p.topic_name, "wills/dev1"),
        other => panic!("expected the will, got {other:?}"),
    }
    assert!(
        lost.elapsed() < Duration::from_secs(10),
        "sent at the session's end, not after 60 s"
    );
}
