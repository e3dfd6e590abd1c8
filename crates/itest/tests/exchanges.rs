//! Exchanges: declare/delete/bind/unbind with every flag and error code, and
//! routing through every exchange type.

use berth_itest::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, ExchangeUnbindOptions, QueueBindOptions, QueueDeclareOptions,
};
use berth_itest::lapin::types::FieldTable;
use berth_itest::lapin::{BasicProperties, Channel, ExchangeKind};
use berth_itest::*;

async fn declare_exchange(
    ch: &Channel,
    name: &str,
    kind: ExchangeKind,
    options: ExchangeDeclareOptions,
) -> lapin::Result<()> {
    bounded(
        "exchange.declare",
        ch.exchange_declare(name.into(), kind, options, FieldTable::default()),
    )
    .await
}

async fn passive_exchange(ch: &Channel, name: &str) -> lapin::Result<()> {
    declare_exchange(
        ch,
        name,
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        },
    )
    .await
}

async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str, args: FieldTable) {
    try_bind(ch, queue, exchange, key, args)
        .await
        .unwrap_or_else(|e| panic!("queue.bind {queue} to {exchange} with {key:?}: {e}"));
}

async fn try_bind(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
    args: FieldTable,
) -> lapin::Result<()> {
    bounded(
        "queue.bind",
        ch.queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            args,
        ),
    )
    .await
}

async fn delete_exchange(ch: &Channel, name: &str, if_unused: bool) -> lapin::Result<()> {
    bounded(
        "exchange.delete",
        ch.exchange_delete(
            name.into(),
            ExchangeDeleteOptions {
                if_unused,
                nowait: false,
            },
        ),
    )
    .await
}

/// Publishes `key` as body and routing key, then returns which of `queues`
/// received it (by index), draining them.
async fn routed_to(ch: &Channel, exchange: &str, key: &str, queues: &[String]) -> Vec<usize> {
    publish(ch, exchange, key, key.as_bytes()).await;
    received_by(ch, queues).await
}

async fn received_by(ch: &Channel, queues: &[String]) -> Vec<usize> {
    // A synchronous round trip on the publishing channel orders the check
    // after the publish has been routed.
    let mut hit = Vec::new();
    for (i, q) in queues.iter().enumerate() {
        let got = drain(ch, q).await;
        assert!(got.len() <= 1, "queue {q} got {} copies", got.len());
        if !got.is_empty() {
            hit.push(i);
        }
    }
    hit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exchange_type_declares_redeclares_and_passes_passive_check() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        for kind in [
            ExchangeKind::Direct,
            ExchangeKind::Fanout,
            ExchangeKind::Topic,
            ExchangeKind::Headers,
        ] {
            let ch = open_channel(&conn).await;
            let name = unique("x-every");
            for passive in [false, false, true] {
                let options = ExchangeDeclareOptions {
                    passive,
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                };
                declare_exchange(&ch, &name, kind.clone(), options)
                    .await
                    .unwrap_or_else(|e| panic!("declare {kind:?} {name} {options:?}: {e}"));
            }
            delete_exchange(&ch, &name, false)
                .await
                .expect("exchange.delete");
            let gone = passive_exchange(&ch, &name).await;
            expect_reply(gone, 404, &[&name]);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_missing_exchange_fails_404() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("x-missing");
        let text = expect_reply(passive_exchange(&ch, &name).await, 404, &[&name]);
        assert_eq!(
            text,
            format!("NOT_FOUND - no exchange '{name}' in vhost '/'")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_ignores_type_and_flags() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("x-passive");
        declare_exchange(
            &ch,
            &name,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        declare_exchange(
            &ch,
            &name,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
        .expect("passive declare with other type and flags");
        delete_exchange(&ch, &name, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclare_with_different_type_or_flags_fails_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let name = unique("x-inequivalent");
        declare_exchange(
            &ch,
            &name,
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let cases: [(ExchangeKind, ExchangeDeclareOptions, &str); 4] = [
            (
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                "'type'",
            ),
            (
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                "'durable'",
            ),
            (
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..ExchangeDeclareOptions::default()
                },
                "'auto_delete'",
            ),
            (
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    internal: true,
                    ..ExchangeDeclareOptions::default()
                },
                "'internal'",
            ),
        ];
        for (kind, options, arg) in cases {
            let ch = open_channel(&conn).await;
            let result = declare_exchange(&ch, &name, kind, options).await;
            expect_reply(result, 406, &["inequivalent arg", arg, &name]);
        }
        let ch = open_channel(&conn).await;
        delete_exchange(&ch, &name, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_of_new_exchange_with_reserved_amq_prefix_fails_403() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let name = format!("amq.{}", unique("x"));
        let result = declare_exchange(
            &ch,
            &name,
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await;
        expect_reply(result, 403, &[&name, "amq."]);
        // The prefix is checked only for new exchanges: an equivalent
        // redeclaration of a predefined one is fine, an inequivalent one 406.
        let ch = open_channel(&conn).await;
        declare_exchange(
            &ch,
            "amq.direct",
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
        .expect("equivalent redeclaration of amq.direct");
        let result = declare_exchange(
            &ch,
            "amq.direct",
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await;
        expect_reply(result, 406, &["amq.direct", "'type'"]);
        // ...but checking it passively is fine.
        let ch = open_channel(&conn).await;
        for name in [
            "amq.direct",
            "amq.fanout",
            "amq.topic",
            "amq.headers",
            "amq.match",
        ] {
            passive_exchange(&ch, name)
                .await
                .unwrap_or_else(|e| panic!("predefined exchange {name} should exist: {e}"));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_of_unknown_exchange_type_fails_503_and_closes_connection() {
    within(async {
        let broker = Broker::start();
        let (conn, ch) = broker.channel().await;
        let name = unique("x-bogus-type");
        let result = declare_exchange(
            &ch,
            &name,
            ExchangeKind::Custom("x-no-such-type".into()),
            ExchangeDeclareOptions::default(),
        )
        .await;
        expect_reply(result, 503, &["x-no-such-type"]);
        let next = bounded("channel.open", conn.create_channel()).await;
        assert!(next.is_err(), "a 503 is a connection exception: {next:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_missing_exchange_succeeds() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        delete_exchange(&ch, &unique("x-never"), false)
            .await
            .expect("exchange.delete of a missing exchange is ok");
        delete_exchange(&ch, &unique("x-never"), true)
            .await
            .expect("exchange.delete if-unused of a missing exchange is ok");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_unused_fails_406_while_bound_and_succeeds_after_unbind() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let x = unique("x-in-use");
        declare_exchange(
            &ch,
            &x,
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let q = declare_queue(&ch, "q-in-use", FieldTable::default()).await;
        bind(&ch, &q, &x, "k", FieldTable::default()).await;
        let text = expect_reply(delete_exchange(&ch, &x, true).await, 406, &[&x, "in use"]);
        assert_eq!(
            text,
            format!("PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use")
        );
        let ch = open_channel(&conn).await;
        bounded(
            "queue.unbind",
            ch.queue_unbind(
                q.as_str().into(),
                x.as_str().into(),
                "k".into(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("queue.unbind");
        delete_exchange(&ch, &x, true)
            .await
            .expect("delete if-unused after unbind");
        expect_reply(passive_exchange(&ch, &x).await, 404, &[&x]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_without_if_unused_removes_bindings() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let x = unique("x-del");
        declare_exchange(
            &ch,
            &x,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let q = declare_queue(&ch, "q-del", FieldTable::default()).await;
        bind(&ch, &q, &x, "", FieldTable::default()).await;
        delete_exchange(&ch, &x, false).await.expect("delete");
        // Redeclared, the exchange starts without the old binding.
        declare_exchange(
            &ch,
            &x,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("redeclare");
        assert_eq!(routed_to(&ch, &x, "k", &[q]).await, Vec::<usize>::new());
        delete_exchange(&ch, &x, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_and_predefined_exchanges_cannot_be_deleted_403() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        expect_reply(
            delete_exchange(&ch, "", false).await,
            403,
            &["default exchange"],
        );
        let ch = open_channel(&conn).await;
        expect_reply(
            delete_exchange(&ch, "amq.direct", false).await,
            403,
            &["amq.direct"],
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_missing_exchange_closes_channel_404() {
    within(async {
        let broker = Broker::start();
        let (conn, ch) = broker.channel().await;
        let x = unique("x-absent");
        let err = publish_fails(&ch, &x, "k", b"lost", BasicProperties::default()).await;
        let text = assert_reply(&err, 404, &[&x]);
        assert_eq!(text, format!("NOT_FOUND - no exchange '{x}' in vhost '/'"));
        assert!(conn.status().connected());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_exchange_refuses_publish_403_but_routes_via_exchange_binding() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let front = unique("x-front");
        let inner = unique("x-internal");
        declare_exchange(
            &ch,
            &front,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare front");
        declare_exchange(
            &ch,
            &inner,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                internal: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
        .expect("declare internal");
        let q = declare_queue(&ch, "q-internal", FieldTable::default()).await;
        bind(&ch, &q, &inner, "", FieldTable::default()).await;
        bounded(
            "exchange.bind",
            ch.exchange_bind(
                inner.as_str().into(),
                front.as_str().into(),
                "".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.bind");
        assert_eq!(
            routed_to(&ch, &front, "k", std::slice::from_ref(&q)).await,
            [0]
        );
        let err = publish_fails(
            &ch,
            &inner,
            "k",
            b"direct to internal",
            BasicProperties::default(),
        )
        .await;
        assert_reply(&err, 403, &[&inner, "internal"]);
        let ch = open_channel(&conn).await;
        assert!(drain(&ch, &q).await.is_empty());
        delete_exchange(&ch, &front, false).await.expect("delete");
        delete_exchange(&ch, &inner, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_exchange_goes_when_its_last_binding_goes() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let x = unique("x-auto");
        declare_exchange(
            &ch,
            &x,
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
        .expect("declare");
        // Never bound: it stays.
        passive_exchange(&ch, &x)
            .await
            .expect("unbound auto-delete exchange stays");
        let q1 = declare_queue(&ch, "q-auto", FieldTable::default()).await;
        let q2 = declare_queue(&ch, "q-auto", FieldTable::default()).await;
        bind(&ch, &q1, &x, "a", FieldTable::default()).await;
        bind(&ch, &q2, &x, "b", FieldTable::default()).await;
        let unbind = |q: String, k: &'static str| {
            let ch = ch.clone();
            let x = x.clone();
            async move {
                bounded(
                    "queue.unbind",
                    ch.queue_unbind(
                        q.as_str().into(),
                        x.as_str().into(),
                        k.into(),
                        FieldTable::default(),
                    ),
                )
                .await
                .expect("queue.unbind");
            }
        };
        unbind(q1, "a").await;
        passive_exchange(&ch, &x).await.expect("still one binding");
        // Deleting the bound queue removes the last binding.
        bounded(
            "queue.delete",
            ch.queue_delete(q2.as_str().into(), Default::default()),
        )
        .await
        .expect("queue.delete");
        expect_reply(passive_exchange(&ch, &x).await, 404, &[&x]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_to_exchange_binding_routes_until_unbound() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let src = unique("x-src");
        let dst = unique("x-dst");
        declare_exchange(
            &ch,
            &src,
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        declare_exchange(
            &ch,
            &dst,
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let q = declare_queue(&ch, "q-e2e", FieldTable::default()).await;
        bind(&ch, &q, &dst, "a.b", FieldTable::default()).await;
        bounded(
            "exchange.bind",
            ch.exchange_bind(
                dst.as_str().into(),
                src.as_str().into(),
                "a.*".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.bind");
        let qs = [q];
        assert_eq!(routed_to(&ch, &src, "a.b", &qs).await, [0]);
        assert_eq!(routed_to(&ch, &src, "a.c", &qs).await, Vec::<usize>::new());
        // Rebinding the same triple is idempotent: still one copy.
        bounded(
            "exchange.bind",
            ch.exchange_bind(
                dst.as_str().into(),
                src.as_str().into(),
                "a.*".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.bind again");
        assert_eq!(routed_to(&ch, &src, "a.b", &qs).await, [0]);
        bounded(
            "exchange.unbind",
            ch.exchange_unbind(
                dst.as_str().into(),
                src.as_str().into(),
                "a.*".into(),
                ExchangeUnbindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.unbind");
        assert_eq!(routed_to(&ch, &src, "a.b", &qs).await, Vec::<usize>::new());
        delete_exchange(&ch, &src, false).await.expect("delete");
        delete_exchange(&ch, &dst, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_bind_with_missing_side_fails_404() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let real = unique("x-real");
        let missing = unique("x-missing");
        declare_exchange(
            &ch,
            &real,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        for (dst, src) in [(&real, &missing), (&missing, &real)] {
            let ch = open_channel(&conn).await;
            let result = bounded(
                "exchange.bind",
                ch.exchange_bind(
                    dst.as_str().into(),
                    src.as_str().into(),
                    "".into(),
                    ExchangeBindOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await;
            expect_reply(result, 404, &[&missing]);
        }
        let ch = open_channel(&conn).await;
        delete_exchange(&ch, &real, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_bind_to_missing_exchange_or_queue_fails_404() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-bind", FieldTable::default()).await;
        let missing_x = unique("x-missing");
        let text = expect_reply(
            try_bind(&ch, &q, &missing_x, "k", FieldTable::default()).await,
            404,
            &[&missing_x],
        );
        assert_eq!(
            text,
            format!("NOT_FOUND - no exchange '{missing_x}' in vhost '/'")
        );
        let ch = open_channel(&conn).await;
        let missing_q = unique("q-missing");
        let text = expect_reply(
            try_bind(&ch, &missing_q, "amq.direct", "k", FieldTable::default()).await,
            404,
            &[&missing_q],
        );
        assert_eq!(
            text,
            format!("NOT_FOUND - no queue '{missing_q}' in vhost '/'")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_to_or_unbinding_from_default_exchange_fails_403() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-default-bind", FieldTable::default()).await;
        expect_reply(
            try_bind(&ch, &q, "", "k", FieldTable::default()).await,
            403,
            &["default exchange"],
        );
        let ch = open_channel(&conn).await;
        let result = bounded(
            "queue.unbind",
            ch.queue_unbind(
                q.as_str().into(),
                "".into(),
                q.as_str().into(),
                FieldTable::default(),
            ),
        )
        .await;
        expect_reply(result, 403, &["default exchange"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_routes_by_queue_name_only() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let a = declare_queue(&ch, "q-default", FieldTable::default()).await;
        let b = declare_queue(&ch, "q-default", FieldTable::default()).await;
        let qs = [a.clone(), b.clone()];
        assert_eq!(routed_to(&ch, "", &a, &qs).await, [0]);
        assert_eq!(routed_to(&ch, "", &b, &qs).await, [1]);
        assert_eq!(
            routed_to(&ch, "", "no-such-queue", &qs).await,
            Vec::<usize>::new()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchanges_route_on_exact_key() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let user = unique("x-direct");
        declare_exchange(
            &ch,
            &user,
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        for x in ["amq.direct", user.as_str()] {
            let a = declare_queue(&ch, "q-direct", FieldTable::default()).await;
            let b = declare_queue(&ch, "q-direct", FieldTable::default()).await;
            bind(&ch, &a, x, "red", FieldTable::default()).await;
            bind(&ch, &b, x, "red", FieldTable::default()).await;
            bind(&ch, &b, x, "blue", FieldTable::default()).await;
            let qs = [a, b];
            assert_eq!(routed_to(&ch, x, "red", &qs).await, [0, 1], "{x} red");
            assert_eq!(routed_to(&ch, x, "blue", &qs).await, [1], "{x} blue");
            assert_eq!(
                routed_to(&ch, x, "Red", &qs).await,
                Vec::<usize>::new(),
                "{x} Red"
            );
            assert_eq!(
                routed_to(&ch, x, "", &qs).await,
                Vec::<usize>::new(),
                "{x} empty"
            );
        }
        delete_exchange(&ch, &user, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchanges_ignore_the_routing_key() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let user = unique("x-fanout");
        declare_exchange(
            &ch,
            &user,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        for x in ["amq.fanout", user.as_str()] {
            let a = declare_queue(&ch, "q-fanout", FieldTable::default()).await;
            let b = declare_queue(&ch, "q-fanout", FieldTable::default()).await;
            bind(&ch, &a, x, "", FieldTable::default()).await;
            bind(&ch, &b, x, "something", FieldTable::default()).await;
            let qs = [a, b];
            assert_eq!(routed_to(&ch, x, "anything", &qs).await, [0, 1], "{x}");
            assert_eq!(routed_to(&ch, x, "", &qs).await, [0, 1], "{x}");
        }
        delete_exchange(&ch, &user, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchanges_match_star_as_one_word_and_hash_as_zero_or_more() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let user = unique("x-topic");
        declare_exchange(
            &ch,
            &user,
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let patterns = [
            "a.*.c", "a.#", "#", "*.b", "#.c", "a.#.c", "*", "a.b.c", "#.b.#",
        ];
        // For each routing key: the patterns (by index) it must match.
        let expectations: [(&str, &[usize]); 10] = [
            ("a.b.c", &[0, 1, 2, 4, 5, 7, 8]),
            ("a.c", &[1, 2, 4, 5]),
            ("a", &[1, 2, 6]),
            ("x.b", &[2, 3, 8]),
            ("b", &[2, 6, 8]),
            ("a.x.y.c", &[1, 2, 4, 5]),
            ("a.b", &[1, 2, 3, 8]),
            ("c", &[2, 4, 6]),
            ("", &[2]),
            ("x.y.z", &[2]),
        ];
        for x in ["amq.topic", user.as_str()] {
            let mut qs = Vec::new();
            for p in patterns {
                let q = declare_queue(&ch, "q-topic", FieldTable::default()).await;
                bind(&ch, &q, x, p, FieldTable::default()).await;
                qs.push(q);
            }
            for (key, want) in expectations {
                let got = routed_to(&ch, x, key, &qs).await;
                let got_patterns: Vec<&str> = got.iter().map(|&i| patterns[i]).collect();
                let want_patterns: Vec<&str> = want.iter().map(|&i| patterns[i]).collect();
                assert_eq!(got_patterns, want_patterns, "{x}: routing key {key:?}");
            }
        }
        delete_exchange(&ch, &user, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_exchanges_match_all_or_any() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let user = unique("x-headers");
        declare_exchange(
            &ch,
            &user,
            ExchangeKind::Headers,
            ExchangeDeclareOptions::default(),
        )
        .await
        .expect("declare");
        let bindings = [
            table(&[
                ("x-match", lstr("all")),
                ("format", lstr("pdf")),
                ("type", lstr("report")),
            ]),
            table(&[
                ("x-match", lstr("any")),
                ("format", lstr("pdf")),
                ("type", lstr("log")),
            ]),
            // No x-match: "all" is the default.
            table(&[("format", lstr("zip"))]),
            // Integers compare as values.
            table(&[("x-match", lstr("all")), ("level", int(3))]),
        ];
        let cases: [(FieldTable, &[usize]); 6] = [
            (
                table(&[("format", lstr("pdf")), ("type", lstr("report"))]),
                &[0, 1],
            ),
            (table(&[("format", lstr("pdf"))]), &[1]),
            (
                table(&[("type", lstr("log")), ("extra", lstr("ignored"))]),
                &[1],
            ),
            (
                table(&[("format", lstr("zip")), ("type", lstr("report"))]),
                &[2],
            ),
            (table(&[("level", int(3))]), &[3]),
            (FieldTable::default(), &[]),
        ];
        for x in ["amq.headers", "amq.match", user.as_str()] {
            let mut qs = Vec::new();
            for args in &bindings {
                let q = declare_queue(&ch, "q-headers", FieldTable::default()).await;
                bind(&ch, &q, x, "ignored-key", args.clone()).await;
                qs.push(q);
            }
            for (headers, want) in &cases {
                publish_with(
                    &ch,
                    x,
                    "any-key",
                    b"h",
                    BasicProperties::default().with_headers(headers.clone()),
                )
                .await;
                let got = received_by(&ch, &qs).await;
                assert_eq!(&got, want, "{x}: headers {headers:?}");
            }
        }
        delete_exchange(&ch, &user, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbind_stops_routing_and_unbinding_unknown_binding_is_ok() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-unbind", FieldTable::default()).await;
        bind(&ch, &q, "amq.direct", "k1", FieldTable::default()).await;
        bind(&ch, &q, "amq.direct", "k2", FieldTable::default()).await;
        let qs = [q.clone()];
        assert_eq!(routed_to(&ch, "amq.direct", "k1", &qs).await, [0]);
        bounded(
            "queue.unbind",
            ch.queue_unbind(
                q.as_str().into(),
                "amq.direct".into(),
                "k1".into(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("queue.unbind");
        assert_eq!(
            routed_to(&ch, "amq.direct", "k1", &qs).await,
            Vec::<usize>::new()
        );
        assert_eq!(routed_to(&ch, "amq.direct", "k2", &qs).await, [0]);
        bounded(
            "queue.unbind",
            ch.queue_unbind(
                q.as_str().into(),
                "amq.direct".into(),
                "never-bound".into(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("unbinding an unknown binding is ok");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_unroutable_publish_is_returned_312_no_route() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        bounded(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .expect("confirm.select");
        let key = unique("nobody-listens");
        let confirm = bounded(
            "basic.publish",
            ch.basic_publish(
                "amq.direct".into(),
                key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                b"boomerang",
                BasicProperties::default().with_message_id("m-1".into()),
            ),
        )
        .await
        .expect("basic.publish");
        let confirmation = bounded("confirm", confirm).await.expect("confirm");
        assert!(
            confirmation.is_ack(),
            "an unroutable message is still acked"
        );
        let returned = confirmation
            .take_message()
            .expect("the mandatory message comes back as basic.return before its ack");
        assert_eq!(returned.reply_code, 312);
        assert_eq!(returned.reply_text.as_str(), "NO_ROUTE");
        assert_eq!(returned.delivery.exchange.as_str(), "amq.direct");
        assert_eq!(returned.delivery.routing_key.as_str(), key);
        assert_eq!(returned.delivery.data, b"boomerang");
        assert_eq!(
            returned
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str()),
            Some("m-1")
        );

        // Routable mandatory and unroutable non-mandatory publishes are not returned.
        let q = declare_queue(&ch, "q-mandatory", FieldTable::default()).await;
        for (exchange, rk, mandatory) in
            [("", q.as_str(), true), ("amq.direct", key.as_str(), false)]
        {
            let confirmation = bounded(
                "publish",
                bounded(
                    "basic.publish",
                    ch.basic_publish(
                        exchange.into(),
                        rk.into(),
                        BasicPublishOptions {
                            mandatory,
                            immediate: false,
                        },
                        b"x",
                        BasicProperties::default(),
                    ),
                )
                .await
                .expect("basic.publish"),
            )
            .await
            .expect("confirm");
            assert!(confirmation.is_ack());
            assert!(
                confirmation.take_message().is_none(),
                "{exchange}/{rk} mandatory={mandatory}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_return_arrives_without_confirm_mode() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        bounded(
            "basic.publish",
            ch.basic_publish(
                "".into(),
                unique("no-such-queue").as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                b"back",
                BasicProperties::default(),
            ),
        )
        .await
        .expect("basic.publish");
        // basic.return precedes the answer to a later synchronous command.
        let _ = declare_queue(&ch, "q-sync", FieldTable::default()).await;
        let returned = bounded("returned messages", ch.wait_for_confirms())
            .await
            .expect("drain returns");
        assert_eq!(returned.len(), 1, "{returned:?}");
        assert_eq!(returned[0].reply_code, 312);
        assert_eq!(returned[0].delivery.data, b"back");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_then_binding_a_durable_exchange_and_queue_routes() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let x = unique("x-durable");
        declare_exchange(
            &ch,
            &x,
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
        )
        .await
        .expect("declare");
        let q = unique("q-durable");
        bounded(
            "queue.declare",
            ch.queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .expect("queue.declare durable");
        bind(&ch, &q, &x, "k", FieldTable::default()).await;
        publish_with(
            &ch,
            &x,
            "k",
            b"kept",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await;
        assert_eq!(drain_strings(&ch, &q).await, ["kept"]);
        bounded(
            "queue.delete",
            ch.queue_delete(q.as_str().into(), Default::default()),
        )
        .await
        .expect("queue.delete");
        delete_exchange(&ch, &x, false).await.expect("delete");
    })
    .await;
}
