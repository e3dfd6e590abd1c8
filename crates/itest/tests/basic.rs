//! The basic class: publish, get, consume/cancel, qos, ack/nack/reject,
//! recover, properties and big bodies.

use berth_itest::lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRecoverOptions, BasicRejectOptions,
    QueueDeleteOptions,
};
use berth_itest::lapin::types::{AMQPValue, FieldTable};
use berth_itest::lapin::{BasicProperties, Channel};
use berth_itest::*;

async fn qos(ch: &Channel, prefetch: u16, global: bool) {
    bounded(
        "basic.qos",
        ch.basic_qos(prefetch, BasicQosOptions { global }),
    )
    .await
    .expect("basic.qos");
}

async fn publish_n(ch: &Channel, queue: &str, n: usize) {
    for i in 0..n {
        publish(ch, "", queue, format!("m{i}").as_bytes()).await;
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_get_roundtrip_body_and_every_property() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-props", FieldTable::default()).await;
        let headers = table(&[
            ("s", lstr("text")),
            ("i", int(-7)),
            ("l", long(1 << 40)),
            ("b", AMQPValue::Boolean(true)),
            ("a", str_array(&["x", "y"])),
            ("t", AMQPValue::FieldTable(table(&[("inner", int(1))]))),
        ]);
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_priority(3)
            .with_correlation_id("corr".into())
            .with_reply_to("reply-q".into())
            .with_expiration("60000".into())
            .with_message_id("msg-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("kind".into())
            .with_user_id("guest".into())
            .with_app_id("itest".into());
        publish_with(&ch, "", &q, b"{\"k\":1}", props.clone()).await;
        let m = get(&ch, &q).await.expect("a message");
        assert_eq!(m.message_count, 0);
        let d = &m.delivery;
        assert_eq!(d.data, b"{\"k\":1}");
        assert_eq!(d.exchange.as_str(), "");
        assert_eq!(d.routing_key.as_str(), q);
        assert!(!d.redelivered);
        let got = &d.properties;
        assert_eq!(got.content_type(), props.content_type());
        assert_eq!(got.content_encoding(), props.content_encoding());
        assert_eq!(got.delivery_mode(), props.delivery_mode());
        assert_eq!(got.priority(), props.priority());
        assert_eq!(got.correlation_id(), props.correlation_id());
        assert_eq!(got.reply_to(), props.reply_to());
        assert_eq!(got.expiration(), props.expiration());
        assert_eq!(got.message_id(), props.message_id());
        assert_eq!(got.timestamp(), props.timestamp());
        assert_eq!(got.kind(), props.kind());
        assert_eq!(got.user_id(), props.user_id());
        assert_eq!(got.app_id(), props.app_id());
        let h = headers_of(got);
        assert_eq!(h.get("s").and_then(value_str).as_deref(), Some("text"));
        assert_eq!(h.get("i").and_then(value_int), Some(-7));
        assert_eq!(h.get("l").and_then(value_int), Some(1 << 40));
        assert_eq!(h.get("b"), Some(&AMQPValue::Boolean(true)));
        assert!(matches!(h.get("a"), Some(AMQPValue::FieldArray(a)) if a.as_slice().len() == 2));
        assert!(matches!(h.get("t"), Some(AMQPValue::FieldTable(_))));
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_wrong_user_id_is_refused_406() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-user-id", FieldTable::default()).await;
        let err = publish_fails(
            &ch,
            "",
            &q,
            b"x",
            BasicProperties::default().with_user_id("mallory".into()),
        )
        .await;
        assert_reply(&err, 406, &["mallory", "guest"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reports_remaining_count_and_get_empty() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-get", FieldTable::default()).await;
        assert!(
            get(&ch, &q).await.is_none(),
            "empty queue answers get-empty"
        );
        publish_n(&ch, &q, 3).await;
        let a = get(&ch, &q).await.expect("first");
        assert_eq!((body(&a.delivery), a.message_count), ("m0".to_owned(), 2));
        let b = get_no_ack(&ch, &q).await.expect("second");
        assert_eq!((body(&b.delivery), b.message_count), ("m1".to_owned(), 1));
        let c = get(&ch, &q).await.expect("third");
        assert_eq!((body(&c.delivery), c.message_count), ("m2".to_owned(), 0));
        assert!(c.delivery.delivery_tag > a.delivery.delivery_tag);
        assert!(get(&ch, &q).await.is_none());
        c.delivery
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack multiple");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_from_missing_queue_fails_404() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = unique("q-missing");
        let result = bounded(
            "basic.get",
            ch.basic_get(q.as_str().into(), Default::default()),
        )
        .await;
        expect_reply(result.map(|m| m.is_some()), 404, &[&q]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_receives_in_publish_order_with_increasing_delivery_tags() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-order", FieldTable::default()).await;
        publish_n(&ch, &q, 5).await;
        let mut c = consume(&ch, &q).await;
        publish(&ch, "", &q, b"m5").await;
        let ds = c.take(6).await;
        assert_eq!(bodies(&ds), names(6));
        for pair in ds.windows(2) {
            assert!(pair[1].delivery_tag > pair[0].delivery_tag);
        }
        assert!(ds
            .iter()
            .all(|d| !d.redelivered && d.routing_key.as_str() == q));
        ds[5]
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack");
        c.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_tags_are_echoed_or_generated() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-tags", FieldTable::default()).await;
        let generated = consume(&ch, &q).await;
        assert!(generated.tag.starts_with("amq.ctag-"), "{}", generated.tag);
        let chosen = try_consume(
            &ch,
            &q,
            "my-tag",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
        assert_eq!(chosen.tag, "my-tag");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_consumer_tag_on_a_channel_fails_530() {
    within(async {
        let broker = Broker::start();
        let (conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-dup-tag", FieldTable::default()).await;
        let _first = try_consume(
            &ch,
            &q,
            "dup",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
        let second = try_consume(
            &ch,
            &q,
            "dup",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
        expect_reply(second.map(|d| d.tag), 530, &["dup"]);
        let next = bounded("channel.open", conn.create_channel()).await;
        assert!(next.is_err(), "530 is a connection exception: {next:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_from_missing_queue_fails_404() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = unique("q-missing");
        let result = try_consume(
            &ch,
            &q,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
        expect_reply(result.map(|d| d.tag), 404, &[&q]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_consumer_excludes_others_403() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-excl-consumer", FieldTable::default()).await;
        let exclusive = BasicConsumeOptions {
            exclusive: true,
            ..BasicConsumeOptions::default()
        };
        let _owner = try_consume(&ch, &q, "", exclusive, FieldTable::default())
            .await
            .expect("exclusive consume");
        let other = open_channel(&conn).await;
        let result = try_consume(
            &other,
            &q,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
        let text = expect_reply(result.map(|d| d.tag), 403, &[&q, "exclusive"]);
        assert_eq!(
            text,
            format!("ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
        );

        // And an exclusive consumer cannot join a queue that has consumers.
        let q2 = declare_queue(&ch, "q-excl-consumer", FieldTable::default()).await;
        let _plain = consume(&ch, &q2).await;
        let other = open_channel(&conn).await;
        let result = try_consume(&other, &q2, "", exclusive, FieldTable::default()).await;
        expect_reply(result.map(|d| d.tag), 403, &[&q2]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_on_one_queue_share_messages_round_robin() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-rr", FieldTable::default()).await;
        let mut a = consume(&ch, &q).await;
        let mut b = consume(&ch, &q).await;
        publish_n(&ch, &q, 4).await;
        let got_a = a.take(2).await;
        let got_b = b.take(2).await;
        a.expect_quiet().await;
        b.expect_quiet().await;
        let mut all = bodies(&got_a);
        all.extend(bodies(&got_b));
        all.sort();
        assert_eq!(all, names(4));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_deliveries_and_unacked_messages_stay_with_the_channel() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-cancel", FieldTable::default()).await;
        let mut c = consume(&ch, &q).await;
        publish(&ch, "", &q, b"m0").await;
        let held = c.recv().await;
        bounded(
            "basic.cancel",
            ch.basic_cancel(c.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("basic.cancel");
        publish(&ch, "", &q, b"m1").await;
        assert_eq!(
            wait_for_message_count(&ch, &q, 1).await,
            1,
            "only m1 is ready"
        );
        // The cancelled consumer's delivery can still be acked.
        held.acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack after cancel");
        let other = open_channel(&conn).await;
        assert_eq!(drain_strings(&other, &q).await, ["m1"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_sends_basic_cancel_to_its_consumers() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-cancel-notify", FieldTable::default()).await;
        let mut c = consume(&ch, &q).await;
        let admin = open_channel(&conn).await;
        bounded(
            "queue.delete",
            admin.queue_delete(q.as_str().into(), QueueDeleteOptions::default()),
        )
        .await
        .expect("queue.delete");
        c.expect_cancelled().await;
        // The channel stays usable.
        let q2 = declare_queue(&ch, "q-after-cancel", FieldTable::default()).await;
        publish(&ch, "", &q2, b"ok").await;
        assert_eq!(drain_strings(&ch, &q2).await, ["ok"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_consumer_removes_messages_on_delivery() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-no-ack", FieldTable::default()).await;
        publish_n(&ch, &q, 3).await;
        let consumer_ch = open_channel(&conn).await;
        qos(&consumer_ch, 1, false).await; // prefetch does not limit no-ack consumers
        let mut c = try_consume(
            &consumer_ch,
            &q,
            "",
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");
        assert_eq!(bodies(&c.take(3).await), names(3));
        bounded("channel.close", consumer_ch.close(200, "bye".into()))
            .await
            .expect("close");
        assert_eq!(
            wait_for_message_count(&ch, &q, 0).await,
            0,
            "no-ack deliveries are gone"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_prefetch_limits_unacked_deliveries() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-prefetch", FieldTable::default()).await;
        publish_n(&ch, &q, 5).await;
        qos(&ch, 2, false).await;
        let mut c = consume(&ch, &q).await;
        let first = c.take(2).await;
        assert_eq!(bodies(&first), ["m0", "m1"]);
        c.expect_quiet().await;
        first[0]
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        let third = c.recv().await;
        assert_eq!(body(&third), "m2");
        c.expect_quiet().await;
        // A multiple ack frees both slots.
        third
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack multiple");
        assert_eq!(bodies(&c.take(2).await), ["m3", "m4"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_prefetch_applies_to_each_consumer_separately() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q1 = declare_queue(&ch, "q-pc1", FieldTable::default()).await;
        let q2 = declare_queue(&ch, "q-pc2", FieldTable::default()).await;
        publish_n(&ch, &q1, 4).await;
        publish_n(&ch, &q2, 4).await;
        qos(&ch, 2, false).await;
        let mut a = consume(&ch, &q1).await;
        let mut b = consume(&ch, &q2).await;
        assert_eq!(a.take(2).await.len(), 2);
        assert_eq!(b.take(2).await.len(), 2);
        a.expect_quiet().await;
        b.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_prefetch_is_shared_by_the_channels_consumers() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q1 = declare_queue(&ch, "q-global1", FieldTable::default()).await;
        let q2 = declare_queue(&ch, "q-global2", FieldTable::default()).await;
        publish_n(&ch, &q1, 5).await;
        publish_n(&ch, &q2, 5).await;
        qos(&ch, 3, true).await;
        let mut a = consume(&ch, &q1).await;
        let mut b = consume(&ch, &q2).await;
        // Three deliveries in all, however they split between the consumers.
        let mut got = Vec::new();
        while got.len() < 3 {
            tokio::select! {
                d = a.recv() => got.push(d),
                d = b.recv() => got.push(d),
            }
        }
        a.expect_quiet().await;
        b.expect_quiet().await;
        got[0]
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        tokio::select! {
            d = a.recv() => got.push(d),
            d = b.recv() => got.push(d),
        }
        a.expect_quiet().await;
        b.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_and_global_prefetch_both_apply() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q1 = declare_queue(&ch, "q-both1", FieldTable::default()).await;
        let q2 = declare_queue(&ch, "q-both2", FieldTable::default()).await;
        publish_n(&ch, &q1, 5).await;
        publish_n(&ch, &q2, 5).await;
        // In this order: a per-consumer qos resets the channel's global one.
        qos(&ch, 2, false).await;
        qos(&ch, 3, true).await;
        let mut a = consume(&ch, &q1).await;
        let ds = a.take(2).await;
        a.expect_quiet().await; // per-consumer limit 2
        let mut b = consume(&ch, &q2).await;
        let _one = b.recv().await;
        b.expect_quiet().await; // channel limit 3 in all
        ds[0]
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        // The freed slot goes to one consumer, whichever; then the channel is full again.
        tokio::select! {
            _d = a.recv() => {}
            _d = b.recv() => {}
        }
        a.expect_quiet().await;
        b.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_zero_means_unlimited() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-prefetch0", FieldTable::default()).await;
        publish_n(&ch, &q, 20).await;
        qos(&ch, 0, false).await;
        let mut c = consume(&ch, &q).await;
        assert_eq!(bodies(&c.take(20).await), names(20));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_multiple_acknowledges_everything_up_to_the_tag() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-ack-multi", FieldTable::default()).await;
        publish_n(&ch, &q, 4).await;
        let mut c = consume(&ch, &q).await;
        let ds = c.take(4).await;
        ds[2]
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack multiple");
        // Closing the channel requeues only what was not acked: m3.
        bounded("channel.close", ch.close(200, "bye".into()))
            .await
            .expect("close");
        let other = open_channel(&conn).await;
        let m = get_no_ack(&other, &q).await.expect("m3 requeued");
        assert_eq!(body(&m.delivery), "m3");
        assert!(m.delivery.redelivered);
        assert!(get_no_ack(&other, &q).await.is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_multiple_with_requeue_redelivers_flagged_in_order() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-nack-multi", FieldTable::default()).await;
        publish_n(&ch, &q, 3).await;
        let mut c = consume(&ch, &q).await;
        let ds = c.take(3).await;
        ds[2]
            .acker
            .nack(BasicNackOptions {
                multiple: true,
                requeue: true,
            })
            .await
            .expect("nack");
        let again = c.take(3).await;
        assert_eq!(bodies(&again), names(3));
        assert!(
            again.iter().all(|d| d.redelivered),
            "requeued deliveries are flagged redelivered"
        );
        again[2]
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack");
        c.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_and_reject_without_requeue_discard() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-discard", FieldTable::default()).await;
        publish_n(&ch, &q, 3).await;
        let mut c = consume(&ch, &q).await;
        let ds = c.take(3).await;
        ds[0]
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .expect("reject");
        ds[2]
            .acker
            .nack(BasicNackOptions {
                multiple: true,
                requeue: false,
            })
            .await
            .expect("nack multiple");
        c.expect_quiet().await;
        assert_eq!(wait_for_message_count(&ch, &q, 0).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_with_requeue_redelivers_flagged() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-reject", FieldTable::default()).await;
        publish(&ch, "", &q, b"again").await;
        let first = get(&ch, &q).await.expect("message");
        assert!(!first.delivery.redelivered);
        first
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: true })
            .await
            .expect("reject");
        let second = get(&ch, &q).await.expect("requeued");
        assert_eq!(second.delivery.data, b"again");
        assert!(second.delivery.redelivered);
        assert!(second.delivery.delivery_tag > first.delivery.delivery_tag);
        second
            .delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_of_unknown_delivery_tag_fails_406() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let err = closes_channel(&ch, ch.basic_ack(42, BasicAckOptions::default())).await;
        let text = assert_reply(&err, 406, &["42"]);
        assert_eq!(text, "PRECONDITION_FAILED - unknown delivery tag 42");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_ack_of_a_delivery_fails_406() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-double-ack", FieldTable::default()).await;
        publish(&ch, "", &q, b"x").await;
        let m = get(&ch, &q).await.expect("message");
        let tag = m.delivery.delivery_tag;
        bounded("basic.ack", ch.basic_ack(tag, BasicAckOptions::default()))
            .await
            .expect("ack");
        let err = closes_channel(&ch, ch.basic_ack(tag, BasicAckOptions::default())).await;
        assert_reply(&err, 406, &[&format!("unknown delivery tag {tag}")]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_channel_requeues_its_unacked_deliveries_as_redelivered() {
    within(async {
        let broker = Broker::start();
        let conn = broker.connect().await;
        let ch = open_channel(&conn).await;
        let q = declare_queue(&ch, "q-requeue-close", FieldTable::default()).await;
        publish_n(&ch, &q, 3).await;
        let consumer_ch = open_channel(&conn).await;
        let mut c = consume(&consumer_ch, &q).await;
        let ds = c.take(3).await;
        ds[1]
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack m1");
        bounded("channel.close", consumer_ch.close(200, "bye".into()))
            .await
            .expect("close");
        let mut c = consume(&ch, &q).await;
        let again = c.take(2).await;
        assert_eq!(bodies(&again), ["m0", "m2"]);
        assert!(again.iter().all(|d| d.redelivered));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_connection_requeues_its_unacked_deliveries() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-requeue-conn", FieldTable::default()).await;
        publish_n(&ch, &q, 2).await;
        let (consumer_conn, consumer_ch) = broker.channel().await;
        let mut c = consume(&consumer_ch, &q).await;
        let _ = c.take(2).await;
        bounded("connection.close", consumer_conn.close(200, "bye".into()))
            .await
            .expect("close");
        assert_eq!(wait_for_message_count(&ch, &q, 2).await, 2);
        let m = get_no_ack(&ch, &q).await.expect("requeued");
        assert_eq!(body(&m.delivery), "m0");
        assert!(m.delivery.redelivered);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_with_requeue_redelivers_unacked_messages() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-recover", FieldTable::default()).await;
        publish_n(&ch, &q, 2).await;
        let mut c = consume(&ch, &q).await;
        let first = c.take(2).await;
        assert!(first.iter().all(|d| !d.redelivered));
        bounded(
            "basic.recover",
            ch.basic_recover(BasicRecoverOptions { requeue: true }),
        )
        .await
        .expect("basic.recover-ok");
        let again = c.take(2).await;
        assert_eq!(bodies(&again), names(2));
        assert!(again.iter().all(|d| d.redelivered));
        again[1]
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .expect("ack");
        c.expect_quiet().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_immediate_flag_fails_540_not_implemented() {
    within(async {
        let broker = Broker::start();
        let (conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "q-immediate", FieldTable::default()).await;
        let err = publish_fails_with(
            &ch,
            "",
            &q,
            BasicPublishOptions {
                mandatory: false,
                immediate: true,
            },
            b"now",
            BasicProperties::default(),
        )
        .await;
        assert_reply(&err, 540, &["immediate"]);
        let next = bounded("channel.open", conn.create_channel()).await;
        assert!(next.is_err(), "540 is a connection exception: {next:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_multi_mebibyte_bodies_cross_intact() {
    within(async {
        let broker = Broker::start();
        // The smallest frame size makes a big body span thousands of frames.
        let uri = broker.uri_with("guest", "guest", "%2f", "frame_max=4096");
        let conn = bounded(
            "connect",
            lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()),
        )
        .await
        .expect("connect");
        let ch = open_channel(&conn).await;
        let big_conn = broker.connect().await;
        let big_ch = open_channel(&big_conn).await;
        let q = declare_queue(&ch, "q-bodies", FieldTable::default()).await;
        let big: Vec<u8> = (0..5 * 1024 * 1024 + 13)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let exact: Vec<u8> = vec![0xAB; 4096 - 8];
        publish(&ch, "", &q, b"").await;
        publish(&ch, "", &q, &big).await;
        publish(&ch, "", &q, &exact).await;
        // Publishes from two connections are ordered only by this wait.
        assert_eq!(wait_for_message_count(&ch, &q, 3).await, 3);
        publish(&big_ch, "", &q, &big).await;
        // Consumed over a small-frame connection...
        let mut c = consume(&ch, &q).await;
        let ds = c.take(4).await;
        assert!(ds[0].data.is_empty());
        assert!(
            ds[1].data == big,
            "5 MiB body differs after a small-frame round trip"
        );
        assert!(ds[2].data == exact);
        assert!(
            ds[3].data == big,
            "5 MiB body differs after a large-frame publish"
        );
        // ...and fetched over a large-frame one, once the consumer is gone
        // and recover has put its unacked deliveries back.
        bounded(
            "basic.cancel",
            ch.basic_cancel(c.tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await
        .expect("cancel");
        bounded(
            "basic.recover",
            ch.basic_recover(BasicRecoverOptions { requeue: true }),
        )
        .await
        .expect("recover");
        let mut got = Vec::new();
        assert_eq!(wait_for_message_count(&big_ch, &q, 4).await, 4);
        while let Some(m) = get_no_ack(&big_ch, &q).await {
            got.push(m.delivery.data);
        }
        assert_eq!(got.len(), 4);
        assert!(got.iter().filter(|b| **b == big).count() == 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_qos_after_global_qos_lifts_the_channel_limit() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q1 = declare_queue(&ch, "q-reset1", FieldTable::default()).await;
        let q2 = declare_queue(&ch, "q-reset2", FieldTable::default()).await;
        publish_n(&ch, &q1, 5).await;
        publish_n(&ch, &q2, 5).await;
        qos(&ch, 3, true).await;
        // RabbitMQ: basic.qos global=false clears the channel-wide limit.
        qos(&ch, 2, false).await;
        let mut a = consume(&ch, &q1).await;
        let mut b = consume(&ch, &q2).await;
        assert_eq!(a.take(2).await.len(), 2);
        assert_eq!(b.take(2).await.len(), 2);
        a.expect_quiet().await;
        b.expect_quiet().await;
    })
    .await;
}
