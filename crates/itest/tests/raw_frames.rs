//! Malformed or out-of-order frames from a raw socket: the broker closes the
//! offending connection with the right code, and other connections carry on.

use berth_itest::lapin::types::FieldTable;
use berth_itest::*;

/// A `channel.open` on `channel`.
fn channel_open(channel: u16) -> Vec<u8> {
    method_frame(channel, 20, 10, &[0])
}

/// A `basic.qos` on `channel`.
fn basic_qos(channel: u16) -> Vec<u8> {
    let mut args = Vec::new();
    args.extend_from_slice(&0u32.to_be_bytes()); // prefetch-size
    args.extend_from_slice(&1u16.to_be_bytes()); // prefetch-count
    args.push(0); // global
    method_frame(channel, 60, 10, &args)
}

/// Reads frames until `channel.open-ok` on `channel`.
async fn expect_channel_open_ok(raw: &mut RawConnection, channel: u16) {
    let frame = raw.read_frame().await.expect("channel.open-ok");
    assert_eq!((frame.frame_type, frame.channel), (1, channel));
    assert_eq!(&frame.payload[..4], &[0, 20, 0, 11], "channel.open-ok");
}

/// Asserts that a bystander connection still works.
async fn bystander_still_works(broker: &Broker, ch: &lapin::Channel) {
    let _ = broker;
    let q = declare_queue(ch, "raw-bystander", FieldTable::default()).await;
    publish(ch, "", &q, b"alive").await;
    assert_eq!(drain_strings(ch, &q).await, ["alive"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_on_unopened_channel_closes_connection_504() {
    within(async {
        let broker = Broker::start();
        let (_conn, bystander) = broker.channel().await;
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(0).await;
        raw.send(&basic_qos(3)).await;
        let close = raw.expect_connection_close().await;
        assert_eq!(close.reply_code, 504, "{close:?}");
        assert!(
            close.reply_text.starts_with("CHANNEL_ERROR - "),
            "{close:?}"
        );
        bystander_still_works(&broker, &bystander).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_channel_open_on_an_open_channel_closes_connection_504() {
    within(async {
        let broker = Broker::start();
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(0).await;
        raw.send(&channel_open(1)).await;
        expect_channel_open_ok(&mut raw, 1).await;
        raw.send(&channel_open(1)).await;
        let close = raw.expect_connection_close().await;
        assert_eq!(close.reply_code, 504, "{close:?}");
        assert_eq!((close.class_id, close.method_id), (20, 10), "{close:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_frame_end_byte_closes_connection_501() {
    within(async {
        let broker = Broker::start();
        let (_conn, bystander) = broker.channel().await;
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(0).await;
        let mut frame = channel_open(1);
        *frame.last_mut().expect("frame end") = 0x00;
        raw.send(&frame).await;
        let close = raw.expect_connection_close().await;
        assert_eq!(close.reply_code, 501, "{close:?}");
        assert!(close.reply_text.starts_with("FRAME_ERROR - "), "{close:?}");
        bystander_still_works(&broker, &bystander).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_larger_than_frame_max_closes_connection_501() {
    within(async {
        let broker = Broker::start();
        let (_conn, bystander) = broker.channel().await;
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        let hs = raw.handshake(0).await;
        raw.send(&channel_open(1)).await;
        expect_channel_open_ok(&mut raw, 1).await;
        // A body frame declaring more than frame_max: only its header is sent,
        // the broker must refuse it from the size alone.
        let mut header = vec![3u8];
        header.extend_from_slice(&1u16.to_be_bytes());
        header.extend_from_slice(&(hs.tune.frame_max + 1024).to_be_bytes());
        raw.send(&header).await;
        let close = raw.expect_connection_close().await;
        assert_eq!(close.reply_code, 501, "{close:?}");
        bystander_still_works(&broker, &bystander).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_header_without_publish_closes_connection_505() {
    within(async {
        let broker = Broker::start();
        let (_conn, bystander) = broker.channel().await;
        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(0).await;
        raw.send(&channel_open(1)).await;
        expect_channel_open_ok(&mut raw, 1).await;
        // class 60, weight 0, body size 0, no property flags.
        let mut payload = Vec::new();
        payload.extend_from_slice(&60u16.to_be_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&0u64.to_be_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        let mut frame = vec![2u8];
        frame.extend_from_slice(&1u16.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(0xCE);
        raw.send(&frame).await;
        let close = raw.expect_connection_close().await;
        assert_eq!(close.reply_code, 505, "{close:?}");
        assert!(
            close.reply_text.starts_with("UNEXPECTED_FRAME - "),
            "{close:?}"
        );
        bystander_still_works(&broker, &bystander).await;
    })
    .await;
}
