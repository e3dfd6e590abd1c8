//! Writes the fuzz targets' seed corpus into `fuzz/corpus/<target>/`: valid
//! encodings made by berth's own encoders, i.e. the bytes the golden-bytes
//! tests pin (docs/FORMAT.md, the AMQP frames of a publish), so the fuzzer
//! starts from inputs that get past every checksum and length check.
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example seed_corpus
//!
//! Deterministic: running it again rewrites the same files.

use std::borrow::Cow;
use std::path::Path;

use berth_broker::durable::{encode_message, MessageHead, MessageParts, StoredTimes};
use berth_broker::meta::{ExchangeDef, MetaCommand, QueueDef};
use berth_protocol::codec::{encode_content, encode_heartbeat, encode_method, encode_properties};
use berth_protocol::frame::FRAME_MIN_SIZE;
use berth_protocol::{methods, AMQPClass, AMQPProperties, AMQPValue, FieldTable, LongString};
use berth_store::checkpoint::{encode as encode_checkpoint, CheckpointInfo, ReplayFrom};
use berth_store::index::{Index, Loc};
use berth_store::record::{encode as encode_record, Record};
use berth_store::{MsgId, QueueId};
use bytes::{BufMut, BytesMut};

/// A durable queue's stored definition (the value of its metadata key).
fn queue_value(id: u64, auto_delete: bool, arguments: &FieldTable) -> Vec<u8> {
    MetaCommand::PutQueue(QueueDef {
        vhost: "/".into(),
        name: "q1".into(),
        id,
        auto_delete,
        arguments: arguments.clone(),
    })
    .encode()
    .1
    .expect("a put has a value")
}

/// A durable exchange's stored definition (the value of its metadata key).
fn exchange_value(
    kind: &str,
    auto_delete: bool,
    internal: bool,
    arguments: &FieldTable,
) -> Vec<u8> {
    MetaCommand::PutExchange(ExchangeDef {
        vhost: "/".into(),
        name: "ex".into(),
        kind: kind.into(),
        auto_delete,
        internal,
        arguments: arguments.clone(),
        delayed_id: None,
    })
    .encode()
    .1
    .expect("a put has a value")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("create corpus directory");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

fn properties() -> Vec<u8> {
    let mut headers = FieldTable::default();
    headers.insert("x-match".into(), AMQPValue::LongString("all".into()));
    headers.insert("n".into(), AMQPValue::LongLongInt(-7));
    headers.insert("f".into(), AMQPValue::Double(1.5));
    let mut nested = FieldTable::default();
    nested.insert("a".into(), AMQPValue::Boolean(true));
    headers.insert("t".into(), AMQPValue::FieldTable(nested));
    let props = AMQPProperties::default()
        .with_content_type("text/plain".into())
        .with_delivery_mode(2)
        .with_priority(3)
        .with_expiration("60000".into())
        .with_message_id("m-1".into())
        .with_headers(headers);
    encode_properties(&props).to_vec()
}

fn publish_method(out: &mut BytesMut, channel: u16, exchange: &str, routing_key: &str) {
    let publish = methods::basic::Publish {
        exchange: exchange.into(),
        routing_key: routing_key.into(),
        mandatory: true,
        immediate: false,
    };
    encode_method(
        out,
        channel,
        &AMQPClass::Basic(methods::basic::AMQPMethod::Publish(publish)),
    );
}

/// A client's publish as it crosses the wire: method, header, body frames.
fn publish_frames(body: &[u8], frame_max: u32) -> BytesMut {
    let mut out = BytesMut::new();
    publish_method(&mut out, 1, "amq.topic", "a.b.c");
    encode_content(&mut out, 1, &properties(), body, frame_max);
    out
}

fn frames() {
    // The first byte picks frame_max = 4096 << (byte % 6).
    let mut seed = vec![0u8];
    seed.extend_from_slice(&publish_frames(b"hello", FRAME_MIN_SIZE));
    write("frame", "publish", &seed);

    let mut seed = vec![0u8];
    let mut frames = publish_frames(&[0xab; 9000], FRAME_MIN_SIZE);
    encode_heartbeat(&mut frames);
    seed.extend_from_slice(&frames);
    write("frame", "publish-multi-frame", &seed);

    let mut out = BytesMut::new();
    encode_heartbeat(&mut out);
    let qos = methods::basic::Qos {
        prefetch_count: 10,
        global: false,
    };
    encode_method(
        &mut out,
        1,
        &AMQPClass::Basic(methods::basic::AMQPMethod::Qos(qos)),
    );
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongInt(1000));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(LongString::from("dlx")),
    );
    let declare = methods::queue::Declare {
        queue: "q".into(),
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        nowait: false,
        arguments: args,
    };
    encode_method(
        &mut out,
        2,
        &AMQPClass::Queue(methods::queue::AMQPMethod::Declare(declare)),
    );
    let ack = methods::basic::Ack {
        delivery_tag: 42,
        multiple: true,
    };
    encode_method(
        &mut out,
        1,
        &AMQPClass::Basic(methods::basic::AMQPMethod::Ack(ack)),
    );
    let mut seed = vec![1u8];
    seed.extend_from_slice(&out);
    write("frame", "heartbeat-qos-declare-ack", &seed);
}

/// The content target's compact frames: `kind u8 | channel u8 | len u16 LE | payload`.
fn compact(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(kind);
    out.push(1);
    out.extend_from_slice(&u16::try_from(payload.len()).expect("small").to_le_bytes());
    out.extend_from_slice(payload);
}

fn content() {
    let mut method = BytesMut::new();
    publish_method(&mut method, 1, "", "q");
    let method_payload = &method[7..method.len() - 1];
    let props = properties();
    let header = |body_size: u64| {
        let mut h = BytesMut::new();
        h.put_u16(60);
        h.put_u16(0);
        h.put_u64(body_size);
        h.extend_from_slice(&props);
        h.to_vec()
    };
    let mut seed = Vec::new();
    compact(&mut seed, 1, method_payload);
    compact(&mut seed, 2, &header(11));
    compact(&mut seed, 3, b"hello ");
    compact(&mut seed, 3, b"world");
    compact(&mut seed, 1, method_payload);
    compact(&mut seed, 2, &header(0));
    write("content", "two-publishes", &seed);

    let mut seed = Vec::new();
    compact(&mut seed, 1, method_payload);
    compact(&mut seed, 2, &header(100_000));
    compact(&mut seed, 3, &[7; 300]);
    write("content", "too-large", &seed);
}

fn records() {
    let mut segment = Vec::new();
    let queues = [QueueId(7), QueueId(9)];
    let payload = encode_message("ex", "a.b", &properties(), b"hello").expect("short names");
    let records = [
        (
            1,
            Record::MetaPut {
                key: b"q\0/\0q1",
                value: &queue_value(7, false, &FieldTable::default()),
            },
        ),
        (
            2,
            Record::Publish {
                msg: MsgId(0x0102),
                queues: Cow::Borrowed(&queues),
                payload: &payload,
            },
        ),
        (
            3,
            Record::Remove {
                queue: QueueId(7),
                msgs: Cow::Borrowed(&[MsgId(0x0102), MsgId(5)]),
            },
        ),
        (
            4,
            Record::Relocate {
                msg: MsgId(0x0102),
                queues: Cow::Borrowed(&queues[1..]),
                payload: &payload,
            },
        ),
        (5, Record::Purge { queue: QueueId(9) }),
        (6, Record::MetaDelete { key: b"q\0/\0q1" }),
        (0, Record::Hole { body_len: 24 }),
    ];
    for (i, (lsn, r)) in records.iter().enumerate() {
        let mut one = Vec::new();
        encode_record(0, *lsn, r, &mut one);
        write("record", &format!("{i}-{:?}", r.kind()), &one);
        segment.extend_from_slice(&one);
    }
    write("record", "all-kinds", &segment);
}

fn checkpoints() {
    let mut index = Index::default();
    index.msg_id_hw = 0x0203;
    index.meta.insert(
        b"q\0/\0q1".to_vec(),
        queue_value(7, false, &FieldTable::default()),
    );
    index.meta.insert(
        b"e\0/\0ex".to_vec(),
        exchange_value("topic", false, false, &FieldTable::default()),
    );
    let loc = |seg, offset| Loc {
        seg,
        offset,
        len: 64,
    };
    index.insert(MsgId(1), &[QueueId(7)], loc(1, 32));
    index.insert(MsgId(2), &[QueueId(7), QueueId(9)], loc(1, 96));
    index.insert(MsgId(0x0203), &[QueueId(9)], loc(2, 32));
    let info = CheckpointInfo {
        lsn: 17,
        replay: ReplayFrom { seg: 2, offset: 96 },
    };
    // The checkpoint target decodes as group 3.
    write(
        "checkpoint",
        "three-messages",
        &encode_checkpoint(3, info, &index),
    );
    write(
        "checkpoint",
        "empty",
        &encode_checkpoint(3, info, &Index::default()),
    );
}

fn payloads() {
    write(
        "payload",
        "message",
        &encode_message("ex", "a.b", &properties(), b"hello").expect("short names"),
    );
    write(
        "payload",
        "message-golden",
        &encode_message("ex", "a.b", b"\x10\x00\x02", b"hello").expect("short names"),
    );
    // With its times (manifest version 3), as
    // `golden_bytes_timed_message_payload` pins it.
    let times = StoredTimes {
        enqueued_unix_ms: 0x0102_0304_0506_0708,
        expiration_ms: Some(3_000),
    };
    let head = MessageHead::timed(Some(times), "ex", "a.b", 3).expect("short names");
    let parts = MessageParts {
        head: head.as_bytes(),
        properties: &bytes::Bytes::from_static(b"\x10\x00\x02"),
        body: &bytes::Bytes::from_static(b"hello"),
    };
    write("payload", "message-timed", &parts.to_bytes());
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongInt(1000));
    args.insert("x-max-length".into(), AMQPValue::LongInt(10));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish-dlx".into()),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("dlx".into()),
    );
    args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(9));
    write("payload", "queue-definition", &queue_value(7, false, &args));
    write(
        "payload",
        "exchange-definition",
        &exchange_value("headers", true, false, &FieldTable::default()),
    );
}

/// A real certificate with a subject and SANs of every supported type
/// (the one `crates/certname/tests/names.rs` pins).
fn certificates() {
    write(
        "certname",
        "alice.der",
        include_bytes!("../crates/certname/tests/data/alice.der"),
    );
}

fn main() {
    frames();
    content();
    records();
    checkpoints();
    payloads();
    certificates();
    println!(
        "seed corpus written to {}/corpus",
        env!("CARGO_MANIFEST_DIR")
    );
}
