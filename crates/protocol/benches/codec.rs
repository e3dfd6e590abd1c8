//! Frame decode/encode on the message hot path.
use std::hint::black_box;

use berth_protocol::codec::{self, decode_method, encode_properties};
use berth_protocol::frame::decode_frame;
use berth_protocol::methods::{basic, AMQPClass};
use berth_protocol::AMQPProperties;
use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn publish_frames(body_len: usize) -> BytesMut {
    let mut b = BytesMut::new();
    codec::encode_method(
        &mut b,
        1,
        &AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "amq.topic".into(),
            routing_key: "orders.eu.created".into(),
            mandatory: false,
            immediate: false,
        })),
    );
    let props = encode_properties(&AMQPProperties::default().with_delivery_mode(2));
    codec::encode_content(&mut b, 1, &props, &vec![7u8; body_len], 131_072);
    b
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish_decode");
    for size in [128usize, 2048, 16384] {
        let wire = publish_frames(size);
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("{size}B"), |b| {
            b.iter(|| {
                let mut buf = wire.clone();
                let m = decode_frame(&mut buf, 131_072).unwrap().unwrap();
                black_box(decode_method(&m.payload).unwrap());
                let h = decode_frame(&mut buf, 131_072).unwrap().unwrap();
                black_box(codec::decode_content_header(&h.payload).unwrap());
                black_box(decode_frame(&mut buf, 131_072).unwrap().unwrap());
            });
        });
    }
    g.finish();

    let mut g = c.benchmark_group("deliver_encode");
    let props = encode_properties(&AMQPProperties::default().with_delivery_mode(2));
    for size in [128usize, 2048, 16384] {
        let body = vec![7u8; size];
        let mut out = BytesMut::with_capacity(64 * 1024);
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("{size}B"), |b| {
            b.iter(|| {
                out.clear();
                codec::encode_deliver(
                    &mut out,
                    1,
                    "amq.ctag-1",
                    42,
                    false,
                    "amq.topic",
                    "orders.eu.created",
                );
                codec::encode_content(&mut out, 1, &props, &body, 131_072);
                black_box(out.len());
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
