//! A group's queue of requests: sending never blocks, and the bound
//! (`channel_requests_max`) is kept by admission instead — callers ask
//! for room ([`Room::poll`], [`Room::wait`]) before they take on more work,
//! and are woken when the writer has taken enough.
//!
//! Why: a sender blocked on a full channel is a thread that does nothing
//! else, and on a tokio worker that thread runs other connections' tasks
//! (docs/ARCHITECTURE.md, "Bounds and back-pressure"). With admission,
//! the thread that wants to send more awaits room as a future (or parks,
//! off any runtime), and nothing is ever refused or dropped.
//!
//! Invariants:
//! - `queued` counts requests sent and not yet taken by the writer (every
//!   send adds one before the request is visible, every take removes one).
//! - A poll that returns `Pending` has registered its waker before its last
//!   look at `queued`, and the writer wakes every registered waker when
//!   `queued` drops below the bound: a waiter is never forgotten.
//! - The queue exceeds its bound only by what callers send without asking
//!   for room first, or after one admission (at most one unit of work each,
//!   e.g. one AMQP frame per connection): bounded by the number of callers.
//! - A writer gathering a batch ([`Inbox::wait_queued`]) is woken once,
//!   by the send that brings the queue to the count it waits for, not by
//!   every send: the waiter sets the count before its last look at
//!   `queued`, every sender looks at the count after adding to `queued`
//!   (both sequentially consistent), so one of them sees the other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What senders and the writer share: the count and who waits for room.
pub(crate) struct Room {
    queued: AtomicUsize,
    requests_max: usize,
    waiters: Mutex<Vec<Waker>>,
    /// The count of queued requests a gathering writer waits for; 0 when
    /// none does.
    wake_at: AtomicUsize,
    /// The writer's thread, once it has gathered.
    gatherer: OnceLock<Thread>,
}

impl Room {
    /// Whether the queue is below its bound now.
    pub fn has_room(&self) -> bool {
        self.queued.load(Ordering::SeqCst) < self.requests_max
    }

    /// `Ready` once the queue is below its bound; else `Pending`, and
    /// `cx`'s waker is woken when it is.
    pub fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        {
            let mut waiters = self.waiters.lock();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
        }
        // The writer may have taken requests since the first look.
        if self.has_room() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Blocks the calling thread until the queue is below its bound (for
    /// threads off any async runtime: tools, tests).
    pub fn wait(&self) {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        while self.poll(&mut cx).is_pending() {
            std::thread::park();
        }
    }

    fn taken(&self) {
        let before = self.queued.fetch_sub(1, Ordering::SeqCst);
        if before == self.requests_max {
            let waiters = std::mem::take(&mut *self.waiters.lock());
            for w in waiters {
                w.wake();
            }
        }
    }
}

/// The sending side (one per group, held by the store).
pub(crate) struct Outbox {
    tx: Sender<super::Cmd>,
    room: Arc<Room>,
}

impl Outbox {
    /// Queues `cmd` without waiting, whatever the count; gives it back if
    /// the writer is gone.
    // A request carries its payload's short head inline (`Payload`), so
    // it is large; it is handed back whole, once, only when the writer is
    // gone, for its completion to run: boxing it would be the allocation
    // per request the inline head exists to avoid.
    #[allow(clippy::result_large_err)]
    pub fn send(&self, cmd: super::Cmd) -> Result<(), mpsc::SendError<super::Cmd>> {
        let room = &self.room;
        let queued = room.queued.fetch_add(1, Ordering::SeqCst) + 1;
        self.tx.send(cmd).inspect_err(|_| {
            room.queued.fetch_sub(1, Ordering::SeqCst);
        })?;
        let at = room.wake_at.load(Ordering::SeqCst);
        if at != 0
            && queued >= at
            && room
                .wake_at
                .compare_exchange(at, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            if let Some(t) = room.gatherer.get() {
                t.unpark();
            }
        }
        Ok(())
    }

    pub fn room(&self) -> &Room {
        &self.room
    }
}

/// The writer's side: each request taken is counted out of the queue.
pub(crate) struct Inbox {
    rx: Receiver<super::Cmd>,
    room: Arc<Room>,
}

impl Inbox {
    pub fn recv(&self) -> Result<super::Cmd, RecvError> {
        self.rx.recv().inspect(|_| self.room.taken())
    }

    pub fn recv_timeout(&self, timeout: Duration) -> Result<super::Cmd, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).inspect(|_| self.room.taken())
    }

    pub fn try_recv(&self) -> Result<super::Cmd, TryRecvError> {
        self.rx.try_recv().inspect(|_| self.room.taken())
    }

    /// Requests sent and not yet taken.
    pub fn queued(&self) -> usize {
        self.room.queued.load(Ordering::Acquire)
    }

    /// Blocks until at least `count` requests are queued or `timeout` has
    /// passed, without taking any; returns whether they are there. The
    /// senders wake the caller once, when the count is reached: a batch
    /// gathered from many committers costs the writer one wake-up, not
    /// one per arrival (issue 20). Call from the writer's thread only.
    pub fn wait_queued(&self, count: usize, timeout: Duration) -> bool {
        let room = &self.room;
        let reached = || room.queued.load(Ordering::SeqCst) >= count;
        if reached() {
            return true;
        }
        room.gatherer.get_or_init(std::thread::current);
        let deadline = Instant::now() + timeout;
        let got = loop {
            // Armed again at every turn: a sender that read a stale count
            // may have disarmed it with a wake-up that came too early.
            room.wake_at.store(count, Ordering::SeqCst);
            if reached() {
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            // A wake-up may be spurious, or meant for another wait (the
            // channel's own receive parks this thread too): look again.
            std::thread::park_timeout(left);
        };
        room.wake_at.store(0, Ordering::SeqCst);
        got
    }
}

/// A group's request queue, bounded by admission at `requests_max`.
pub(crate) fn inbox(requests_max: usize) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel();
    let room = Arc::new(Room {
        queued: AtomicUsize::new(0),
        requests_max,
        waiters: Mutex::new(Vec::new()),
        wake_at: AtomicUsize::new(0),
        gatherer: OnceLock::new(),
    });
    (
        Outbox {
            tx,
            room: Arc::clone(&room),
        },
        Inbox { rx, room },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::Cmd;

    fn cmd() -> Cmd {
        Cmd::Checkpoint {
            done: Box::new(|_| {}),
        }
    }

    #[test]
    fn a_full_queue_accepts_sends_and_wakes_its_waiters_once_taken_below_the_bound() {
        let (out, inb) = inbox(2);
        for _ in 0..3 {
            out.send(cmd()).expect("never refused for being full");
        }
        assert!(!out.room().has_room());
        let woken = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = Waker::from(Arc::new(Count(Arc::clone(&woken))));
        let mut cx = Context::from_waker(&waker);
        assert!(out.room().poll(&mut cx).is_pending());
        inb.try_recv().map(drop).expect("queued");
        assert_eq!(woken.load(Ordering::SeqCst), 0, "still at the bound");
        inb.try_recv().map(drop).expect("queued");
        assert_eq!(woken.load(Ordering::SeqCst), 1, "below the bound: woken");
        assert!(out.room().poll(&mut cx).is_ready());
    }
}
