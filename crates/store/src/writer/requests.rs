//! What a group's writer is asked to do: requests, their completions, and
//! the checks and netting applied to a batch before it is written.

use smallvec::{smallvec, SmallVec};

use super::*;
use crate::payload::Payload;

/// A completion callback. Runs on the writer thread: keep it short (send on
/// a channel, wake a task).
pub type Done = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// A request's completion, run exactly once: by the writer with the
/// request's outcome, or, if it is dropped without that (the writer thread
/// died), with `Poisoned` — so no caller ever waits forever.
pub(crate) struct Waiter {
    done: Option<Done>,
    group: u32,
}

impl Waiter {
    pub fn new(done: Done, group: u32) -> Self {
        Waiter {
            done: Some(done),
            group,
        }
    }

    pub fn complete(mut self, result: Result<(), StoreError>) {
        if let Some(done) = self.done.take() {
            done(result);
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done(Err(StoreError::Poisoned {
                group: self.group,
                cause: Arc::new(StoreError::WriterDied {
                    group: self.group,
                    reason: "it stopped before completing this request".into(),
                }),
            }));
        }
    }
}

/// The queues of a publish in one group: one inline (the common case
/// allocates nothing), several on the heap.
pub(crate) type PublishQueues = SmallVec<[QueueId; 1]>;

/// The messages of a removal: inline up to two (a consumer's ack of one
/// delivery allocates nothing here), more on the heap.
pub(crate) type RemoveMsgs = SmallVec<[MsgId; 2]>;

/// A request to a group.
pub(crate) enum Op {
    Publish {
        msg: MsgId,
        queues: PublishQueues,
        /// Copied into the batch piece by piece (see [`Payload`]).
        payload: Payload,
    },
    Remove {
        queue: QueueId,
        msgs: RemoveMsgs,
    },
    MetaPut {
        key: Bytes,
        value: Bytes,
    },
    MetaDelete {
        key: Bytes,
    },
    Purge {
        queue: QueueId,
    },
    /// A stream's message at `offset` (an Append record).
    Append {
        queue: QueueId,
        offset: u64,
        payload: Bytes,
    },
    /// A stream's records below `below` leave it (a Trim record).
    Trim {
        queue: QueueId,
        below: u64,
    },
    /// Completes once everything before it is fdatasync'ed, in any mode.
    Flush,
}

impl Op {
    /// The records this request is written as: none for a `Flush` or a
    /// request netted out, several for a Remove of more than
    /// [`REMOVE_MSGS_PER_RECORD_MAX`] messages, else one. A Publish's
    /// record holds the head of its payload; the rest is
    /// [`Op::payload_rest`], which the writer encodes after it.
    pub(super) fn records(&self) -> SmallVec<[Record<'_>; 1]> {
        match self {
            Op::Publish { queues, .. } if queues.is_empty() => SmallVec::new(),
            Op::Publish {
                msg,
                queues,
                payload,
            } => smallvec![Record::Publish {
                msg: *msg,
                queues: queues.as_slice().into(),
                payload: payload.head(),
            }],
            Op::Remove { queue, msgs } => msgs
                .chunks(REMOVE_MSGS_PER_RECORD_MAX)
                .map(|chunk| Record::Remove {
                    queue: *queue,
                    msgs: chunk.into(),
                })
                .collect(),
            Op::MetaPut { key, value } => smallvec![Record::MetaPut { key, value }],
            Op::MetaDelete { key } => smallvec![Record::MetaDelete { key }],
            Op::Purge { queue } => smallvec![Record::Purge { queue: *queue }],
            Op::Append {
                queue,
                offset,
                payload,
            } => smallvec![Record::Append {
                queue: *queue,
                offset: *offset,
                payload,
            }],
            Op::Trim { queue, below } => smallvec![Record::Trim {
                queue: *queue,
                below: *below,
            }],
            Op::Flush => SmallVec::new(),
        }
    }

    /// What follows the payload held by this request's record (see
    /// [`Op::records`]): a Publish's pieces after its head; nothing for
    /// any other request.
    pub(super) fn payload_rest(&self) -> [&[u8]; 2] {
        match self {
            Op::Publish { payload, .. } => payload.pieces(),
            _ => [&[], &[]],
        }
    }

    /// Why this request cannot be written, if it cannot: a record body
    /// beyond [`RECORD_BODY_BYTES_MAX`] (the store checks payloads against
    /// `payload_bytes_max` first; this catches what that does not bound).
    pub(crate) fn invalid(&self) -> Option<String> {
        let body = match self {
            Op::Publish {
                queues, payload, ..
            } => return publish_invalid(queues.len(), payload.len()),
            Op::MetaPut { key, value } => record::META_OFF_KEY
                .saturating_add(key.len())
                .saturating_add(value.len()),
            Op::MetaDelete { key } => key.len(),
            Op::Append { payload, .. } => record::APPEND_OFF_PAYLOAD.saturating_add(payload.len()),
            Op::Remove { .. } | Op::Purge { .. } | Op::Trim { .. } | Op::Flush => 0,
        };
        body_invalid(body)
    }

    pub(super) fn size_hint(&self) -> usize {
        match self {
            Op::Publish {
                payload, queues, ..
            } => payload.len() + 8 * queues.len() + 32,
            Op::Remove { msgs, .. } => 8 * msgs.len() + 32,
            Op::MetaPut { key, value } => key.len() + value.len() + 32,
            Op::MetaDelete { key } => key.len() + 32,
            Op::Append { payload, .. } => payload.len() + 48,
            Op::Purge { .. } | Op::Trim { .. } | Op::Flush => 32,
        }
    }
}

pub(crate) enum Cmd {
    Write {
        op: Op,
        done: Option<Waiter>,
    },
    Checkpoint {
        done: Done,
    },
    /// Compacts every segment eligible now, a bounded step per turn of the
    /// writer loop (tests, operator tool); completes when it is done.
    Compact {
        done: Done,
    },
    /// Pause until a backup's cut of every group is taken (see
    /// [`super::pause`]).
    Pause(Arc<super::pause::CutBarrier>),
    Shutdown {
        done: Option<Done>,
    },
}

/// Why a publish of `payload_len` bytes to `queue_count` queues of one
/// group cannot be one record, if it cannot.
pub(crate) fn publish_invalid(queue_count: usize, payload_len: usize) -> Option<String> {
    body_invalid(
        record::PUBLISH_OFF_QUEUES
            .saturating_add(queue_count.saturating_mul(8))
            .saturating_add(payload_len),
    )
}

pub(super) fn body_invalid(body: usize) -> Option<String> {
    (body > RECORD_BODY_BYTES_MAX as usize).then(|| {
        format!(
            "a record body of {body} bytes exceeds the limit of {RECORD_BODY_BYTES_MAX} \
             (payload plus 8 bytes per queue of the group, or key plus value)"
        )
    })
}

pub(super) fn cmd_size(cmd: &Cmd) -> usize {
    match cmd {
        Cmd::Write { op, .. } => op.size_hint(),
        _ => 0,
    }
}

/// A message acked in the same batch that publishes it need not be written:
/// drop the queue from the publish and the message from the removal.
pub(super) fn net_out(writes: &mut [(Op, Option<Waiter>)], counters: &GroupCounters) {
    let has_remove = writes.iter().any(|(op, _)| matches!(op, Op::Remove { .. }));
    if !has_remove {
        return;
    }
    let mut published: HashMap<u64, usize> = HashMap::new();
    for i in 0..writes.len() {
        match &mut writes[i].0 {
            Op::Publish { msg, .. } => {
                published.insert(msg.0, i);
            }
            Op::Remove { queue, msgs } => {
                let queue = *queue;
                let mut ids = std::mem::take(msgs);
                ids.retain(|m| {
                    let netted = published.get(&m.0).is_some_and(|&p| {
                        let Op::Publish { queues, .. } = &mut writes[p].0 else {
                            unreachable!()
                        };
                        let before = queues.len();
                        queues.retain(|q| *q != queue);
                        let hit = queues.len() < before;
                        if hit && queues.is_empty() {
                            counters.netted_publishes.fetch_add(1, Ordering::Relaxed);
                        }
                        hit
                    });
                    !netted
                });
                if let Op::Remove { msgs, .. } = &mut writes[i].0 {
                    *msgs = ids;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completion these tests never run (dropping it reports `Poisoned`).
    fn noop() -> Option<Waiter> {
        Some(Waiter::new(Box::new(|_| {}), 0))
    }

    #[test]
    fn publish_acked_in_the_same_batch_is_not_written() {
        let counters = GroupCounters::default();
        let mut writes = vec![
            (
                Op::Publish {
                    msg: MsgId(1),
                    queues: smallvec![QueueId(1), QueueId(2)],
                    payload: Bytes::from_static(b"x").into(),
                },
                noop(),
            ),
            (
                Op::Publish {
                    msg: MsgId(2),
                    queues: smallvec![QueueId(1)],
                    payload: Bytes::from_static(b"y").into(),
                },
                noop(),
            ),
            (
                Op::Remove {
                    queue: QueueId(1),
                    msgs: smallvec![MsgId(1), MsgId(2), MsgId(9)],
                },
                None,
            ),
        ];
        net_out(&mut writes, &counters);
        assert!(
            matches!(&writes[0].0, Op::Publish { queues, .. } if queues.as_slice() == [QueueId(2)])
        );
        assert!(
            writes[1].0.records().is_empty(),
            "fully acked publish writes nothing"
        );
        assert!(matches!(&writes[2].0, Op::Remove { msgs, .. } if msgs.as_slice() == [MsgId(9)]));
        assert_eq!(counters.netted_publishes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn removal_before_its_publish_is_not_netted() {
        let counters = GroupCounters::default();
        let mut writes = vec![
            (
                Op::Remove {
                    queue: QueueId(1),
                    msgs: smallvec![MsgId(1)],
                },
                None,
            ),
            (
                Op::Publish {
                    msg: MsgId(1),
                    queues: smallvec![QueueId(1)],
                    payload: Payload::default(),
                },
                None,
            ),
        ];
        net_out(&mut writes, &counters);
        assert!(matches!(&writes[0].0, Op::Remove { msgs, .. } if msgs.as_slice() == [MsgId(1)]));
        assert_eq!(writes[1].0.records().len(), 1);
    }
}
