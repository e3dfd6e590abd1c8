//! The stream protocol's frames, sans-I/O: bytes to [`Request`]s and
//! responses to bytes (RabbitMQ's `deps/rabbitmq_stream/docs/PROTOCOL.adoc`).
//!
//! ```text
//! Frame    => Size Key Version [CorrelationId] Content
//!   Size   => uint32, the bytes after it
//!   Key    => uint16; the high bit set marks a response (0x8000 | key)
//! strings  => int16 length + UTF-8 (-1 = null); bytes => int32 length +
//! content; arrays => int32 count + items; integers big-endian.
//! ```
//!
//! Why not the `rabbitmq-stream-protocol` crate's frames: they are written
//! for a client. Several server-side encoders (open, peer properties,
//! SASL handshake responses) exist only under its `cfg(test)`, and its
//! publish decoder parses every message into an AMQP 1.0 value (and reads
//! no version 2 filter values), where the broker wants the message bytes
//! as they came, sliced from the read buffer. Its AMQP 1.0 message codec
//! is used ([`super::message`]).
//!
//! Invariants:
//! - [`check`] looks at a frame's size before any of it is buffered
//!   beyond the limit: a frame above `frame_max` is an error, never read.
//! - [`parse`] of any bytes returns a request or an error, never panics
//!   (fuzzed: `fuzz/fuzz_targets/stream.rs`); a short or overlong
//!   frame is `Malformed`.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Command keys (PROTOCOL.adoc, "Commands").
pub mod key {
    pub const DECLARE_PUBLISHER: u16 = 0x0001;
    pub const PUBLISH: u16 = 0x0002;
    pub const PUBLISH_CONFIRM: u16 = 0x0003;
    pub const PUBLISH_ERROR: u16 = 0x0004;
    pub const QUERY_PUBLISHER_SEQUENCE: u16 = 0x0005;
    pub const DELETE_PUBLISHER: u16 = 0x0006;
    pub const SUBSCRIBE: u16 = 0x0007;
    pub const DELIVER: u16 = 0x0008;
    pub const CREDIT: u16 = 0x0009;
    pub const STORE_OFFSET: u16 = 0x000a;
    pub const QUERY_OFFSET: u16 = 0x000b;
    pub const UNSUBSCRIBE: u16 = 0x000c;
    pub const CREATE: u16 = 0x000d;
    pub const DELETE: u16 = 0x000e;
    pub const METADATA: u16 = 0x000f;
    pub const METADATA_UPDATE: u16 = 0x0010;
    pub const PEER_PROPERTIES: u16 = 0x0011;
    pub const SASL_HANDSHAKE: u16 = 0x0012;
    pub const SASL_AUTHENTICATE: u16 = 0x0013;
    pub const TUNE: u16 = 0x0014;
    pub const OPEN: u16 = 0x0015;
    pub const CLOSE: u16 = 0x0016;
    pub const HEARTBEAT: u16 = 0x0017;
    pub const ROUTE: u16 = 0x0018;
    pub const PARTITIONS: u16 = 0x0019;
    pub const CONSUMER_UPDATE: u16 = 0x001a;
    pub const EXCHANGE_COMMAND_VERSIONS: u16 = 0x001b;
    pub const STREAM_STATS: u16 = 0x001c;
    pub const CREATE_SUPER_STREAM: u16 = 0x001d;
    pub const DELETE_SUPER_STREAM: u16 = 0x001e;
    pub const RESOLVE_OFFSET_SPEC: u16 = 0x001f;
    /// The bit that marks a response.
    pub const RESPONSE: u16 = 0x8000;
}

/// Response codes (PROTOCOL.adoc, "Response Codes").
pub mod code {
    pub const OK: u16 = 0x01;
    pub const STREAM_DOES_NOT_EXIST: u16 = 0x02;
    pub const SUBSCRIPTION_ID_ALREADY_EXISTS: u16 = 0x03;
    pub const SUBSCRIPTION_ID_DOES_NOT_EXIST: u16 = 0x04;
    pub const STREAM_ALREADY_EXISTS: u16 = 0x05;
    pub const STREAM_NOT_AVAILABLE: u16 = 0x06;
    pub const SASL_MECHANISM_NOT_SUPPORTED: u16 = 0x07;
    pub const AUTHENTICATION_FAILURE: u16 = 0x08;
    pub const SASL_ERROR: u16 = 0x09;
    pub const VIRTUAL_HOST_ACCESS_FAILURE: u16 = 0x0c;
    pub const UNKNOWN_FRAME: u16 = 0x0d;
    pub const FRAME_TOO_LARGE: u16 = 0x0e;
    pub const INTERNAL_ERROR: u16 = 0x0f;
    pub const ACCESS_REFUSED: u16 = 0x10;
    pub const PRECONDITION_FAILED: u16 = 0x11;
    pub const PUBLISHER_DOES_NOT_EXIST: u16 = 0x12;
    pub const NO_OFFSET: u16 = 0x13;
}

/// Bytes of the size field before every frame.
pub const SIZE_BYTES: usize = 4;

/// Where a subscription starts (Subscribe's OffsetSpecification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    First,
    Last,
    Next,
    Offset(u64),
    /// Milliseconds since the Unix epoch.
    TimestampMs(i64),
}

/// One published message: its publishing id and its bytes (an AMQP 1.0
/// message for RabbitMQ's clients), sliced from the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub publishing_id: u64,
    pub message: Bytes,
}

/// A frame from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    PeerProperties {
        corr: u32,
        properties: Vec<(String, String)>,
    },
    SaslHandshake {
        corr: u32,
    },
    SaslAuthenticate {
        corr: u32,
        mechanism: String,
        data: Bytes,
    },
    /// The client's answer to our Tune.
    Tune {
        frame_max: u32,
        heartbeat_s: u32,
    },
    Open {
        corr: u32,
        vhost: String,
    },
    Close {
        corr: u32,
        code: u16,
        reason: String,
    },
    /// The client's answer to a Close we sent.
    CloseResponse {
        corr: u32,
        code: u16,
    },
    Heartbeat,
    DeclarePublisher {
        corr: u32,
        publisher_id: u8,
        reference: Option<String>,
        stream: String,
    },
    Publish {
        publisher_id: u8,
        messages: Vec<Published>,
    },
    QueryPublisherSequence {
        corr: u32,
        reference: String,
        stream: String,
    },
    DeletePublisher {
        corr: u32,
        publisher_id: u8,
    },
    Subscribe {
        corr: u32,
        subscription_id: u8,
        stream: String,
        offset: OffsetSpec,
        credit: u16,
        properties: Vec<(String, String)>,
    },
    Credit {
        subscription_id: u8,
        credit: u16,
    },
    StoreOffset {
        reference: String,
        stream: String,
        offset: u64,
    },
    QueryOffset {
        corr: u32,
        reference: String,
        stream: String,
    },
    Unsubscribe {
        corr: u32,
        subscription_id: u8,
    },
    Create {
        corr: u32,
        stream: String,
        arguments: Vec<(String, String)>,
    },
    Delete {
        corr: u32,
        stream: String,
    },
    Metadata {
        corr: u32,
        streams: Vec<String>,
    },
    ExchangeCommandVersions {
        corr: u32,
    },
    /// A request berth knows but does not serve (super streams, single
    /// active consumer's update, stream stats, resolve offset spec): it
    /// is answered with [`code::UNKNOWN_FRAME`], not silence.
    Unsupported {
        key: u16,
        version: u16,
        corr: u32,
    },
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes is above frame_max {max}")]
    TooLarge { size: u32, max: u32 },
    #[error("malformed frame (key {key:#06x}): {why}")]
    Malformed { key: u16, why: &'static str },
    #[error("unknown command key {key:#06x}")]
    UnknownKey { key: u16 },
}

/// The length of the whole frame at the front of `buf` (size field
/// included), `None` while it is incomplete.
pub fn check(buf: &[u8], frame_max: u32) -> Result<Option<usize>, FrameError> {
    if buf.len() < SIZE_BYTES {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if frame_max > 0 && size > frame_max {
        return Err(FrameError::TooLarge {
            size,
            max: frame_max,
        });
    }
    let whole = SIZE_BYTES + size as usize;
    Ok((buf.len() >= whole).then_some(whole))
}

/// Takes one whole frame off the front of `buf` and parses it; `None`
/// while the frame is incomplete.
pub fn decode(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Request>, FrameError> {
    let Some(whole) = check(buf, frame_max)? else {
        return Ok(None);
    };
    let mut frame = buf.split_to(whole).freeze();
    frame.advance(SIZE_BYTES);
    parse(frame).map(Some)
}

/// A cursor over one frame's bytes.
struct Reader {
    b: Bytes,
    key: u16,
}

impl Reader {
    fn short(&self) -> FrameError {
        FrameError::Malformed {
            key: self.key,
            why: "shorter than its fields",
        }
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        if self.b.remaining() < 1 {
            return Err(self.short());
        }
        Ok(self.b.get_u8())
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        if self.b.remaining() < 2 {
            return Err(self.short());
        }
        Ok(self.b.get_u16())
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        if self.b.remaining() < 4 {
            return Err(self.short());
        }
        Ok(self.b.get_u32())
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        if self.b.remaining() < 8 {
            return Err(self.short());
        }
        Ok(self.b.get_u64())
    }
    /// A string; null (-1) is `None`.
    fn string_or_null(&mut self) -> Result<Option<String>, FrameError> {
        let len = self.u16()? as i16;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        if self.b.remaining() < len {
            return Err(self.short());
        }
        let s = self.b.split_to(len);
        String::from_utf8(s.to_vec())
            .map(Some)
            .map_err(|_| FrameError::Malformed {
                key: self.key,
                why: "a string is not UTF-8",
            })
    }
    fn string(&mut self) -> Result<String, FrameError> {
        Ok(self.string_or_null()?.unwrap_or_default())
    }
    /// Bytes, sliced (not copied); null is empty.
    fn bytes(&mut self) -> Result<Bytes, FrameError> {
        let len = self.u32()? as i32;
        if len < 0 {
            return Ok(Bytes::new());
        }
        let len = len as usize;
        if self.b.remaining() < len {
            return Err(self.short());
        }
        Ok(self.b.split_to(len))
    }
    /// An array's count, checked against the bytes left (each item takes
    /// at least `item_bytes_min`), so a forged count allocates nothing.
    fn count(&mut self, item_bytes_min: usize) -> Result<usize, FrameError> {
        let n = self.u32()? as i32;
        if n < 0 {
            return Ok(0);
        }
        let n = n as usize;
        if n.saturating_mul(item_bytes_min) > self.b.remaining() {
            return Err(self.short());
        }
        Ok(n)
    }
    fn properties(&mut self) -> Result<Vec<(String, String)>, FrameError> {
        let n = self.count(4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.string()?, self.string()?));
        }
        Ok(v)
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.b.has_remaining() {
            return Err(FrameError::Malformed {
                key: self.key,
                why: "bytes after its last field",
            });
        }
        Ok(())
    }
}

/// Parses one frame (its bytes after the size field).
pub fn parse(b: Bytes) -> Result<Request, FrameError> {
    let mut r = Reader { b, key: 0 };
    let k = r.u16()?;
    r.key = k;
    let version = r.u16()?;
    let req = match k {
        key::PEER_PROPERTIES => Request::PeerProperties {
            corr: r.u32()?,
            properties: r.properties()?,
        },
        key::SASL_HANDSHAKE => Request::SaslHandshake { corr: r.u32()? },
        key::SASL_AUTHENTICATE => Request::SaslAuthenticate {
            corr: r.u32()?,
            mechanism: r.string()?,
            data: r.bytes()?,
        },
        // The client's Tune answers ours: it has the same layout, and no
        // response bit (PROTOCOL.adoc: TuneResponse => TuneRequest).
        key::TUNE | 0x8014 => Request::Tune {
            frame_max: r.u32()?,
            heartbeat_s: r.u32()?,
        },
        key::OPEN => Request::Open {
            corr: r.u32()?,
            vhost: r.string()?,
        },
        key::CLOSE => Request::Close {
            corr: r.u32()?,
            code: r.u16()?,
            reason: r.string()?,
        },
        0x8016 => Request::CloseResponse {
            corr: r.u32()?,
            code: r.u16()?,
        },
        key::HEARTBEAT => Request::Heartbeat,
        key::DECLARE_PUBLISHER => Request::DeclarePublisher {
            corr: r.u32()?,
            publisher_id: r.u8()?,
            reference: r.string_or_null()?.filter(|s| !s.is_empty()),
            stream: r.string()?,
        },
        key::PUBLISH => {
            let publisher_id = r.u8()?;
            let n = r.count(12)?;
            let mut messages = Vec::with_capacity(n);
            for _ in 0..n {
                let publishing_id = r.u64()?;
                if version >= 2 {
                    // A filter value (RabbitMQ 3.13): berth does not
                    // filter (ExchangeCommandVersions says publish v1), a
                    // v2 frame's messages are stored all the same.
                    let _filter_value = r.string_or_null()?;
                }
                messages.push(Published {
                    publishing_id,
                    message: r.bytes()?,
                });
            }
            Request::Publish {
                publisher_id,
                messages,
            }
        }
        key::QUERY_PUBLISHER_SEQUENCE => Request::QueryPublisherSequence {
            corr: r.u32()?,
            reference: r.string()?,
            stream: r.string()?,
        },
        key::DELETE_PUBLISHER => Request::DeletePublisher {
            corr: r.u32()?,
            publisher_id: r.u8()?,
        },
        key::SUBSCRIBE => {
            let corr = r.u32()?;
            let subscription_id = r.u8()?;
            let stream = r.string()?;
            let offset = match r.u16()? {
                1 => OffsetSpec::First,
                2 => OffsetSpec::Last,
                3 => OffsetSpec::Next,
                4 => OffsetSpec::Offset(r.u64()?),
                5 => OffsetSpec::TimestampMs(r.u64()? as i64),
                _ => {
                    return Err(FrameError::Malformed {
                        key: k,
                        why: "unknown offset type",
                    })
                }
            };
            let credit = r.u16()?;
            // Properties are optional at the end (older clients).
            let properties = if r.b.has_remaining() {
                r.properties()?
            } else {
                Vec::new()
            };
            Request::Subscribe {
                corr,
                subscription_id,
                stream,
                offset,
                credit,
                properties,
            }
        }
        key::CREDIT => Request::Credit {
            subscription_id: r.u8()?,
            credit: r.u16()?,
        },
        key::STORE_OFFSET => Request::StoreOffset {
            reference: r.string()?,
            stream: r.string()?,
            offset: r.u64()?,
        },
        key::QUERY_OFFSET => Request::QueryOffset {
            corr: r.u32()?,
            reference: r.string()?,
            stream: r.string()?,
        },
        key::UNSUBSCRIBE => Request::Unsubscribe {
            corr: r.u32()?,
            subscription_id: r.u8()?,
        },
        key::CREATE => Request::Create {
            corr: r.u32()?,
            stream: r.string()?,
            arguments: r.properties()?,
        },
        key::DELETE => Request::Delete {
            corr: r.u32()?,
            stream: r.string()?,
        },
        key::METADATA => {
            let corr = r.u32()?;
            let n = r.count(2)?;
            let mut streams = Vec::with_capacity(n);
            for _ in 0..n {
                streams.push(r.string()?);
            }
            Request::Metadata { corr, streams }
        }
        key::EXCHANGE_COMMAND_VERSIONS => {
            let corr = r.u32()?;
            // The client's own list does not change ours.
            r.b.advance(r.b.remaining());
            Request::ExchangeCommandVersions { corr }
        }
        key::ROUTE
        | key::PARTITIONS
        | key::STREAM_STATS
        | key::CREATE_SUPER_STREAM
        | key::DELETE_SUPER_STREAM
        | key::RESOLVE_OFFSET_SPEC => {
            let corr = r.u32()?;
            r.b.advance(r.b.remaining());
            Request::Unsupported {
                key: k,
                version,
                corr,
            }
        }
        // A ConsumerUpdate response: berth never asks (no single active
        // consumer), so one is not expected.
        other => return Err(FrameError::UnknownKey { key: other }),
    };
    r.end()?;
    Ok(req)
}

/// Builds one frame in an output buffer: the size is patched in by
/// [`Frame::finish`].
pub struct Frame<'a> {
    out: &'a mut BytesMut,
    start: usize,
}

impl<'a> Frame<'a> {
    /// A command or response frame with `key` and `version`.
    pub fn begin(out: &'a mut BytesMut, key: u16, version: u16) -> Self {
        let start = out.len();
        out.put_u32(0);
        out.put_u16(key);
        out.put_u16(version);
        Self { out, start }
    }
    /// A response: key with the response bit, correlation id and code.
    pub fn response(out: &'a mut BytesMut, key: u16, corr: u32, code: u16) -> Self {
        let mut f = Self::begin(out, key | key::RESPONSE, 1);
        f.u32(corr).u16(code);
        f
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.put_u8(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.put_u16(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.put_u32(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.put_u64(v);
        self
    }
    /// A string, cut at `i16::MAX` bytes (no string berth sends is that
    /// long; a cut one is still well-formed).
    pub fn string(&mut self, s: &str) -> &mut Self {
        let mut n = s.len().min(i16::MAX as usize);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.out.put_u16(n as u16);
        self.out.extend_from_slice(&s.as_bytes()[..n]);
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.out.put_u32(b.len() as u32);
        self.out.extend_from_slice(b);
        self
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }
    pub fn properties<'p>(
        &mut self,
        p: impl ExactSizeIterator<Item = (&'p str, &'p str)>,
    ) -> &mut Self {
        self.out.put_u32(p.len() as u32);
        for (k, v) in p {
            self.string(k).string(v);
        }
        self
    }
    /// Writes the frame's size.
    pub fn finish(self) {
        let size = (self.out.len() - self.start - SIZE_BYTES) as u32;
        self.out[self.start..self.start + SIZE_BYTES].copy_from_slice(&size.to_be_bytes());
    }
}

/// A response that is only a code (declare publisher, delete, create,
/// subscribe, unsubscribe, ...).
pub fn put_response(out: &mut BytesMut, key: u16, corr: u32, code: u16) {
    Frame::response(out, key, corr, code).finish();
}

/// A Close from the server.
pub fn put_close(out: &mut BytesMut, corr: u32, code: u16, reason: &str) {
    let mut f = Frame::begin(out, key::CLOSE, 1);
    f.u32(corr).u16(code).string(reason);
    f.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(key: u16, version: u16, body: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_u32((4 + body.len()) as u32);
        b.put_u16(key);
        b.put_u16(version);
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn a_publish_is_read_with_its_messages_sliced() {
        let mut body = BytesMut::new();
        body.put_u8(7); // publisher id
        body.put_u32(2);
        for (id, m) in [(10u64, &b"one"[..]), (11, b"two!")] {
            body.put_u64(id);
            body.put_u32(m.len() as u32);
            body.extend_from_slice(m);
        }
        let mut buf = frame(key::PUBLISH, 1, &body);
        let req = decode(&mut buf, 1024).unwrap().unwrap();
        assert!(buf.is_empty());
        let Request::Publish {
            publisher_id,
            messages,
        } = req
        else {
            panic!("not a publish: {req:?}");
        };
        assert_eq!(publisher_id, 7);
        assert_eq!(messages[1].publishing_id, 11);
        assert_eq!(&messages[1].message[..], b"two!");
    }

    #[test]
    fn incomplete_large_and_forged_frames() {
        let whole = frame(key::HEARTBEAT, 1, &[]);
        let mut part = BytesMut::from(&whole[..5]);
        assert_eq!(decode(&mut part, 1024), Ok(None));
        let mut big = BytesMut::new();
        big.put_u32(2048);
        assert!(matches!(
            decode(&mut big, 1024),
            Err(FrameError::TooLarge { size: 2048, .. })
        ));
        // A publish claiming 2^31 messages in a few bytes.
        let mut forged = frame(key::PUBLISH, 1, &[1, 0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(
            decode(&mut forged, 1024),
            Err(FrameError::Malformed { .. })
        ));
        let mut unknown = frame(0x0077, 1, &[]);
        assert_eq!(
            decode(&mut unknown, 1024),
            Err(FrameError::UnknownKey { key: 0x77 })
        );
        let mut trailing = frame(key::HEARTBEAT, 1, &[0]);
        assert!(decode(&mut trailing, 1024).is_err());
    }

    #[test]
    fn golden_bytes_of_a_response() {
        let mut out = BytesMut::new();
        put_response(&mut out, key::CREATE, 5, code::STREAM_ALREADY_EXISTS);
        assert_eq!(&out[..], &[0, 0, 0, 10, 0x80, 0x0d, 0, 1, 0, 0, 0, 5, 0, 5]);
    }
}
