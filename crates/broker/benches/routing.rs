//! Routing and enqueue cost per message, per exchange type.
use std::hint::black_box;
use std::time::Instant;

use berth_broker::message::Message;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare};
use berth_broker::Broker;
use berth_protocol::codec::encode_properties;
use berth_protocol::{AMQPProperties, FieldTable};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    let broker = Broker::new(["/"]);
    let v = broker.vhost("/").unwrap();
    let now = Instant::now();
    for (name, kind) in [
        ("bx.direct", "direct"),
        ("bx.topic", "topic"),
        ("bx.fanout", "fanout"),
    ] {
        v.declare_exchange(
            name,
            &ExchangeDeclare {
                kind: kind.into(),
                ..Default::default()
            },
        )
        .unwrap();
    }
    // 100 queues bound with distinct keys/patterns; one matches each publish.
    for i in 0..100 {
        let q = format!("bq{i}");
        v.declare_queue(
            1,
            &q,
            &QueueDeclare {
                arguments: FieldTable::default(),
                ..Default::default()
            },
            now,
        )
        .unwrap();
        v.bind_queue(
            1,
            &q,
            "bx.direct",
            &format!("key.{i}"),
            &FieldTable::default(),
        )
        .unwrap();
        v.bind_queue(
            1,
            &q,
            "bx.topic",
            &format!("orders.{i}.*"),
            &FieldTable::default(),
        )
        .unwrap();
    }
    v.bind_queue(1, "bq0", "bx.fanout", "", &FieldTable::default())
        .unwrap();
    let props = encode_properties(&AMQPProperties::default());
    let body = Bytes::from(vec![0u8; 128]);
    let mut g = c.benchmark_group("route_and_enqueue");
    g.throughput(Throughput::Elements(1));
    for (name, ex, key) in [
        ("default", "", "bq7"),
        ("direct_100_bindings", "bx.direct", "key.7"),
        ("topic_100_bindings", "bx.topic", "orders.7.created"),
        ("fanout_1_binding", "bx.fanout", ""),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let m = Message::new(ex.into(), key.into(), props.clone(), body.clone()).unwrap();
                black_box(v.publish(ex, &m, now, &mut || Box::new(|_| {})).unwrap());
            });
            // Keep queues from growing without bound between benchmarks.
            for i in 0..100 {
                v.purge_queue(1, &format!("bq{i}"), now).unwrap();
            }
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
