//! Transactions (tx.select/commit/rollback) and publisher confirms
//! (confirm.select, basic.ack/basic.nack to publishers).

use berth_itest::lapin::options::{
    BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use berth_itest::lapin::types::FieldTable;
use berth_itest::lapin::{BasicProperties, Channel, Confirmation};
use berth_itest::*;

async fn tx_select(ch: &Channel) {
    bounded("tx.select", ch.tx_select())
        .await
        .expect("tx.select");
}

async fn confirm_select(ch: &Channel) {
    bounded(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
}

async fn publish_confirmed(ch: &Channel, exchange: &str, key: &str, body: &[u8]) -> Confirmation {
    let confirm = bounded(
        "basic.publish",
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default(),
        ),
    )
    .await
    .expect("basic.publish");
    bounded("publisher confirm", confirm)
        .await
        .expect("confirm")
}

async fn ready(ch: &Channel, q: &str) -> u32 {
    bounded(
        "queue.declare passive",
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.declare passive")
    .message_count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commit_makes_publishes_visible_and_only_then() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let observer = open_channel(&conn).await;
        let q = declare_queue(&observer, "q-tx-commit", FieldTable::default()).await;
        tx_select(&ch).await;
        tx_select(&ch).await; // selecting twice is fine
        for i in 0..3 {
            publish(&ch, "", &q, format!("m{i}").as_bytes()).await;
        }
        assert_eq!(
            ready(&observer, &q).await,
            0,
            "uncommitted publishes are invisible"
        );
        bounded("tx.commit", ch.tx_commit())
            .await
            .expect("tx.commit");
        assert_eq!(ready(&observer, &q).await, 3);
        assert_eq!(drain_strings(&observer, &q).await, ["m0", "m1", "m2"]);
        // The channel stays transactional: the next batch needs its own commit.
        publish(&ch, "", &q, b"m3").await;
        assert_eq!(ready(&observer, &q).await, 0);
        bounded("tx.commit", ch.tx_commit())
            .await
            .expect("tx.commit");
        assert_eq!(drain_strings(&observer, &q).await, ["m3"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_rollback_discards_publishes() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-tx-rollback", FieldTable::default()).await;
        tx_select(&ch).await;
        publish(&ch, "", &q, b"discarded").await;
        bounded("tx.rollback", ch.tx_rollback())
            .await
            .expect("tx.rollback");
        publish(&ch, "", &q, b"kept").await;
        bounded("tx.commit", ch.tx_commit())
            .await
            .expect("tx.commit");
        let observer = open_channel(&conn).await;
        assert_eq!(drain_strings(&observer, &q).await, ["kept"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_acks_take_effect_on_commit_and_are_dropped_on_rollback() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let feeder = open_channel(&conn).await;
        let q = declare_queue(&feeder, "q-tx-ack", FieldTable::default()).await;
        for i in 0..2 {
            publish(&feeder, "", &q, format!("m{i}").as_bytes()).await;
        }
        let ch = open_channel(&conn).await;
        tx_select(&ch).await;
        let mut c = consume(&ch, &q).await;
        let ds = c.take(2).await;
        // Ack m0 and roll back: m0 stays unacked.
        bounded(
            "basic.ack",
            ch.basic_ack(ds[0].delivery_tag, BasicAckOptions::default()),
        )
        .await
        .expect("ack");
        bounded("tx.rollback", ch.tx_rollback())
            .await
            .expect("tx.rollback");
        // Ack m1 and commit: m1 is gone.
        bounded(
            "basic.ack",
            ch.basic_ack(ds[1].delivery_tag, BasicAckOptions::default()),
        )
        .await
        .expect("ack");
        bounded("tx.commit", ch.tx_commit())
            .await
            .expect("tx.commit");
        // Closing the channel returns what is still unacked: m0 only.
        bounded("channel.close", ch.close(200, "bye".into()))
            .await
            .expect("close");
        let m = get_no_ack(&feeder, &q).await.expect("m0 back in the queue");
        assert_eq!(body(&m.delivery), "m0");
        assert!(m.delivery.redelivered);
        assert!(
            get_no_ack(&feeder, &q).await.is_none(),
            "m1's committed ack was lost"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_acked_twice_in_one_tx_fails_406_and_a_rolled_back_ack_can_be_repeated() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let feeder = open_channel(&conn).await;
        let q = declare_queue(&feeder, "q-tx-double-ack", FieldTable::default()).await;
        publish(&feeder, "", &q, b"m0").await;
        let ch = open_channel(&conn).await;
        tx_select(&ch).await;
        let mut c = consume(&ch, &q).await;
        let tag = c.recv().await.delivery_tag;
        let ack = || ch.basic_ack(tag, BasicAckOptions::default());
        // Rolled back: the delivery is unacknowledged again, under its tag.
        bounded("basic.ack", ack()).await.expect("ack");
        bounded("tx.rollback", ch.tx_rollback())
            .await
            .expect("tx.rollback");
        bounded("basic.ack", ack())
            .await
            .expect("ack after rollback");
        // A second ack of the same tag in the same transaction: RabbitMQ
        // answers 406, the tag is no longer outstanding.
        let err = closes_channel(&ch, ack()).await;
        let text = assert_reply(&err, 406, &[&tag.to_string()]);
        assert_eq!(
            text,
            format!("PRECONDITION_FAILED - unknown delivery tag {tag}")
        );
        // The channel closed with the ack uncommitted: m0 is back.
        let m = get_no_ack(&feeder, &q).await.expect("m0 requeued");
        assert_eq!(body(&m.delivery), "m0");
        assert!(m.delivery.redelivered);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commit_or_rollback_without_select_fails_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let text = expect_reply(
            bounded("tx.commit", ch.tx_commit()).await,
            406,
            &["not transactional"],
        );
        assert_eq!(text, "PRECONDITION_FAILED - channel is not transactional");
        let ch = open_channel(&conn).await;
        let text = expect_reply(
            bounded("tx.rollback", ch.tx_rollback()).await,
            406,
            &["not transactional"],
        );
        assert_eq!(text, "PRECONDITION_FAILED - channel is not transactional");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_and_confirm_modes_exclude_each_other_406() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        tx_select(&ch).await;
        let result = bounded(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await;
        let text = expect_reply(result, 406, &["tx", "confirm"]);
        assert_eq!(
            text,
            "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
        );
        let ch = open_channel(&conn).await;
        confirm_select(&ch).await;
        let text = expect_reply(
            bounded("tx.select", ch.tx_select()).await,
            406,
            &["confirm", "tx"],
        );
        assert_eq!(
            text,
            "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_ack_every_publish_routed_or_not() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-confirm", FieldTable::default()).await;
        confirm_select(&ch).await;
        confirm_select(&ch).await; // selecting twice is fine
        assert!(publish_confirmed(&ch, "", &q, b"routed").await.is_ack());
        assert!(
            publish_confirmed(&ch, "amq.direct", &unique("nowhere"), b"unroutable")
                .await
                .is_ack()
        );
        let durable = unique("q-confirm-durable");
        bounded(
            "queue.declare",
            ch.queue_declare(
                durable.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .expect("declare durable");
        let confirm = bounded(
            "basic.publish",
            ch.basic_publish(
                "".into(),
                durable.as_str().into(),
                BasicPublishOptions::default(),
                b"persistent",
                BasicProperties::default().with_delivery_mode(2),
            ),
        )
        .await
        .expect("publish");
        assert!(bounded("confirm", confirm).await.expect("confirm").is_ack());
        // A burst, confirmed (possibly with multiple=true) as a whole.
        for i in 0..200 {
            bounded(
                "basic.publish",
                ch.basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    format!("burst{i}").as_bytes(),
                    BasicProperties::default(),
                ),
            )
            .await
            .expect("publish");
        }
        let returned = bounded("wait_for_confirms", ch.wait_for_confirms())
            .await
            .expect("all confirmed");
        assert!(returned.is_empty());
        assert_eq!(ready(&ch, &q).await, 201);
        bounded(
            "queue.delete",
            ch.queue_delete(durable.as_str().into(), Default::default()),
        )
        .await
        .expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_nack_publishes_refused_by_reject_publish_overflow() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(
            &ch,
            "q-reject-publish",
            table(&[
                ("x-max-length", int(2)),
                ("x-overflow", lstr("reject-publish")),
            ]),
        )
        .await;
        confirm_select(&ch).await;
        assert!(publish_confirmed(&ch, "", &q, b"m0").await.is_ack());
        assert!(publish_confirmed(&ch, "", &q, b"m1").await.is_ack());
        assert!(
            publish_confirmed(&ch, "", &q, b"m2").await.is_nack(),
            "a full queue nacks"
        );
        assert_eq!(drain_strings(&ch, &q).await, ["m0", "m1"]);
        // Room again: acked again.
        assert!(publish_confirmed(&ch, "", &q, b"m3").await.is_ack());
        assert_eq!(drain_strings(&ch, &q).await, ["m3"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_is_nack_if_any_target_queue_refuses() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let full = declare_queue(
            &ch,
            "q-full",
            table(&[
                ("x-max-length", int(0)),
                ("x-overflow", lstr("reject-publish")),
            ]),
        )
        .await;
        let open = declare_queue(&ch, "q-open", FieldTable::default()).await;
        let x = unique("x-fan");
        bounded(
            "exchange.declare",
            ch.exchange_declare(
                x.as_str().into(),
                lapin::ExchangeKind::Fanout,
                Default::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("declare");
        for q in [&full, &open] {
            bounded(
                "queue.bind",
                ch.queue_bind(
                    q.as_str().into(),
                    x.as_str().into(),
                    "".into(),
                    Default::default(),
                    FieldTable::default(),
                ),
            )
            .await
            .expect("bind");
        }
        confirm_select(&ch).await;
        assert!(publish_confirmed(&ch, &x, "", b"half").await.is_nack());
        // The queue with room still got its copy.
        assert_eq!(drain_strings(&ch, &open).await, ["half"]);
        bounded(
            "exchange.delete",
            ch.exchange_delete(x.as_str().into(), Default::default()),
        )
        .await
        .expect("delete");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commit_fails_406_when_reject_publish_refused_part_of_it() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(
            &ch,
            "q-tx-overflow",
            table(&[
                ("x-max-length", int(1)),
                ("x-overflow", lstr("reject-publish")),
            ]),
        )
        .await;
        tx_select(&ch).await;
        publish(&ch, "", &q, b"m0").await;
        publish(&ch, "", &q, b"m1").await;
        let text = expect_reply(bounded("tx.commit", ch.tx_commit()).await, 406, &[]);
        assert_eq!(text, "PRECONDITION_FAILED - partial tx completion");
        // What fitted was enqueued.
        let ch = open_channel(&conn).await;
        assert_eq!(drain_strings(&ch, &q).await, ["m0"]);
    })
    .await;
}
