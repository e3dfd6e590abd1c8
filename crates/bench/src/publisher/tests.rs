use super::*;
use amq_protocol::frame::AMQPContentHeader;

/// What amq-protocol (lapin's encoder) produces for the same publish.
fn reference(routing_key: &str, body: &[u8], frame_max: u32) -> Vec<u8> {
    let mut frames = vec![
        AMQPFrame::Method(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: ShortString::from(""),
                routing_key: ShortString::from(routing_key),
                mandatory: false,
                immediate: false,
            })),
        ),
        AMQPFrame::Header(
            CHANNEL,
            AMQPContentHeader {
                class_id: CLASS_BASIC,
                body_size: body.len() as u64,
                properties: basic::AMQPProperties::default().with_delivery_mode(2),
            },
        ),
    ];
    let chunk = frame_max as usize - FRAME_OVERHEAD_BYTES;
    for c in body.chunks(chunk) {
        frames.push(AMQPFrame::Body(CHANNEL, c.to_vec()));
    }
    let mut out = Vec::new();
    for f in &frames {
        out = cookie_factory::gen_simple(gen_frame(f), out).unwrap();
    }
    out
}

#[test]
fn template_bytes_are_amq_protocols_bytes() {
    for (key, size, frame_max) in [
        ("q", 1024, 131_072),
        ("berth-bench-fanin-1-0000-shared-c10", 16_384, 4096),
        ("", 8, 4096),
        ("exactly-one-frame", 4096 - FRAME_OVERHEAD_BYTES, 4096),
        ("one-byte-over", 4096 - FRAME_OVERHEAD_BYTES + 1, 4096),
    ] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let t = PublishTemplate::new(key, &body, frame_max).unwrap();
        assert_eq!(
            t.bytes(),
            &reference(key, &body, frame_max)[..],
            "{key} {size}"
        );
    }
}

#[test]
fn an_empty_body_has_no_body_frame() {
    let t = PublishTemplate::new("q", b"", 4096).unwrap();
    let mut frames = Vec::new();
    let mut rest = t.bytes();
    while !rest.is_empty() {
        let (r, f) = parse_frame(rest).unwrap();
        frames.push(f);
        rest = r;
    }
    assert_eq!(frames.len(), 2, "{frames:?}");
}

#[test]
fn confirms_settle_single_multiple_and_out_of_order() {
    let mut c = Confirms::default();
    c.sent(5);
    assert_eq!(c.unconfirmed(), 5);
    c.settle(3, false, Outcome::Acked).unwrap();
    assert_eq!(
        (c.unconfirmed(), c.acked),
        (5, 1),
        "tag 3 alone retires nothing"
    );
    c.settle(2, true, Outcome::Acked).unwrap();
    assert_eq!((c.unconfirmed(), c.acked), (2, 3), "1..=3 settled");
    c.settle(5, false, Outcome::Nacked).unwrap();
    assert_eq!((c.unconfirmed(), c.nacked), (2, 1));
    c.settle(4, true, Outcome::Acked).unwrap();
    assert_eq!((c.unconfirmed(), c.acked, c.nacked), (0, 4, 1));
    assert!(
        c.settle(5, false, Outcome::Acked).is_err(),
        "already settled"
    );
    assert!(
        c.settle(6, false, Outcome::Acked).is_err(),
        "never published"
    );
    c.sent(2);
    c.settle(7, true, Outcome::Acked).unwrap();
    assert_eq!((c.unconfirmed(), c.acked), (0, 6));
}

/// Frames cut at every boundary pattern (1 byte at a time, a frame
/// and a half per read, one frame larger than the buffer) come out
/// whole and in order.
#[test]
fn read_buf_reassembles_frames_cut_anywhere() {
    let ack = |tag| {
        frame(
            CHANNEL,
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                delivery_tag: tag,
                multiple: false,
            })),
        )
    };
    let mut big = vec![FRAME_BODY, 0, 1];
    big.extend_from_slice(&100_000u32.to_be_bytes());
    big.extend((0..100_000u32).map(|i| (i % 253) as u8));
    big.push(FRAME_END);
    let frames = [ack(1), ack(2), big, ack(3)];
    let stream = frames.concat();
    for cut in [1, 7, 13, 20, 21, 30, 4096, 70_000, stream.len()] {
        let mut r = ReadBuf::new();
        let mut got = Vec::new();
        let mut fed = 0;
        while fed < stream.len() {
            let room = r.room();
            let n = cut.min(room.len()).min(stream.len() - fed);
            room[..n].copy_from_slice(&stream[fed..fed + n]);
            r.filled(n);
            fed += n;
            while let Some((kind, ch, range)) = r.take().unwrap() {
                got.push((kind, ch, r.buf[range].to_vec()));
            }
        }
        assert_eq!(got.len(), frames.len(), "cut {cut}");
        for (f, (kind, ch, payload)) in frames.iter().zip(&got) {
            assert_eq!((*kind, *ch), (f[0], CHANNEL), "cut {cut}");
            assert!(
                payload[..] == f[FRAME_HEADER_BYTES..f.len() - 1],
                "cut {cut}: a payload differs"
            );
        }
    }
}

#[test]
fn a_bad_frame_end_is_an_error() {
    let mut r = ReadBuf::new();
    let mut f = frame(
        0,
        AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
    );
    *f.last_mut().unwrap() = 0;
    r.room()[..f.len()].copy_from_slice(&f);
    r.filled(f.len());
    assert!(r.take().is_err());
}

fn frame(channel: u16, m: AMQPClass) -> Vec<u8> {
    cookie_factory::gen_simple(gen_frame(&AMQPFrame::Method(channel, m)), Vec::new()).unwrap()
}

/// Writes one method frame to the publisher.
async fn send(s: &mut TcpStream, channel: u16, m: AMQPClass) {
    s.write_all(&frame(channel, m)).await.unwrap();
}

async fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 7];
    s.read_exact(&mut h).await.unwrap();
    let size = u32::from_be_bytes(h[3..7].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; size + 1];
    s.read_exact(&mut rest).await.unwrap();
    [h.to_vec(), rest].concat()
}

/// A broker that answers the handshake, takes three publishes and acks
/// them with frames cut into pieces across writes (one ack byte by
/// byte): the publisher must reassemble frames that span reads.
#[tokio::test]
async fn handshake_then_acks_split_across_reads() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let template = PublishTemplate::new("q", &[7u8; 5000], 4096).unwrap();
    let publishes_len = template.bytes().len() * 3;
    let broker = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut header = [0u8; 8];
        s.read_exact(&mut header).await.unwrap();
        assert_eq!(&header, PROTOCOL_HEADER);
        let start = connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: FieldTable::default(),
            mechanisms: LongString::from("AMQPLAIN PLAIN"),
            locales: LongString::from("en_US"),
        };
        send(
            &mut s,
            0,
            AMQPClass::Connection(connection::AMQPMethod::Start(start)),
        )
        .await;
        let start_ok = read_frame(&mut s).await;
        assert!(
            start_ok.windows(5).any(|w| w == b"\0u\0pw"),
            "PLAIN response with the URI's user and password"
        );
        let tune = connection::Tune {
            channel_max: 0,
            frame_max: 4096,
            heartbeat: 60,
        };
        send(
            &mut s,
            0,
            AMQPClass::Connection(connection::AMQPMethod::Tune(tune)),
        )
        .await;
        let _tune_ok = read_frame(&mut s).await;
        // connection.open, channel.open and confirm.select, each
        // answered with its -ok.
        for (ch, ok) in [
            (
                0,
                AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
            ),
            (
                CHANNEL,
                AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
            ),
            (
                CHANNEL,
                AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
            ),
        ] {
            let _request = read_frame(&mut s).await;
            send(&mut s, ch, ok).await;
        }
        let mut publishes = vec![0u8; publishes_len];
        s.read_exact(&mut publishes).await.unwrap();
        let ack = |tag, multiple| {
            frame(
                CHANNEL,
                AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
                    delivery_tag: tag,
                    multiple,
                })),
            )
        };
        // The first ack byte by byte but its last byte, which goes
        // with the start of the second: one read then holds a whole
        // frame and a partial one that the next read completes.
        let (first, last) = (ack(2, true), ack(3, false));
        for b in &first[..first.len() - 1] {
            s.write_all(&[*b]).await.unwrap();
            s.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        s.write_all(&[&first[first.len() - 1..], &last[..5]].concat())
            .await
            .unwrap();
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
        s.write_all(&last[5..]).await.unwrap();
        publishes
    });
    let uri = format!("amqp://u:pw@127.0.0.1:{port}/%2f");
    let mut p = Publisher::connect(&uri, "test").await.unwrap();
    assert_eq!(
        p.frame_max(),
        4096,
        "the broker's smaller frame_max is taken"
    );
    p.publish(&template, 3).await.unwrap();
    assert_eq!(p.unconfirmed(), 3);
    p.wait_confirms(0).await.unwrap();
    assert_eq!((p.published(), p.acked(), p.nacked()), (3, 3, 0));
    let sent = broker.await.unwrap();
    assert_eq!(
        sent,
        template.bytes().repeat(3),
        "three publishes, one after another"
    );
}

#[test]
fn a_routing_key_over_255_bytes_is_refused() {
    assert!(PublishTemplate::new(&"k".repeat(256), b"x", 4096).is_err());
}
