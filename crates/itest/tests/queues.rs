//! Queues: declare (passive, durable, exclusive, auto-delete, server-named),
//! bind/unbind, purge, delete (if-unused, if-empty), and their error codes.

use berth_itest::lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use berth_itest::lapin::types::FieldTable;
use berth_itest::lapin::{Channel, Queue};
use berth_itest::*;

async fn declare(
    ch: &Channel,
    name: &str,
    options: QueueDeclareOptions,
    args: FieldTable,
) -> lapin::Result<Queue> {
    bounded(
        "queue.declare",
        ch.queue_declare(name.into(), options, args),
    )
    .await
}

async fn passive(ch: &Channel, name: &str) -> lapin::Result<Queue> {
    declare(
        ch,
        name,
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
}

async fn delete(ch: &Channel, name: &str, if_unused: bool, if_empty: bool) -> lapin::Result<u32> {
    bounded(
        "queue.delete",
        ch.queue_delete(
            name.into(),
            QueueDeleteOptions {
                if_unused,
                if_empty,
                nowait: false,
            },
        ),
    )
    .await
}

async fn purge(ch: &Channel, name: &str) -> lapin::Result<u32> {
    bounded(
        "queue.purge",
        ch.queue_purge(name.into(), QueuePurgeOptions::default()),
    )
    .await
}

const EXCLUSIVE: QueueDeclareOptions = QueueDeclareOptions {
    passive: false,
    durable: false,
    exclusive: true,
    auto_delete: false,
    nowait: false,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_reports_message_and_consumer_counts() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("q-counts");
        let q = declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare");
        assert_eq!(q.name().as_str(), name);
        assert_eq!((q.message_count(), q.consumer_count()), (0, 0));
        for i in 0..3 {
            publish(&ch, "", &name, format!("{i}").as_bytes()).await;
        }
        assert_eq!(wait_for_message_count(&ch, &name, 3).await, 3);
        let consumer_ch = open_channel(&_conn).await;
        bounded("basic.qos", consumer_ch.basic_qos(1, Default::default()))
            .await
            .expect("qos");
        let mut c = consume(&consumer_ch, &name).await;
        let _first = c.recv().await;
        // Redeclaring (actively or passively) reports ready messages only,
        // and the consumer.
        let q = declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("redeclare");
        assert_eq!((q.message_count(), q.consumer_count()), (2, 1));
        let q = passive(&ch, &name).await.expect("passive");
        assert_eq!((q.message_count(), q.consumer_count()), (2, 1));
        delete(&ch, &name, false, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_named_queue_gets_amq_gen_name() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let a = declare(&ch, "", EXCLUSIVE, FieldTable::default())
            .await
            .expect("declare");
        let b = declare(&ch, "", EXCLUSIVE, FieldTable::default())
            .await
            .expect("declare");
        for q in [&a, &b] {
            assert!(q.name().as_str().starts_with("amq.gen-"), "{:?}", q.name());
        }
        assert_ne!(a.name(), b.name());
        publish(&ch, "", a.name().as_str(), b"to gen").await;
        assert_eq!(drain_strings(&ch, a.name().as_str()).await, ["to gen"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_missing_queue_fails_404() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("q-missing");
        let text = expect_reply(passive(&ch, &name).await, 404, &[&name]);
        assert_eq!(text, format!("NOT_FOUND - no queue '{name}' in vhost '/'"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_with_reserved_amq_prefix_fails_403() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = format!("amq.{}", unique("q"));
        let result = declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
        let text = expect_reply(result, 403, &[&name]);
        assert_eq!(
            text,
            format!("ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inequivalent_redeclare_fails_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let name = unique("q-inequivalent");
        declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            table(&[("x-max-length", int(10))]),
        )
        .await
        .expect("declare");
        let cases: [(QueueDeclareOptions, FieldTable, &str); 4] = [
            (
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                table(&[("x-max-length", int(10))]),
                "'durable'",
            ),
            (
                QueueDeclareOptions {
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                table(&[("x-max-length", int(10))]),
                "'auto_delete'",
            ),
            (
                QueueDeclareOptions::default(),
                table(&[("x-max-length", int(11))]),
                "'x-max-length'",
            ),
            (
                QueueDeclareOptions::default(),
                FieldTable::default(),
                "'x-max-length'",
            ),
        ];
        for (options, args, what) in cases {
            let ch = open_channel(&conn).await;
            let result = declare(&ch, &name, options, args).await;
            expect_reply(result, 406, &["inequivalent arg", what, &name]);
        }
        // An equivalent redeclaration is fine, and so is passive with other flags.
        let ch = open_channel(&conn).await;
        declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            table(&[("x-max-length", int(10))]),
        )
        .await
        .expect("equivalent redeclare");
        declare(
            &ch,
            &name,
            QueueDeclareOptions {
                passive: true,
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive ignores flags and arguments");
        delete(&ch, &name, false, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_is_locked_405_for_other_connections() {
    within(async {
        let broker = Broker::start();
        let (_owner, ch) = broker.channel().await;
        let name = unique("q-exclusive");
        declare(&ch, &name, EXCLUSIVE, FieldTable::default())
            .await
            .expect("declare");
        publish(&ch, "", &name, b"mine").await;
        let other = broker.connect().await;

        let och = open_channel(&other).await;
        let text = expect_reply(
            declare(&och, &name, EXCLUSIVE, FieldTable::default()).await,
            405,
            &[&name],
        );
        assert!(text.starts_with(&format!(
            "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'"
        )));
        let och = open_channel(&other).await;
        expect_reply(passive(&och, &name).await, 405, &[&name]);
        let och = open_channel(&other).await;
        let result = try_consume(
            &och,
            &name,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
        expect_reply(result.map(|d| d.tag), 405, &[&name]);
        let och = open_channel(&other).await;
        let result = bounded(
            "basic.get",
            och.basic_get(name.as_str().into(), BasicGetOptions::default()),
        )
        .await;
        expect_reply(result.map(|m| m.is_some()), 405, &[&name]);
        let och = open_channel(&other).await;
        expect_reply(purge(&och, &name).await, 405, &[&name]);
        let och = open_channel(&other).await;
        expect_reply(delete(&och, &name, false, false).await, 405, &[&name]);
        // Publishing is not consuming: anyone may publish to it.
        let och = open_channel(&other).await;
        publish(&och, "", &name, b"from other").await;
        assert_eq!(drain_strings(&ch, &name).await, ["mine", "from other"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_is_deleted_when_its_connection_closes() {
    within(async {
        let broker = Broker::start();
        let (owner, ch) = broker.channel().await;
        let name = unique("q-exclusive-gone");
        declare(&ch, &name, EXCLUSIVE, FieldTable::default())
            .await
            .expect("declare");
        bounded("connection.close", owner.close(200, "bye".into()))
            .await
            .expect("close");
        let (_conn, ch) = broker.channel().await;
        // Deletion may trail the close-ok slightly.
        let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            match passive(&ch, &name).await {
                Err(e) => {
                    assert_reply(&e, 404, &[&name]);
                    break;
                }
                Ok(_) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "exclusive queue outlived its connection"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_queue_goes_when_its_last_consumer_cancels() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("q-auto");
        declare(
            &ch,
            &name,
            QueueDeclareOptions {
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare");
        // Never consumed from: it stays.
        passive(&ch, &name)
            .await
            .expect("auto-delete queue without consumers stays");
        let a = consume(&ch, &name).await;
        let b = consume(&ch, &name).await;
        bounded(
            "basic.cancel",
            ch.basic_cancel(a.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("cancel a");
        passive(&ch, &name).await.expect("one consumer left");
        bounded(
            "basic.cancel",
            ch.basic_cancel(b.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("cancel b");
        expect_reply(passive(&ch, &name).await, 404, &[&name]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_ready_messages_and_reports_count() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = declare_queue(&ch, "q-purge", FieldTable::default()).await;
        for i in 0..5 {
            publish(&ch, "", &name, format!("{i}").as_bytes()).await;
        }
        // One message is delivered but unacked: purge leaves it alone.
        let held = get(&ch, &name).await.expect("a message");
        assert_eq!(purge(&ch, &name).await.expect("purge"), 4);
        assert_eq!(purge(&ch, &name).await.expect("purge again"), 0);
        assert!(get(&ch, &name).await.is_none());
        held.delivery
            .acker
            .reject(lapin::options::BasicRejectOptions { requeue: true })
            .await
            .expect("requeue");
        assert_eq!(drain_strings(&ch, &name).await, ["0"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_of_missing_queue_fails_404() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("q-missing");
        expect_reply(purge(&ch, &name).await, 404, &[&name]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_reports_message_count_and_missing_queue_is_ok() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = declare_queue(&ch, "q-delete", FieldTable::default()).await;
        for _ in 0..3 {
            publish(&ch, "", &name, b"x").await;
        }
        assert_eq!(wait_for_message_count(&ch, &name, 3).await, 3);
        assert_eq!(delete(&ch, &name, false, false).await.expect("delete"), 3);
        expect_reply(passive(&ch, &name).await, 404, &[&name]);
        let ch = open_channel(&_conn).await;
        assert_eq!(
            delete(&ch, &name, false, false)
                .await
                .expect("delete missing"),
            0
        );
        assert_eq!(
            delete(&ch, &unique("q-never"), true, true)
                .await
                .expect("delete missing"),
            0
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_unused_fails_406_while_a_consumer_exists() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let name = declare_queue(&ch, "q-if-unused", FieldTable::default()).await;
        let consumer_ch = open_channel(&conn).await;
        let c = consume(&consumer_ch, &name).await;
        let text = expect_reply(
            delete(&ch, &name, true, false).await,
            406,
            &[&name, "in use"],
        );
        assert_eq!(
            text,
            format!("PRECONDITION_FAILED - queue '{name}' in vhost '/' in use")
        );
        bounded(
            "basic.cancel",
            consumer_ch.basic_cancel(c.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("cancel");
        let ch = open_channel(&conn).await;
        assert_eq!(
            delete(&ch, &name, true, false)
                .await
                .expect("delete if-unused"),
            0
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_empty_fails_406_while_messages_are_ready() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let name = declare_queue(&ch, "q-if-empty", FieldTable::default()).await;
        publish(&ch, "", &name, b"x").await;
        assert_eq!(wait_for_message_count(&ch, &name, 1).await, 1);
        let text = expect_reply(
            delete(&ch, &name, false, true).await,
            406,
            &[&name, "not empty"],
        );
        assert_eq!(
            text,
            format!("PRECONDITION_FAILED - queue '{name}' in vhost '/' not empty")
        );
        let ch = open_channel(&conn).await;
        drain(&ch, &name).await;
        assert_eq!(
            delete(&ch, &name, false, true)
                .await
                .expect("delete if-empty"),
            0
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_drops_its_bindings() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = declare_queue(&ch, "q-rebind", FieldTable::default()).await;
        bounded(
            "queue.bind",
            ch.queue_bind(
                name.as_str().into(),
                "amq.fanout".into(),
                "".into(),
                Default::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("bind");
        delete(&ch, &name, false, false).await.expect("delete");
        declare(
            &ch,
            &name,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("redeclare");
        publish(&ch, "amq.fanout", "", b"should not arrive").await;
        assert!(
            drain(&ch, &name).await.is_empty(),
            "binding survived the queue's deletion"
        );
        delete(&ch, &name, false, false).await.expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_queue_declares_and_keeps_persistent_messages() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let name = unique("q-durable");
        declare(
            &ch,
            &name,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare durable");
        publish_with(
            &ch,
            "",
            &name,
            b"persistent",
            lapin::BasicProperties::default().with_delivery_mode(2),
        )
        .await;
        let m = get_no_ack(&ch, &name).await.expect("message");
        assert_eq!(m.delivery.data, b"persistent");
        assert_eq!(*m.delivery.properties.delivery_mode(), Some(2));
        delete(&ch, &name, false, false).await.expect("delete");
    })
    .await;
}
