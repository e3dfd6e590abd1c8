//! Publisher confirms and transaction commits that wait on the store.
//!
//! A publish is confirmed once it is routed and, if it was journaled, once
//! the journal says it is stored. Acks go out as `basic.ack multiple` up to
//! the first publish still waiting for the journal. A `tx.commit-ok` goes
//! out once every journal write of the commit completed.
//!
//! A journaled publish's completion sends the acks itself, from the thread
//! that completes it (a store group's writer): once per channel per batch
//! ([`berth_store::completion::after_completions`]), straight to the
//! socket when nothing is waiting to be written before them
//! ([`Outbound::push_now`]). No task is woken for a confirm: on two vCPUs
//! a wake-up costs more than the rest of the confirm (docs/BENCHMARKS.md,
//! "the price of a sleep"). Transaction completions still go through the
//! connection task, which owns the channel's `tx.commit` state.
//!
//! Invariants:
//! - A confirm or `tx.commit-ok` for a journaled message is sent only after
//!   the store completed its write (docs/ARCHITECTURE.md, invariant 1).
//! - A publish is waited for (in `waiting`) before its completion exists,
//!   so a completion that runs at once (a write refused up front) finds it.
//! - Once a channel is closed or closing, no ack or nack of it is sent: a
//!   completion from an earlier life of a channel number holds that life's
//!   bookkeeping, not the current one's, and still releases its count in
//!   [`Completions::unconfirmed`].
//! - Acks and nacks are encoded under the output's lock, then the
//!   channel's ([`ChannelConfirms`]); nothing takes them the other way
//!   round.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use berth_broker::channel::Published;
use berth_broker::durable::{Done, JournalError};
use berth_broker::AmqpError;
use berth_protocol::codec::{self, CLASS_TX, METHOD_TX_COMMIT};
use berth_protocol::methods::tx;
use berth_protocol::AMQPClass;
use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::exception::End;
use super::Conn;
use crate::limits;
use crate::outbound::Outbound;

/// Publisher confirm bookkeeping for a channel in confirm mode.
#[derive(Default)]
struct Confirms {
    /// Sequence number of the last publish.
    last_seq: u64,
    /// Highest sequence number confirmed (acked or nacked) to the client.
    acked_upto: u64,
    /// Publishes waiting for the journal.
    waiting: BTreeSet<u64>,
    /// Publishes already nacked individually (refused, or the store failed).
    nacked: BTreeSet<u64>,
    /// A flush of the acks is left for after the batch being completed.
    flush_due: bool,
    /// The channel closed (or is closing): nothing more is sent for it.
    closed: bool,
}

impl Confirms {
    /// The highest sequence number that can be confirmed now.
    fn frontier(&self) -> u64 {
        self.waiting.first().map_or(self.last_seq, |w| w - 1)
    }

    /// Frames confirming everything that can be confirmed now.
    fn flush(&mut self, channel: u16, out: &mut BytesMut) {
        let frontier = self.frontier();
        if self.closed || frontier <= self.acked_upto {
            return;
        }
        let nacked_in_range = self
            .nacked
            .range(self.acked_upto + 1..=frontier)
            .next()
            .is_some();
        if nacked_in_range {
            // Rare (a refusal or a store failure): ack one by one around the nacks.
            for seq in self.acked_upto + 1..=frontier {
                if !self.nacked.contains(&seq) {
                    codec::encode_ack(out, channel, seq, false);
                }
            }
            self.nacked = self.nacked.split_off(&(frontier + 1));
        } else {
            codec::encode_ack(out, channel, frontier, frontier > self.acked_upto + 1);
        }
        self.acked_upto = frontier;
    }

    /// Records `seq` as nacked; whether a `basic.nack` is to be sent.
    fn nack(&mut self, seq: u64) -> bool {
        self.nacked.insert(seq) && !self.closed
    }
}

/// A channel's confirm bookkeeping, shared by the connection task (which
/// numbers the publishes) and their completions (which confirm them).
#[derive(Default)]
pub(super) struct ChannelConfirms {
    state: Mutex<Confirms>,
}

impl ChannelConfirms {
    /// The sequence number the next publish gets.
    pub(super) fn next_seq(&self) -> u64 {
        self.state.lock().last_seq + 1
    }

    /// The publish numbered `seq` was routed; `rejected`: a queue refused
    /// it. Whether to send a `basic.nack` for it. Both under one lock: a
    /// completion flushing in between would ack what is about to be
    /// nacked.
    pub(super) fn published(&self, seq: u64, rejected: bool) -> bool {
        let mut c = self.state.lock();
        c.last_seq = seq;
        rejected && c.nack(seq)
    }

    /// Nothing more is sent for this channel.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Whether anything can be confirmed now.
    fn has_due(&self) -> bool {
        let c = self.state.lock();
        !c.closed && c.frontier() > c.acked_upto
    }

    /// Frames confirming everything that can be confirmed now.
    fn flush(&self, channel: u16, out: &mut BytesMut) {
        let mut c = self.state.lock();
        c.flush_due = false;
        c.flush(channel, out);
    }

    /// The journal finished the write of publish `seq`: nacks it if it
    /// failed, and leaves one flush of the channel's acks for after the
    /// batch being completed.
    fn stored(
        self: &Arc<Self>,
        channel: u16,
        seq: u64,
        result: Result<(), JournalError>,
        out: &Arc<Outbound>,
    ) {
        let (nack, flush) = {
            let mut c = self.state.lock();
            c.waiting.remove(&seq);
            let nack = result.is_err() && c.nack(seq);
            let flush = !std::mem::replace(&mut c.flush_due, true);
            (nack, flush)
        };
        if let Err(e) = result {
            tracing::error!(channel, seq, error = %e, "persistent message not stored; publisher gets basic.nack");
        }
        if nack {
            out.push_now(|b| codec::encode_nack(b, channel, seq, false));
        }
        if flush {
            let me = Arc::clone(self);
            let out = Arc::clone(out);
            berth_store::completion::after_completions(move || {
                // A writer with a deep queue (pipelined publishers) hands
                // the write to the connection's writer task instead of
                // doing it: its time is what they wait for.
                if berth_store::completion::waiting() >= limits::ACKS_HANDED_BACK_QUEUED_MIN {
                    out.push(|b| me.flush(channel, b));
                } else {
                    out.push_now(|b| me.flush(channel, b));
                }
            });
        }
    }
}

/// A connection's count of confirms waiting for the store, shared with
/// their completions.
#[derive(Default)]
pub(super) struct Completions {
    /// Confirm-mode publishes waiting for the journal, all channels.
    unconfirmed: AtomicUsize,
    /// Woken when a completion brings a connection that stopped reading
    /// for its count back under the bound ([`flow`](super::flow)).
    pub(super) room: Notify,
}

impl Completions {
    pub(super) fn unconfirmed(&self) -> usize {
        self.unconfirmed.load(Ordering::Acquire)
    }

    fn waits(&self) {
        self.unconfirmed.fetch_add(1, Ordering::AcqRel);
    }

    fn done(&self) {
        let before = self.unconfirmed.fetch_sub(1, Ordering::AcqRel);
        // The connection stops reading only once this count and its
        // transaction waits reach the bound; below half of it, the
        // transaction waits (which wake it themselves) are the larger part.
        if before >= limits::COMPLETIONS_PER_CONNECTION_MAX / 2 {
            self.room.notify_one();
        }
    }
}

/// A transaction's journal completion, sent from a store thread to the
/// connection task. `generation` names the channel's life it belongs to: a
/// channel number can be closed and opened again before the completions of
/// its first life arrive, and those must not commit anything of the second.
pub(super) struct Stored {
    channel: u16,
    generation: u64,
    result: Result<(), String>,
}

/// The completion of publish `seq` on `channel` in confirm mode: it is
/// waited for from now on, and the completion confirms it on `confirms`,
/// writing to `out`.
fn confirm_completion(
    out: &Arc<Outbound>,
    completions: &Arc<Completions>,
    channel: u16,
    confirms: &Arc<ChannelConfirms>,
    seq: u64,
) -> Done {
    // Waited for before the completion exists: it may run at once.
    confirms.state.lock().waiting.insert(seq);
    completions.waits();
    let (out, completions, c) = (
        Arc::clone(out),
        Arc::clone(completions),
        Arc::clone(confirms),
    );
    Box::new(move |r: Result<(), JournalError>| {
        completions.done();
        c.stored(channel, seq, r, &out);
    })
}

impl Conn {
    /// Makes the store completions of one publish: each confirms it on
    /// `confirms` if the channel is in confirm mode (`seq` is its number),
    /// or logs a failure otherwise.
    pub(super) fn publish_completion(
        &self,
        channel: u16,
        confirms: Option<(Arc<ChannelConfirms>, u64)>,
    ) -> impl FnMut() -> Done {
        let out = Arc::clone(&self.out);
        let completions = Arc::clone(&self.completions);
        move || -> Done {
            match &confirms {
                Some((c, seq)) => confirm_completion(&out, &completions, channel, c, *seq),
                None => Box::new(|r: Result<(), JournalError>| {
                    if let Err(e) = r {
                        tracing::error!(error = %e, "a persistent message could not be stored");
                    }
                }),
            }
        }
    }

    /// Makes the store completions a `tx.commit` on `channel` waits for,
    /// counting them in `waits`.
    pub(super) fn tx_completion<'a>(
        &self,
        channel: u16,
        waits: &'a mut usize,
    ) -> impl FnMut() -> Done + 'a {
        let sender = self.stored_tx.clone();
        let generation = self
            .channels
            .get(&channel)
            .expect("slot exists for an open channel")
            .generation;
        move || -> Done {
            *waits += 1;
            let sender = sender.clone();
            Box::new(move |r| {
                let _connection_may_be_gone = sender.send(Stored {
                    channel,
                    generation,
                    result: r.map_err(|e| e.to_string()),
                });
            })
        }
    }

    /// Confirm bookkeeping for a routed publish in confirm mode: a refused
    /// one is nacked at once (a journaled one is waited for by its
    /// completion, [`Self::publish_completion`]).
    pub(super) fn track_confirm(&mut self, channel: u16, p: &Published, seq: u64) {
        let out = Arc::clone(&self.out);
        let Some(c) = self.slot(channel).confirms.as_ref() else {
            return;
        };
        if c.published(seq, p.result.rejected) {
            out.push(|b| codec::encode_nack(b, channel, seq, false));
        }
        if self.confirms_due.last() != Some(&channel) {
            self.confirms_due.push(channel);
        }
    }

    /// A transaction's journal write finished.
    pub(super) fn on_stored(&mut self, s: Stored) -> Result<(), End> {
        self.on_tx_stored(s.channel, s.generation, s.result)
    }

    fn on_tx_stored(
        &mut self,
        channel: u16,
        generation: u64,
        result: Result<(), String>,
    ) -> Result<(), End> {
        self.tx_waits = self.tx_waits.saturating_sub(1);
        if let Err(e) = result {
            return Err(AmqpError::internal(format!(
                "transaction on channel {channel} could not be stored: {e}"
            ))
            .during(CLASS_TX, METHOD_TX_COMMIT)
            .into());
        }
        let Some(slot) = self
            .channels
            .get_mut(&channel)
            .filter(|s| s.generation == generation)
        else {
            return Ok(());
        };
        slot.tx_waiting = slot.tx_waiting.saturating_sub(1);
        if slot.tx_waiting == 0 && slot.tx_commit_pending {
            slot.tx_commit_pending = false;
            self.send_method(
                channel,
                &AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
            );
        }
        Ok(())
    }

    /// Confirms what can be confirmed on the channels that published in
    /// this read batch, one `basic.ack multiple` per channel (publishes
    /// that were not journaled; the journaled ones are confirmed by their
    /// completions). A connection with many channels does not look at
    /// the others.
    pub(super) fn flush_confirms(&mut self) {
        let mut due = std::mem::take(&mut self.confirms_due);
        for id in due.drain(..) {
            let confirms = self.channels.get(&id).and_then(|s| s.confirms.as_ref());
            if let Some(c) = confirms.filter(|c| c.has_due()) {
                self.out.push(|b| c.flush(id, b));
            }
        }
        self.confirms_due = due;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use berth_protocol::codec::{decode_method, Method};
    use berth_protocol::frame::decode_frame;
    use berth_protocol::methods::basic;

    use super::*;

    /// A channel in confirm mode whose output's direct writes reach
    /// `client`.
    struct Fixture {
        out: Arc<Outbound>,
        client: TcpStream,
        completions: Arc<Completions>,
        confirms: Arc<ChannelConfirms>,
    }

    impl Fixture {
        fn new() -> Self {
            let (out, client) = connected_output();
            Self {
                out,
                client,
                completions: Arc::default(),
                confirms: Arc::default(),
            }
        }

        /// Publishes `seq` on `channel`: its completion, once routed.
        fn publish(&self, channel: u16, seq: u64) -> Done {
            let done =
                confirm_completion(&self.out, &self.completions, channel, &self.confirms, seq);
            self.confirms.published(seq, false);
            done
        }
    }

    /// An output whose direct writes reach the returned client socket.
    fn connected_output() -> (Arc<Outbound>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let out = Outbound::new(1 << 20, 131_072);
        out.write_directly_to(server);
        client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        (out, client)
    }

    /// The methods the client has received, waiting at most the read
    /// timeout for the first bytes.
    fn received(client: &mut TcpStream) -> Vec<AMQPClass> {
        let mut bytes = BytesMut::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = client.read(&mut chunk) {
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..n]);
            client
                .set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
        }
        let mut methods = Vec::new();
        while let Some(f) = decode_frame(&mut bytes, 131_072).unwrap() {
            match decode_method(&f.payload).unwrap() {
                Method::Other(m) => methods.push(m),
                other => panic!("unexpected method {other:?}"),
            }
        }
        methods
    }

    fn ack(delivery_tag: u64, multiple: bool) -> AMQPClass {
        AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag,
            multiple,
        }))
    }

    #[test]
    fn a_batch_of_stored_publishes_is_acked_once_from_the_completing_thread() {
        // No runtime and no connection task: only the thread completing
        // the batch can write the ack.
        let mut f = Fixture::new();
        let dones: Vec<Done> = (1..=3).map(|seq| f.publish(7, seq)).collect();
        assert_eq!(f.completions.unconfirmed(), 3);
        std::thread::spawn(move || {
            berth_store::completion::completing(0, || {
                for d in dones {
                    d(Ok(()));
                }
            });
        })
        .join()
        .unwrap();
        assert_eq!(
            received(&mut f.client),
            [ack(3, true)],
            "one ack for the batch"
        );
        assert_eq!(f.completions.unconfirmed(), 0);
        assert_eq!(f.out.buffered_bytes(), 0, "nothing left for the writer");
    }

    #[test]
    fn a_writer_with_a_shallow_queue_still_writes_the_acks_itself() {
        // Producers with one publish in flight each queue a few requests
        // behind a batch: their acks are what the writer waits for.
        let mut f = Fixture::new();
        let done = f.publish(1, 1);
        let shallow = limits::ACKS_HANDED_BACK_QUEUED_MIN - 1;
        berth_store::completion::completing(shallow, || done(Ok(())));
        assert_eq!(received(&mut f.client), [ack(1, false)]);
    }

    #[test]
    fn a_writer_with_a_deep_queue_leaves_the_acks_to_the_connections_writer() {
        let mut f = Fixture::new();
        let done = f.publish(1, 1);
        let deep = limits::ACKS_HANDED_BACK_QUEUED_MIN;
        berth_store::completion::completing(deep, || done(Ok(())));
        assert_eq!(
            received(&mut f.client),
            [],
            "not written by the store's thread"
        );
        let mut frames = BytesMut::new();
        codec::encode_ack(&mut frames, 1, 1, false);
        assert_eq!(
            f.out.buffered_bytes(),
            frames.len(),
            "buffered for the writer"
        );
    }

    #[test]
    fn a_failed_write_is_nacked_and_the_rest_acked_around_it() {
        let mut f = Fixture::new();
        let dones: Vec<Done> = (1..=3).map(|seq| f.publish(1, seq)).collect();
        berth_store::completion::completing(0, || {
            for (seq, d) in (1..).zip(dones) {
                d(if seq == 2 {
                    Err(JournalError::new("disk gone"))
                } else {
                    Ok(())
                });
            }
        });
        let nack = AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: 2,
            multiple: false,
            requeue: false,
        }));
        assert_eq!(
            received(&mut f.client),
            [nack, ack(1, false), ack(3, false)]
        );
    }

    #[test]
    fn a_closed_channel_gets_nothing_from_completions_of_its_life() {
        let mut f = Fixture::new();
        let done = f.publish(1, 1);
        f.confirms.close();
        done(Ok(()));
        assert_eq!(received(&mut f.client), []);
        assert_eq!(f.completions.unconfirmed(), 0, "its count is released");
    }

    #[test]
    fn a_completion_that_runs_at_once_is_not_lost() {
        // A write refused before it reached a writer completes inside the
        // publish, before the connection numbers it as routed.
        let mut f = Fixture::new();
        confirm_completion(&f.out, &f.completions, 1, &f.confirms, 1)(Ok(()));
        f.confirms.published(1, false);
        let mut frames = BytesMut::new();
        f.confirms.flush(1, &mut frames);
        f.out.push_now(|b| b.extend_from_slice(&frames));
        assert_eq!(received(&mut f.client), [ack(1, false)]);
    }
}
