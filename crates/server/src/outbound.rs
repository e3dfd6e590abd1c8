//! A connection's output: frames appended by the connection task and by
//! queues delivering to its consumers, written to the socket by one writer
//! task.
//!
//! Invariants:
//! - Every append is of whole frames, under one lock, so frames from
//!   different producers never interleave.
//! - Output is bounded: above `limit_bytes` the outlet reports congestion
//!   and queues hold their messages back; above twice that the connection
//!   stops reading too, so replies it would make (`basic.return`s above
//!   all) stop growing. Deliveries alone stop at `limit_bytes`, so a client
//!   that publishes while it is slow to read its deliveries is still read;
//!   only replies it provokes and never reads fill the second half. The
//!   writer signals `drained` when it has taken the backlog, so both
//!   resume. At most twice `limit_bytes` plus one read's worth of replies
//!   is buffered, plus what the writer has taken and not yet written.
//! - While the writer waits for the socket (the peer reads slower than it
//!   is sent to), deliveries stop once the buffer holds as much as the
//!   write in progress, or [`OUTPUT_BEHIND_BLOCKED_SOCKET_BYTES_MAX`] if
//!   that is more (never above `limit_bytes`): what a consumer
//!   cannot take stays in its queue, where flow control holds publishers
//!   back, rather than waiting here as latency.
//! - Every output byte is counted in [`crate::memory::OUTPUT_BYTES`] (for
//!   the memory alarm) from its push until it is written or dropped.
//! - Only server-sent `basic.cancel`s are ever held back, and only between
//!   `hold_cancels` and `release_cancels`, which sends them in order.
//! - Bytes reach the socket in the order they were pushed: [`Outbound::push_now`]
//!   writes to the socket itself only while nothing is buffered and the
//!   writer is not writing, under the buffer's lock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use berth_broker::channel::Outlet;
use berth_broker::message::Message;
use berth_protocol::codec;
use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use crate::limits::OUTPUT_BEHIND_BLOCKED_SOCKET_BYTES_MAX;
use crate::memory::{Counted, OUTPUT_BYTES};
use crate::pending_output::Output;

/// The buffer and its share of [`OUTPUT_BYTES`].
struct Buffer {
    out: Output,
    counted: Counted,
    /// The writer took output and has not finished writing it.
    writing: bool,
    /// The connection's plain TCP socket (a second handle to it), for
    /// [`Outbound::push_now`]; `None` for TLS, and once closed.
    socket: Option<std::net::TcpStream>,
    /// Frames being written by [`Outbound::push_now`], kept for the next.
    scratch: BytesMut,
}

/// The shared output buffer of one connection.
pub struct Outbound {
    buf: Mutex<Buffer>,
    /// Wakes the writer.
    pub ready: Notify,
    /// Wakes the connection task when a congested buffer was taken.
    pub drained: Notify,
    congested: AtomicBool,
    /// The writer's last write found the socket full and waits for it.
    socket_blocked: AtomicBool,
    /// Bytes of the write in progress: behind a full socket, queues may
    /// add as much again (at least [`OUTPUT_BEHIND_BLOCKED_SOCKET_BYTES_MAX`]),
    /// so a consumer that drains fast keeps a full write waiting while a
    /// slow one gets no more than it drains.
    writing_bytes: AtomicUsize,
    closed: AtomicBool,
    limit_bytes: usize,
    frame_max: AtomicU32,
    /// Negotiated heartbeat; the writer sends one after this much silence.
    heartbeat_ms: AtomicU32,
    /// Server-sent `basic.cancel`s (channel, consumer tag) held back while
    /// the connection answers a `queue.delete`; `None` when not holding.
    held_cancels: Mutex<Option<Vec<(u16, String)>>>,
}

impl Outbound {
    pub fn new(limit_bytes: usize, frame_max: u32) -> Arc<Self> {
        Arc::new(Self {
            buf: Mutex::new(Buffer {
                out: Output::default(),
                counted: Counted::new(&OUTPUT_BYTES),
                writing: false,
                socket: None,
                scratch: BytesMut::new(),
            }),
            ready: Notify::new(),
            drained: Notify::new(),
            congested: AtomicBool::new(false),
            socket_blocked: AtomicBool::new(false),
            writing_bytes: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            limit_bytes,
            frame_max: AtomicU32::new(frame_max),
            heartbeat_ms: AtomicU32::new(0),
            held_cancels: Mutex::new(None),
        })
    }

    pub fn set_frame_max(&self, frame_max: u32) {
        self.frame_max.store(frame_max, Ordering::Relaxed);
    }

    pub fn set_heartbeat_ms(&self, ms: u32) {
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }

    pub fn heartbeat_ms(&self) -> u32 {
        self.heartbeat_ms.load(Ordering::Relaxed)
    }

    pub fn frame_max(&self) -> u32 {
        self.frame_max.load(Ordering::Relaxed)
    }

    /// Appends frames produced by `f` and wakes the writer.
    pub fn push(&self, f: impl FnOnce(&mut BytesMut)) {
        self.push_output(|out| out.append(f));
    }

    /// Appends frames produced by `method` and a message's content after
    /// them, its large body pieces shared rather than copied
    /// ([`Output::append_content`]), and wakes the writer.
    pub fn push_content(
        &self,
        method: impl FnOnce(&mut BytesMut),
        channel: u16,
        properties: &[u8],
        body: &Bytes,
    ) {
        let frame_max = self.frame_max();
        self.push_output(|out| out.append_content(method, channel, properties, body, frame_max));
    }

    /// Lets [`Self::push_now`] write to `socket` (a second handle to the
    /// connection's plain TCP socket, non-blocking like the first).
    pub fn write_directly_to(&self, socket: std::net::TcpStream) {
        self.buf.lock().socket = Some(socket);
    }

    /// Appends frames produced by `f`, as [`Self::push`] does, except that
    /// when nothing is buffered and the writer is not writing they go
    /// straight to the socket from this thread: a store writer completing
    /// publisher confirms wakes no task for them. What the socket does not
    /// take at once (it is full, or fails) is buffered for the writer.
    pub fn push_now(&self, f: impl FnOnce(&mut BytesMut)) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut guard = self.buf.lock();
        let buf = &mut *guard;
        let Some(socket) = buf
            .socket
            .as_ref()
            .filter(|_| buf.out.is_empty() && !buf.writing)
        else {
            self.append_and_wake(guard, |out| out.append(f));
            return;
        };
        f(&mut buf.scratch);
        if buf.scratch.is_empty() {
            return;
        }
        // On an error the writer meets it (or the socket's room) itself.
        let written: usize = std::io::Write::write(&mut &*socket, &buf.scratch).unwrap_or_default();
        let left = buf.scratch.split_off(written);
        buf.scratch.clear();
        if !left.is_empty() {
            self.append_and_wake(guard, |out| out.append(|b| b.extend_from_slice(&left)));
        }
    }

    fn push_output(&self, f: impl FnOnce(&mut Output)) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.append_and_wake(self.buf.lock(), f);
    }

    /// Appends to the locked buffer, counts it, and wakes the writer once
    /// the lock is released.
    fn append_and_wake(&self, mut buf: MutexGuard<'_, Buffer>, f: impl FnOnce(&mut Output)) {
        f(&mut buf.out);
        let len = buf.out.len() as u64;
        buf.counted.set(len);
        drop(buf);
        self.ready.notify_one();
    }

    /// Takes everything buffered (the writer's side), leaving `spare` (an
    /// emptied output the writer is done with) in its place when there was
    /// something to take; an idle connection keeps no buffer. The bytes
    /// stay counted in `in_flight` until the writer lets go of them.
    pub fn take(&self, in_flight: &mut Counted, spare: Output) -> Output {
        let out = {
            let mut buf = self.buf.lock();
            buf.counted.set(0);
            buf.writing = !buf.out.is_empty();
            if buf.out.is_empty() {
                std::mem::take(&mut buf.out)
            } else {
                std::mem::replace(&mut buf.out, spare)
            }
        };
        in_flight.set(out.len() as u64);
        if self.congested.swap(false, Ordering::AcqRel) {
            self.drained.notify_one();
        }
        out
    }

    /// The writer's side: what it took is written (or failed).
    pub fn written(&self) {
        self.buf.lock().writing = false;
    }

    /// The writer's side: whether it is waiting for the socket to take
    /// more (set when a write could not finish at once, cleared when it
    /// did).
    /// The writer's side: the size of the write it starts.
    pub fn set_writing_bytes(&self, bytes: usize) {
        self.writing_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn set_socket_blocked(&self, blocked: bool) {
        self.socket_blocked.store(blocked, Ordering::Release);
    }

    /// Stops accepting output (the connection is going away).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        // The socket closes when the connection lets go of it, not when
        // the last completion holding this output does.
        let socket = self.buf.lock().socket.take();
        drop(socket);
        self.ready.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buf.lock().out.len()
    }

    /// Whether the buffer is at twice its bound: the connection then stops
    /// reading until the writer took it.
    pub fn is_full(&self) -> bool {
        let full = self.buf.lock().out.len() >= self.limit_bytes.saturating_mul(2);
        if full {
            self.congested.store(true, Ordering::Release);
        }
        full
    }

    /// Holds back server-sent `basic.cancel`s until [`Self::release_cancels`],
    /// so that the reply to the method at hand goes out first: RabbitMQ's
    /// channel tells its consumers that their queue is gone only after it
    /// has answered the `queue.delete` that deleted it.
    pub fn hold_cancels(&self) {
        *self.held_cancels.lock() = Some(Vec::new());
    }

    /// Sends the held `basic.cancel`s, in order, and stops holding.
    pub fn release_cancels(&self) {
        let held = self.held_cancels.lock().take();
        for (channel, consumer_tag) in held.into_iter().flatten() {
            self.push_cancel(channel, &consumer_tag);
        }
    }

    fn push_cancel(&self, channel: u16, consumer_tag: &str) {
        use berth_protocol::methods::{basic, AMQPClass};
        self.push(|b| {
            codec::encode_method(
                b,
                channel,
                &AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                    consumer_tag: consumer_tag.into(),
                    nowait: true,
                })),
            );
        });
    }
}

impl Outlet for Outbound {
    fn deliver(
        &self,
        channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
    ) {
        self.push_content(
            |b| {
                codec::encode_deliver(
                    b,
                    channel,
                    consumer_tag,
                    delivery_tag,
                    redelivered,
                    &msg.exchange,
                    &msg.routing_key,
                );
            },
            channel,
            &msg.properties,
            &msg.body,
        );
    }

    fn get_ok(
        &self,
        channel: u16,
        delivery_tag: u64,
        redelivered: bool,
        msg: &Message,
        message_count: u32,
    ) {
        self.push_content(
            |b| {
                codec::encode_get_ok(
                    b,
                    channel,
                    delivery_tag,
                    redelivered,
                    &msg.exchange,
                    &msg.routing_key,
                    message_count,
                );
            },
            channel,
            &msg.properties,
            &msg.body,
        );
    }

    fn consumer_cancelled(&self, channel: u16, consumer_tag: &str) {
        if let Some(held) = self.held_cancels.lock().as_mut() {
            held.push((channel, consumer_tag.to_owned()));
            return;
        }
        self.push_cancel(channel, consumer_tag);
    }

    fn is_congested(&self) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return true;
        }
        let limit = if self.socket_blocked.load(Ordering::Acquire) {
            self.writing_bytes
                .load(Ordering::Relaxed)
                .max(OUTPUT_BEHIND_BLOCKED_SOCKET_BYTES_MAX)
                .min(self.limit_bytes)
        } else {
            self.limit_bytes
        };
        let buf = self.buf.lock();
        let over = buf.out.len() >= limit;
        if over {
            // Under the lock: a `take` after this sees the flag and wakes
            // the connection (`drained`), one before it left bytes behind
            // that a later `take` will find.
            self.congested.store(true, Ordering::Release);
        }
        over
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn direct_writes_wait_behind_what_the_writer_took() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        client.set_nonblocking(true).unwrap();
        let out = Outbound::new(1 << 20, 131_072);
        out.write_directly_to(server);
        let mut in_flight = Counted::new(&OUTPUT_BYTES);
        let mut got = [0u8; 64];

        out.push(|b| b.extend_from_slice(b"first"));
        let taken = out.take(&mut in_flight, Output::default());
        assert_eq!(taken.len(), 5, "the writer took the first frames");
        out.push_now(|b| b.extend_from_slice(b"second"));
        assert_eq!(
            out.buffered_bytes(),
            6,
            "buffered behind the write in progress"
        );
        assert!(
            client.read(&mut got).is_err(),
            "nothing overtook the writer"
        );

        out.written();
        assert_eq!(out.take(&mut in_flight, taken.recycle(1024)).len(), 6);
        out.written();
        out.push_now(|b| b.extend_from_slice(b"third"));
        assert_eq!(out.buffered_bytes(), 0, "written at once by an idle output");
        client.set_nonblocking(false).unwrap();
        let n = client.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"third");

        out.close();
        out.push_now(|b| b.extend_from_slice(b"late"));
        assert_eq!(out.buffered_bytes(), 0, "a closed output takes nothing");
    }
}
