//! A message payload as the caller hands it over: in pieces, so that the
//! group writer copies each byte once, into its batch, instead of the
//! caller first joining the pieces into a buffer of their own.
//!
//! Why: a caller's payload is usually a short head it encodes (a few
//! names and lengths) followed by bytes it already holds in shared
//! buffers (a message body as it arrived). Joining them costs an
//! allocation and a copy of the whole payload per message, made on the
//! caller's thread and freed on the writer's, where the allocator cannot
//! take the memory back cheaply.
//!
//! Invariants:
//! - The payload's bytes are `head`, then `pieces[0]`, then `pieces[1]`:
//!   what is written to disk is their concatenation, the same bytes one
//!   buffer of them would give (docs/FORMAT.md does not see pieces).
//! - A head of at most [`PAYLOAD_HEAD_INLINE_BYTES`] is kept inline: a
//!   payload with such a head allocates nothing of its own.

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

/// Longest head kept inline in a [`Payload`] (a longer one is copied to
/// the heap): room for a message's exchange and routing key of typical
/// length and their length fields.
pub const PAYLOAD_HEAD_INLINE_BYTES: usize = 64;

/// A record's payload in pieces: a short head copied when the payload is
/// made, then up to two shared byte buffers, copied by the writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    head: SmallVec<[u8; PAYLOAD_HEAD_INLINE_BYTES]>,
    pieces: [Bytes; 2],
}

impl Payload {
    /// The payload `head ++ first ++ second`; `head` is copied now,
    /// `first` and `second` are shared until the writer copies them.
    pub fn new(head: &[u8], first: Bytes, second: Bytes) -> Self {
        Payload {
            head: SmallVec::from_slice(head),
            pieces: [first, second],
        }
    }

    /// Bytes of the whole payload.
    pub fn len(&self) -> usize {
        self.head.len() + self.pieces[0].len() + self.pieces[1].len()
    }

    /// Whether the payload has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The head: the payload's first bytes.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// What follows the head, in order.
    pub fn pieces(&self) -> [&[u8]; 2] {
        [&self.pieces[0], &self.pieces[1]]
    }

    /// The payload as one buffer (a copy, unless it is a single piece).
    pub fn to_bytes(&self) -> Bytes {
        match (
            self.head.is_empty(),
            self.pieces[0].is_empty(),
            self.pieces[1].is_empty(),
        ) {
            (true, _, true) => self.pieces[0].clone(),
            (true, true, false) => self.pieces[1].clone(),
            _ => {
                let mut b = BytesMut::with_capacity(self.len());
                b.extend_from_slice(&self.head);
                b.extend_from_slice(&self.pieces[0]);
                b.extend_from_slice(&self.pieces[1]);
                b.freeze()
            }
        }
    }
}

impl From<Bytes> for Payload {
    /// A payload of one piece, shared.
    fn from(bytes: Bytes) -> Self {
        Payload {
            head: SmallVec::new(),
            pieces: [bytes, Bytes::new()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pieces_are_the_payload_in_order() {
        let p = Payload::new(
            b"head",
            Bytes::from_static(b"-mid-"),
            Bytes::from_static(b"tail"),
        );
        assert_eq!(p.len(), 13);
        assert_eq!(&p.to_bytes()[..], b"head-mid-tail");
        let mut joined = p.head().to_vec();
        for piece in p.pieces() {
            joined.extend_from_slice(piece);
        }
        assert_eq!(joined, b"head-mid-tail");
    }

    #[test]
    fn a_payload_of_one_buffer_is_shared_not_copied() {
        let b = Bytes::from(vec![7u8; 100]);
        let p = Payload::from(b.clone());
        assert_eq!(p.to_bytes().as_ptr(), b.as_ptr());
        assert!(p.head().is_empty());
    }

    #[test]
    fn a_long_head_is_kept_whole() {
        let head = vec![1u8; PAYLOAD_HEAD_INLINE_BYTES * 3];
        let p = Payload::new(&head, Bytes::new(), Bytes::from_static(b"x"));
        assert_eq!(p.head(), &head[..]);
        assert_eq!(p.len(), head.len() + 1);
    }
}
