//! A connection's writer task: takes what the connection and its queues
//! buffered in [`Outbound`] and writes it to the socket; sends heartbeats
//! when idle.
//!
//! Invariants:
//! - Output after a quiet spell (no write began in the last
//!   [`limits::OUTPUT_GATHER_US`]) is written as soon as the writer is
//!   woken: a lone delivery never waits for a timer.
//! - Anything but deliveries to consumers with credit left (a reply, a
//!   confirm, a heartbeat, a delivery that uses up its consumer's
//!   prefetch: what a client may be waiting for) is written as soon as the
//!   writer is woken, together with whatever was gathered before it.
//! - While deliveries keep coming, writes begin at most once per
//!   [`limits::OUTPUT_GATHER_US`], or sooner once
//!   [`limits::OUTPUT_GATHER_BYTES_MAX`] are buffered: deliveries that
//!   arrive one by one reach the peer in fewer, larger writes, so a client
//!   is woken once per batch rather than once per delivery.
//! - The writer marks `out` as waiting for the socket from the first time
//!   a write could not finish at once until it did (see [`Outbound`]).

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::codec;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::limits;
use crate::memory::Counted;
use crate::outbound::Outbound;

/// When the writer may take the buffer.
struct Gather {
    window: Duration,
    /// When the last write began; `None` before the first.
    last_write: Option<Instant>,
}

impl Gather {
    fn new(window: Duration) -> Self {
        Self {
            window,
            last_write: None,
        }
    }

    /// Until when to let output gather, if at all: only while the previous
    /// write began less than a window ago.
    fn hold_until(&self, now: Instant) -> Option<Instant> {
        let until = self.last_write? + self.window;
        (until > now).then_some(until)
    }
}

/// Writes whatever the connection and its queues buffered; sends heartbeats
/// when idle. Returns the write half once `out` is closed and flushed: when
/// the socket closes is the connection's decision.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, out: Arc<Outbound>) -> W {
    // Dropped with the task, even an aborted one: the count never leaks.
    let mut in_flight = Counted::new(&crate::memory::OUTPUT_BYTES);
    let mut gather = Gather::new(Duration::from_micros(limits::OUTPUT_GATHER_US));
    loop {
        if let Some(until) = gather.hold_until(Instant::now()) {
            // Deliveries only (`gather_until` returns at once for anything
            // else): a reply to a client's request is never held.
            gather_until(&out, until).await;
        }
        let buf = out.take(&mut in_flight);
        if buf.is_empty() {
            if out.is_closed() {
                break;
            }
            // Send at half the interval, as RabbitMQ does, so a peer that
            // allows two missed intervals never gives up on us.
            let hb = Duration::from_millis(u64::from(out.heartbeat_ms() / 2));
            if hb.is_zero() {
                out.ready.notified().await;
            } else if tokio::time::timeout(hb, out.ready.notified())
                .await
                .is_err()
            {
                out.push(codec::encode_heartbeat);
            }
            continue;
        }
        gather.last_write = Some(Instant::now());
        let written = write_telling_blocked(&mut wr, &buf, &out).await;
        in_flight.set(0);
        if written.is_err() {
            out.close();
            break;
        }
    }
    wr
}

/// Waits until `until`, or until enough is buffered for one large write,
/// or `out` closes.
async fn gather_until(out: &Outbound, until: Instant) {
    let sleep = tokio::time::sleep_until(until);
    let mut sleep = std::pin::pin!(sleep);
    loop {
        if out.is_closed()
            || out.is_urgent()
            || out.buffered_bytes() >= limits::OUTPUT_GATHER_BYTES_MAX
        {
            return;
        }
        tokio::select! {
            () = &mut sleep => return,
            () = out.ready.notified() => {}
        }
    }
}

/// `write_all`, marking `out` as waiting for the socket from the first
/// time the socket does not take everything until the write is done, so
/// that queues stop adding deliveries behind a full socket.
async fn write_telling_blocked<W: AsyncWrite + Unpin>(
    wr: &mut W,
    buf: &[u8],
    out: &Outbound,
) -> std::io::Result<()> {
    out.set_writing_bytes(buf.len());
    let mut write = std::pin::pin!(wr.write_all(buf));
    let written = std::future::poll_fn(|cx| {
        let polled = std::future::Future::poll(write.as_mut(), cx);
        if polled.is_pending() {
            out.set_socket_blocked(true);
        }
        polled
    })
    .await;
    out.set_socket_blocked(false);
    written
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use parking_lot::Mutex;

    use super::*;

    /// A socket that takes everything at once and remembers each write's size.
    #[derive(Clone, Default)]
    struct CountingSocket {
        writes: Arc<Mutex<Vec<usize>>>,
    }

    impl AsyncWrite for CountingSocket {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.writes.lock().push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    const DELIVERY_BYTES: usize = 1100;

    fn deliver(out: &Outbound) {
        out.push_delivery(|b| b.extend_from_slice(&[0xce; DELIVERY_BYTES]));
    }

    /// Lets the writer task run until it waits again, without the (paused)
    /// clock moving.
    async fn let_writer_run() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn start() -> (Arc<Outbound>, Arc<Mutex<Vec<usize>>>) {
        let out = Outbound::new(1 << 20, 131_072);
        let socket = CountingSocket::default();
        let writes = Arc::clone(&socket.writes);
        tokio::spawn(write_loop(socket, Arc::clone(&out)));
        (out, writes)
    }

    #[tokio::test(start_paused = true)]
    async fn deliveries_that_keep_coming_share_one_write() {
        let (out, writes) = start();
        deliver(&out);
        let_writer_run().await;
        assert_eq!(
            *writes.lock(),
            [DELIVERY_BYTES],
            "the first delivery goes out at once"
        );
        for _ in 0..9 {
            deliver(&out);
            let_writer_run().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            *writes.lock(),
            [DELIVERY_BYTES, 9 * DELIVERY_BYTES],
            "9 deliveries pushed one by one right after a write reach the socket in one write"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_after_a_quiet_spell_does_not_wait() {
        let (out, writes) = start();
        deliver(&out);
        let_writer_run().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        let before = Instant::now();
        deliver(&out);
        let_writer_run().await;
        assert_eq!(*writes.lock(), [DELIVERY_BYTES, DELIVERY_BYTES]);
        assert_eq!(
            Instant::now(),
            before,
            "written without waiting for a timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_is_not_held_with_the_deliveries() {
        let (out, writes) = start();
        deliver(&out);
        let_writer_run().await;
        deliver(&out);
        let_writer_run().await;
        let before = Instant::now();
        out.push(|b| b.extend_from_slice(b"reply"));
        let_writer_run().await;
        assert_eq!(
            writes.lock().iter().sum::<usize>(),
            2 * DELIVERY_BYTES + 5,
            "the reply and the delivery held before it are written"
        );
        assert_eq!(
            Instant::now(),
            before,
            "written without waiting for a timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_that_uses_up_the_prefetch_is_not_held() {
        use berth_broker::channel::Outlet;
        let (out, writes) = start();
        let msg = berth_broker::message::Message::new(
            "".into(),
            "q".into(),
            codec::encode_properties(&berth_protocol::AMQPProperties::default()),
            bytes::Bytes::from_static(b"body"),
        )
        .expect("a valid message");
        out.deliver(1, "ctag", 1, false, &msg, true);
        let_writer_run().await;
        out.deliver(1, "ctag", 2, false, &msg, true);
        let_writer_run().await;
        assert_eq!(
            writes.lock().len(),
            1,
            "the second is held: the consumer may get more"
        );
        let before = Instant::now();
        out.deliver(1, "ctag", 3, false, &msg, false);
        let_writer_run().await;
        assert_eq!(
            writes.lock().len(),
            2,
            "the one the consumer waits for goes out with the held one"
        );
        assert_eq!(
            Instant::now(),
            before,
            "written without waiting for a timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_write_is_not_held() {
        let (out, writes) = start();
        deliver(&out);
        let_writer_run().await;
        let before = Instant::now();
        let n = limits::OUTPUT_GATHER_BYTES_MAX / DELIVERY_BYTES + 1;
        for _ in 0..n {
            deliver(&out);
        }
        let_writer_run().await;
        assert_eq!(*writes.lock(), [DELIVERY_BYTES, n * DELIVERY_BYTES]);
        assert_eq!(
            Instant::now(),
            before,
            "written without waiting for a timer"
        );
    }
}
