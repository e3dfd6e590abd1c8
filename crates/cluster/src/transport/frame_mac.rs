//! Frames on a plain cluster link carry a MAC: without `cluster.tls`
//! anyone on the path could otherwise inject or replay entries once the
//! handshake is done (create a user, say). After the handshake each
//! direction has its own key, derived from the cluster secret and both
//! challenges of this connection, and each frame ends with
//! `HMAC-SHA256(key, sequence ‖ payload)` cut to [`TAG_BYTES`]. With TLS
//! the link is authenticated by TLS and frames carry no tag.
//!
//! ```text
//! key(direction) = HMAC(secret, "berth frames " ‖ direction ‖ server_challenge ‖ client_challenge)
//! frame          = length u32 (big-endian) | payload | tag[16]
//! ```
//!
//! Invariants:
//! - A frame whose tag does not verify — changed, injected, replayed,
//!   reordered or reflected back to its sender — is an error: the
//!   connection closes, nothing of it reaches Raft.
//! - Sequence numbers count frames per direction from 0; a connection
//!   never lives long enough to wrap a u64.

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

/// Bytes of the tag that ends each frame of a plain link.
pub(crate) const TAG_BYTES: usize = 16;

/// One direction's key and the next frame's sequence number.
#[derive(Clone)]
struct Direction {
    key: Hmac<Sha256>,
    next: u64,
}

impl Direction {
    fn tag(&mut self, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.key.clone();
        mac.update(&self.next.to_le_bytes());
        mac.update(payload);
        self.next += 1;
        mac
    }
}

/// The keys of one connection's two directions, as one side holds them.
#[derive(Clone)]
pub(crate) struct FrameKeys {
    send: Direction,
    receive: Direction,
}

impl FrameKeys {
    /// The keys for the side that is the client (`client`) or the server
    /// of a connection whose handshake exchanged these challenges.
    pub(crate) fn derive(
        secret: &[u8],
        (server_challenge, client_challenge): (&[u8], &[u8]),
        client: bool,
    ) -> Self {
        let key = |direction: &[u8]| {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
                .expect("HMAC takes a key of any length");
            mac.update(b"berth frames ");
            mac.update(direction);
            mac.update(server_challenge);
            mac.update(client_challenge);
            let k = mac.finalize().into_bytes();
            Direction {
                key: <Hmac<Sha256> as Mac>::new_from_slice(&k)
                    .expect("HMAC takes a key of any length"),
                next: 0,
            }
        };
        let (to_server, to_client) = (key(b"client->server"), key(b"server->client"));
        if client {
            Self {
                send: to_server,
                receive: to_client,
            }
        } else {
            Self {
                send: to_client,
                receive: to_server,
            }
        }
    }
}

/// Length-delimited frames, with a tag on each once the link is keyed.
pub(crate) struct PeerCodec {
    frames: LengthDelimitedCodec,
    /// Largest payload either side may send.
    payload_max: usize,
    keys: Option<FrameKeys>,
}

impl PeerCodec {
    pub(crate) fn new(payload_max: usize) -> Self {
        let mut c = Self {
            frames: LengthDelimitedCodec::new(),
            payload_max: 0,
            keys: None,
        };
        c.set_limit(payload_max, None);
        c
    }

    /// From now on: payloads up to `payload_max`, tagged with `keys` (if
    /// any: a plain link).
    pub(crate) fn set_limit(&mut self, payload_max: usize, keys: Option<FrameKeys>) {
        let tag = if keys.is_some() { TAG_BYTES } else { 0 };
        self.frames.set_max_frame_length(payload_max + tag);
        self.payload_max = payload_max;
        self.keys = keys;
    }
}

fn forged(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what}: the frame's MAC does not verify (changed, injected or replayed on the way; or a peer with another secret)"),
    )
}

impl Decoder for PeerCodec {
    type Item = BytesMut;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<BytesMut>> {
        let Some(mut frame) = self.frames.decode(src)? else {
            return Ok(None);
        };
        if let Some(keys) = &mut self.keys {
            if frame.len() < TAG_BYTES {
                return Err(forged("a frame shorter than its tag"));
            }
            let tag = frame.split_off(frame.len() - TAG_BYTES);
            keys.receive
                .tag(&frame)
                .verify_truncated_left(&tag)
                .map_err(|_| forged("a cluster frame was refused"))?;
        }
        Ok(Some(frame))
    }
}

impl Encoder<Bytes> for PeerCodec {
    type Error = io::Error;

    fn encode(&mut self, payload: Bytes, dst: &mut BytesMut) -> io::Result<()> {
        if payload.len() > self.payload_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a frame of {} bytes is over the limit of {}",
                    payload.len(),
                    self.payload_max
                ),
            ));
        }
        let Some(keys) = &mut self.keys else {
            return self.frames.encode(payload, dst);
        };
        let tag = keys.send.tag(&payload).finalize().into_bytes();
        let len = payload.len() + TAG_BYTES;
        dst.reserve(4 + len);
        dst.put_u32(u32::try_from(len).map_err(io::Error::other)?);
        dst.extend_from_slice(&payload);
        dst.extend_from_slice(&tag[..TAG_BYTES]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (PeerCodec, PeerCodec) {
        let challenges: (&[u8], &[u8]) = (b"server challenge", b"client challenge");
        let mut client = PeerCodec::new(1 << 20);
        let mut server = PeerCodec::new(1 << 20);
        let secret = b"a test secret of more than sixteen bytes";
        client.set_limit(1 << 20, Some(FrameKeys::derive(secret, challenges, true)));
        server.set_limit(1 << 20, Some(FrameKeys::derive(secret, challenges, false)));
        (client, server)
    }

    fn wire(c: &mut PeerCodec, payload: &'static [u8]) -> BytesMut {
        let mut out = BytesMut::new();
        c.encode(Bytes::from_static(payload), &mut out).unwrap();
        out
    }

    #[test]
    fn tagged_frames_pass_in_order() {
        let (mut client, mut server) = pair();
        for p in [&b"append 1"[..], b"append 2", b""] {
            let mut w = BytesMut::new();
            client.encode(Bytes::copy_from_slice(p), &mut w).unwrap();
            assert_eq!(server.decode(&mut w).unwrap().unwrap(), p);
        }
        let mut back = wire(&mut server, b"reply");
        assert_eq!(client.decode(&mut back).unwrap().unwrap(), &b"reply"[..]);
    }

    /// A plain link took any frame after the handshake: an on-path host
    /// could change or inject one (the old codec decoded these frames).
    #[test]
    fn a_changed_injected_replayed_or_reflected_frame_is_refused() {
        let (mut client, mut server) = pair();
        let mut changed = wire(&mut client, b"create user guest");
        let at = changed.len() - TAG_BYTES - 1;
        changed[at] ^= 1;
        assert!(server.decode(&mut changed).is_err(), "changed");

        let (_, mut server) = pair();
        let mut injected = BytesMut::new();
        LengthDelimitedCodec::new()
            .encode(
                Bytes::from_static(b"create user mallory....."),
                &mut injected,
            )
            .unwrap();
        assert!(server.decode(&mut injected).is_err(), "injected");

        let (mut client, mut server) = pair();
        let first = wire(&mut client, b"append 1");
        assert!(server.decode(&mut first.clone()).unwrap().is_some());
        assert!(server.decode(&mut first.clone()).is_err(), "replayed");

        let (mut client, _) = pair();
        let mut own = wire(&mut client, b"vote for me");
        assert!(client.decode(&mut own).is_err(), "reflected to its sender");
    }

    #[test]
    fn another_connections_keys_do_not_verify() {
        let (mut client, _) = pair();
        let mut other = PeerCodec::new(1 << 20);
        let keys = FrameKeys::derive(
            b"a test secret of more than sixteen bytes",
            (b"other", b"challenges"),
            false,
        );
        other.set_limit(1 << 20, Some(keys));
        let mut w = wire(&mut client, b"append");
        assert!(other.decode(&mut w).is_err());
    }
}
