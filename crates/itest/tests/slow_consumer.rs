//! A consumer with unlimited prefetch that stops reading its socket: the
//! broker holds what it cannot send in the queue, where flow control sees
//! it, instead of in buffers in front of the consumer (issue 20 goal 3:
//! every message pushed towards a consumer that is behind is latency that
//! no publisher is made to wait for).

use std::time::Duration;

use berth_itest::lapin::options::QueueDeclareOptions;
use berth_itest::lapin::types::FieldTable;
use berth_itest::*;

/// Messages published while the consumer reads nothing.
const MESSAGES: u32 = 12_000;
const BODY_BYTES: usize = 1024;
/// At most this many may leave the queue for the consumer: the output
/// buffered for a blocked socket, the socket's unsent bytes and what the
/// client's kernel took, about 0.5 MB at 1 KB each. Without a bound on
/// either, berth sent about 8 MB (its 4 MiB output buffer and a send
/// buffer that grows to 4 MiB).
const DELIVERED_MAX: u32 = 1_500;

/// `basic.consume` on channel 1 of `queue`, manual acks, no `basic.qos`.
fn basic_consume(queue: &str) -> Vec<u8> {
    let mut args = Vec::new();
    args.extend_from_slice(&0u16.to_be_bytes()); // reserved
    put_shortstr(&mut args, queue);
    put_shortstr(&mut args, "slow");
    args.push(0); // no-local, no-ack, exclusive, no-wait all off
    args.extend_from_slice(&0u32.to_be_bytes()); // no arguments
    method_frame(1, 60, 20, &args)
}

async fn ready_count(ch: &lapin::Channel, queue: &str) -> u32 {
    bounded(
        "queue.declare passive",
        ch.queue_declare(
            queue.into(),
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
async fn a_consumer_that_reads_nothing_is_sent_a_bounded_amount() {
    within(async {
        let broker = Broker::start();
        let (_conn, ch) = broker.channel().await;
        let q = declare_queue(&ch, "slow-consumer", FieldTable::default()).await;

        let mut raw = RawConnection::connect(broker.amqp_addr()).await;
        raw.handshake(0).await;
        raw.send(&method_frame(1, 20, 10, &[0])).await; // channel.open
        raw.send(&basic_consume(&q)).await;
        // From here on the raw consumer never reads its socket.

        let body = vec![b'x'; BODY_BYTES];
        for _ in 0..MESSAGES {
            publish(&ch, "", &q, &body).await;
        }
        // Whatever the broker was going to push out has gone by now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ready = ready_count(&ch, &q).await;
        let delivered = MESSAGES - ready;
        eprintln!("sent to the consumer that reads nothing: {delivered} of {MESSAGES}");
        assert!(
            delivered <= DELIVERED_MAX,
            "a consumer that reads nothing was sent {delivered} of {MESSAGES} messages of \
             {BODY_BYTES} bytes (at most {DELIVERED_MAX} expected; {ready} still ready)"
        );
        assert!(
            delivered > 0,
            "nothing was delivered: the consumer was never served"
        );
        drop(raw);
    })
    .await;
}
