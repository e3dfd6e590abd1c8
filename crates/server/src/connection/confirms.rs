//! Publisher confirms and transaction commits that wait on the store.
//!
//! A publish is confirmed once it is routed and, if it was journaled, once
//! the journal says it is stored. Acks go out as `basic.ack multiple` up to
//! the first publish still waiting for the journal. A `tx.commit-ok` goes
//! out once every journal write of the commit completed.
//!
//! Invariants:
//! - A confirm or `tx.commit-ok` for a journaled message is sent only after
//!   the store completed its write (docs/ARCHITECTURE.md, invariant 1).
//! - A completion names the channel's generation: one from an earlier life
//!   of a channel number never confirms or commits anything of the current
//!   one, yet still releases its count in `unconfirmed`.

use std::collections::BTreeSet;
use std::sync::Arc;

use berth_broker::channel::Published;
use berth_broker::durable::{Done, JournalError};
use berth_broker::AmqpError;
use berth_protocol::codec::{self, CLASS_TX, METHOD_TX_COMMIT};
use berth_protocol::methods::tx;
use berth_protocol::AMQPClass;
use bytes::BytesMut;

use super::exception::End;
use super::Conn;

/// Publisher confirm bookkeeping for a channel in confirm mode.
#[derive(Default)]
pub(super) struct Confirms {
    /// Sequence number of the last publish.
    pub(super) last_seq: u64,
    /// Highest sequence number confirmed (acked or nacked) to the client.
    acked_upto: u64,
    /// Publishes waiting for the journal.
    waiting: BTreeSet<u64>,
    /// Publishes already nacked individually (refused, or the store failed).
    nacked: BTreeSet<u64>,
}

impl Confirms {
    /// The highest sequence number that can be confirmed now.
    fn frontier(&self) -> u64 {
        self.waiting.first().map_or(self.last_seq, |w| w - 1)
    }

    /// Frames confirming everything that can be confirmed now.
    fn flush(&mut self, channel: u16, out: &mut BytesMut) {
        let frontier = self.frontier();
        if frontier <= self.acked_upto {
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
}

/// A journal completion, sent from a store thread to the connection task.
/// `generation` names the channel's life it belongs to: a channel number
/// can be closed and opened again before the completions of its first life
/// arrive, and those must not confirm or commit anything of the second.
pub(super) enum Stored {
    /// A publish in confirm mode.
    Confirm {
        channel: u16,
        generation: u64,
        seq: u64,
        result: Result<(), String>,
    },
    /// One of the writes a `tx.commit` waits for.
    Tx {
        channel: u16,
        generation: u64,
        result: Result<(), String>,
    },
}

impl Conn {
    /// Makes the store completions of one publish: each reports to this
    /// connection if the channel is in confirm mode (`seq`), or logs a
    /// failure otherwise.
    pub(super) fn publish_completion(
        &self,
        channel: u16,
        generation: u64,
        seq: Option<u64>,
    ) -> impl FnMut() -> Done {
        let sender = self.stored_tx.clone();
        move || -> Done {
            let sender = sender.clone();
            Box::new(move |r: Result<(), JournalError>| {
                if let Some(seq) = seq {
                    let _connection_may_be_gone = sender.send(Stored::Confirm {
                        channel,
                        generation,
                        seq,
                        result: r.map_err(|e| e.to_string()),
                    });
                } else if let Err(e) = r {
                    tracing::error!(error = %e, "a persistent message could not be stored");
                }
            })
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
                let _connection_may_be_gone = sender.send(Stored::Tx {
                    channel,
                    generation,
                    result: r.map_err(|e| e.to_string()),
                });
            })
        }
    }

    /// Confirm bookkeeping for a routed publish in confirm mode: a journaled
    /// one waits for the store, a refused one is nacked at once.
    pub(super) fn track_confirm(&mut self, channel: u16, p: &Published, seq: u64) {
        let out = Arc::clone(&self.out);
        let mut waiting = false;
        if let Some(c) = self.slot(channel).confirms.as_mut() {
            if p.result.durable {
                c.waiting.insert(seq);
                waiting = true;
            }
            if p.result.rejected {
                c.nacked.insert(seq);
                out.push(|b| codec::encode_nack(b, channel, seq, false));
            }
        }
        if waiting {
            self.unconfirmed += 1;
        }
    }

    /// A journal write finished.
    pub(super) fn on_stored(&mut self, s: Stored) -> Result<(), End> {
        match s {
            Stored::Confirm {
                channel,
                generation,
                seq,
                result,
            } => {
                self.on_confirm_stored(channel, generation, seq, result);
                Ok(())
            }
            Stored::Tx {
                channel,
                generation,
                result,
            } => self.on_tx_stored(channel, generation, result),
        }
    }

    fn on_confirm_stored(
        &mut self,
        channel: u16,
        generation: u64,
        seq: u64,
        result: Result<(), String>,
    ) {
        // Counted when published, whatever became of the channel
        // since: a closed channel's completions must not leak.
        self.unconfirmed = self.unconfirmed.saturating_sub(1);
        let out = Arc::clone(&self.out);
        let Some(c) = self
            .channels
            .get_mut(&channel)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.confirms.as_mut())
        else {
            return;
        };
        c.waiting.remove(&seq);
        if let Err(e) = result {
            tracing::error!(peer = %self.peer, channel, seq, error = %e, "persistent message not stored; publisher gets basic.nack");
            if c.nacked.insert(seq) {
                out.push(|b| codec::encode_nack(b, channel, seq, false));
            }
        }
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

    /// Confirms everything that can be confirmed, one `basic.ack multiple`
    /// per channel per read batch.
    pub(super) fn flush_confirms(&mut self) {
        let out = Arc::clone(&self.out);
        for (id, slot) in &mut self.channels {
            if let Some(c) = slot.confirms.as_mut() {
                if c.frontier() > c.acked_upto {
                    out.push(|b| c.flush(*id, b));
                }
            }
        }
    }
}
