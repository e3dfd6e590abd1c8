//! Content assembly: `basic.publish`, then one content header frame, then
//! body frames until the declared body size is reached, become one message.
//! No I/O: frames in, a complete message (or a precise error) out.
//!
//! One [`ContentAssembler`] serves one channel; the connection routes frames
//! to it by channel number.
//!
//! Invariants:
//! - A completed body is exactly the size the content header declared: a body
//!   frame that would overrun it is refused, never truncated or buffered.
//! - A declared body size above the caller's limit is refused before any body
//!   byte is buffered.
//! - After an error the assembler is idle again; nothing of the refused
//!   message leaks into the next one.

use bytes::{Bytes, BytesMut};

use crate::codec::{decode_content_header, DecodeError, Publish, CLASS_BASIC};
use crate::frame::{Frame, FRAME_BODY, FRAME_HEADER, FRAME_METHOD};

/// A message whose content has fully arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssembledMessage {
    /// The `basic.publish` that announced the content.
    pub publish: Publish,
    /// Property flags and list, exactly as the publisher sent them.
    pub properties: Bytes,
    pub body: Bytes,
}

/// Why a frame does not fit the content being assembled. The server turns
/// each into one AMQP exception (see its `exception` module); the texts are
/// the reply texts clients see.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContentError {
    /// The content header does not parse (502 SYNTAX_ERROR).
    #[error(transparent)]
    Header(#[from] DecodeError),
    /// A content header for a class other than `basic` (505 UNEXPECTED_FRAME).
    #[error("content header for class {class_id} (expected {CLASS_BASIC})")]
    WrongClass { class_id: u16 },
    /// The declared body size is above the limit (406 PRECONDITION_FAILED,
    /// a channel exception).
    #[error("message size {body_size} is larger than configured max size {body_size_max}")]
    TooLarge { body_size: u64, body_size_max: u64 },
    /// A body frame carries more than is left of the declared size
    /// (501 FRAME_ERROR).
    #[error("body frame of {frame_bytes} bytes exceeds the {remaining} bytes left of the declared body size")]
    BodyOverrun { frame_bytes: u64, remaining: u64 },
    /// A content frame with no `basic.publish` before it (505).
    #[error("{} frame on channel {channel} without a preceding basic.publish", kind_name(*.kind))]
    NoPublish { channel: u16, kind: u8 },
    /// A header where a body was expected or the reverse (505).
    #[error("content frames out of order on channel {channel}")]
    OutOfOrder { channel: u16 },
    /// A method frame while content is still expected (505).
    #[error("expected content header or body on channel {channel}, got a method frame")]
    MethodMidContent { channel: u16 },
    /// A frame for another channel was handed to this channel's assembler
    /// (505; a routing mistake of the caller).
    #[error("frame for channel {got} given to the content of channel {channel}")]
    WrongChannel { channel: u16, got: u16 },
    /// A frame that is neither a content header nor a body (505).
    #[error("frame of type {kind} is not content")]
    NotContent { kind: u8 },
}

fn kind_name(kind: u8) -> &'static str {
    if kind == FRAME_HEADER {
        "content header"
    } else {
        "content body"
    }
}

/// Where one channel is in the publish → header → body sequence.
#[derive(Debug)]
enum State {
    Idle,
    /// `basic.publish` seen, header expected next.
    Header(Publish),
    /// Header seen, `remaining` body bytes expected.
    Body {
        publish: Publish,
        properties: Bytes,
        body: BytesMut,
        remaining: u64,
    },
}

/// Assembles the content of one channel's publishes.
#[derive(Debug)]
pub struct ContentAssembler {
    channel: u16,
    state: State,
}

impl ContentAssembler {
    pub fn new(channel: u16) -> Self {
        Self {
            channel,
            state: State::Idle,
        }
    }

    /// No content is expected: a method frame may come next.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Idle)
    }

    /// Body bytes held for the message being assembled (for memory
    /// accounting; the declared size is never reserved up front).
    pub fn buffered_bytes(&self) -> usize {
        match &self.state {
            State::Body { body, .. } => body.len(),
            _ => 0,
        }
    }

    /// Drops whatever was being assembled (the channel is closing).
    pub fn reset(&mut self) {
        self.state = State::Idle;
    }

    /// A method frame arrived: refused while content is expected.
    pub fn check_method(&self) -> Result<(), ContentError> {
        if self.is_idle() {
            Ok(())
        } else {
            Err(ContentError::MethodMidContent {
                channel: self.channel,
            })
        }
    }

    /// `basic.publish` arrived: its content header is expected next.
    pub fn start(&mut self, publish: Publish) -> Result<(), ContentError> {
        self.check_method()?;
        self.state = State::Header(publish);
        Ok(())
    }

    /// Takes one frame of the channel. Returns the message once its last
    /// body byte arrived, `Ok(None)` while more is expected. A declared body
    /// size above `body_size_bytes_max` is refused at the header.
    pub fn push(
        &mut self,
        frame: Frame,
        body_size_bytes_max: u64,
    ) -> Result<Option<AssembledMessage>, ContentError> {
        let channel = self.channel;
        if frame.channel != channel {
            return Err(ContentError::WrongChannel {
                channel,
                got: frame.channel,
            });
        }
        let state = std::mem::replace(&mut self.state, State::Idle);
        match (state, frame.kind) {
            (state, FRAME_METHOD) => {
                let idle = matches!(state, State::Idle);
                self.state = state;
                if idle {
                    Err(ContentError::NotContent { kind: FRAME_METHOD })
                } else {
                    Err(ContentError::MethodMidContent { channel })
                }
            }
            (State::Header(publish), FRAME_HEADER) => {
                let h = decode_content_header(&frame.payload)?;
                if h.class_id != CLASS_BASIC {
                    return Err(ContentError::WrongClass {
                        class_id: h.class_id,
                    });
                }
                if h.body_size > body_size_bytes_max {
                    return Err(ContentError::TooLarge {
                        body_size: h.body_size,
                        body_size_max: body_size_bytes_max,
                    });
                }
                if h.body_size == 0 {
                    return Ok(Some(AssembledMessage {
                        publish,
                        properties: h.properties,
                        body: Bytes::new(),
                    }));
                }
                self.state = State::Body {
                    publish,
                    properties: h.properties,
                    body: BytesMut::new(),
                    remaining: h.body_size,
                };
                Ok(None)
            }
            (
                State::Body {
                    publish,
                    properties,
                    mut body,
                    remaining,
                },
                FRAME_BODY,
            ) => {
                let n = frame.payload.len() as u64;
                if n > remaining {
                    return Err(ContentError::BodyOverrun {
                        frame_bytes: n,
                        remaining,
                    });
                }
                if n == remaining && body.is_empty() {
                    // Whole body in one frame: keep the frame's bytes, no copy.
                    return Ok(Some(AssembledMessage {
                        publish,
                        properties,
                        body: frame.payload,
                    }));
                }
                body.extend_from_slice(&frame.payload);
                if n < remaining {
                    self.state = State::Body {
                        publish,
                        properties,
                        body,
                        remaining: remaining - n,
                    };
                    return Ok(None);
                }
                Ok(Some(AssembledMessage {
                    publish,
                    properties,
                    body: body.freeze(),
                }))
            }
            (State::Idle, kind @ (FRAME_HEADER | FRAME_BODY)) => {
                Err(ContentError::NoPublish { channel, kind })
            }
            (_, FRAME_HEADER | FRAME_BODY) => Err(ContentError::OutOfOrder { channel }),
            (state, kind) => {
                self.state = state;
                Err(ContentError::NotContent { kind })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode_content;
    use crate::frame::decode_frame;

    fn publish() -> Publish {
        Publish {
            exchange: "x".into(),
            routing_key: "k".into(),
            mandatory: false,
            immediate: false,
        }
    }

    /// The header and body frames the codec writes for `body` on `channel`.
    fn content_frames(channel: u16, body: &[u8], frame_max: u32) -> Vec<Frame> {
        let mut out = BytesMut::new();
        encode_content(&mut out, channel, &[0, 0], body, frame_max);
        let mut frames = Vec::new();
        while let Some(f) = decode_frame(&mut out, frame_max).unwrap() {
            frames.push(f);
        }
        frames
    }

    fn header_declaring(channel: u16, class_id: u16, body_size: u64) -> Frame {
        let mut p = BytesMut::new();
        p.extend_from_slice(&class_id.to_be_bytes());
        p.extend_from_slice(&0u16.to_be_bytes());
        p.extend_from_slice(&body_size.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        Frame {
            kind: FRAME_HEADER,
            channel,
            payload: p.freeze(),
        }
    }

    fn body(channel: u16, bytes: &'static [u8]) -> Frame {
        Frame {
            kind: FRAME_BODY,
            channel,
            payload: Bytes::from_static(bytes),
        }
    }

    #[test]
    fn body_split_over_frames_is_reassembled_exactly() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut a = ContentAssembler::new(3);
        a.start(publish()).unwrap();
        let frames = content_frames(3, &data, 4096);
        assert!(frames.len() > 2);
        let last = frames.len() - 1;
        for (i, f) in frames.into_iter().enumerate() {
            let got = a.push(f, 1 << 20).unwrap();
            if i < last {
                assert!(got.is_none());
                assert!(!a.is_idle());
            } else {
                let m = got.unwrap();
                assert_eq!(m.body, data);
                assert_eq!(m.publish, publish());
                assert_eq!(&m.properties[..], &[0, 0]);
            }
        }
        assert!(a.is_idle());
    }

    #[test]
    fn empty_body_completes_at_the_header() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        let m = a.push(header_declaring(1, CLASS_BASIC, 0), 10).unwrap();
        assert_eq!(m.unwrap().body.len(), 0);
        assert!(a.is_idle());
    }

    #[test]
    fn body_larger_than_declared_size_is_a_frame_error() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        assert_eq!(a.push(header_declaring(1, CLASS_BASIC, 4), 10), Ok(None));
        assert_eq!(a.push(body(1, b"ab"), 10), Ok(None));
        assert_eq!(
            a.push(body(1, b"cde"), 10),
            Err(ContentError::BodyOverrun {
                frame_bytes: 3,
                remaining: 2
            })
        );
        assert!(a.is_idle(), "nothing of the refused message is kept");
    }

    #[test]
    fn declared_size_above_the_limit_is_refused_at_the_header() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        assert_eq!(
            a.push(header_declaring(1, CLASS_BASIC, 11), 10),
            Err(ContentError::TooLarge {
                body_size: 11,
                body_size_max: 10
            })
        );
        assert!(a.is_idle());
    }

    #[test]
    fn frame_for_another_channel_is_refused() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        assert_eq!(
            a.push(header_declaring(2, CLASS_BASIC, 1), 10),
            Err(ContentError::WrongChannel { channel: 1, got: 2 })
        );
        // The channel's own content still completes.
        assert_eq!(a.push(header_declaring(1, CLASS_BASIC, 1), 10), Ok(None));
        assert!(a.push(body(1, b"z"), 10).unwrap().is_some());
    }

    #[test]
    fn method_mid_content_is_refused() {
        let mut a = ContentAssembler::new(5);
        assert_eq!(a.check_method(), Ok(()));
        a.start(publish()).unwrap();
        let expected = Err(ContentError::MethodMidContent { channel: 5 });
        assert_eq!(a.check_method(), expected);
        assert_eq!(a.start(publish()), expected);
        let method = Frame {
            kind: FRAME_METHOD,
            channel: 5,
            payload: Bytes::from_static(&[0, 60, 0, 40]),
        };
        assert_eq!(
            a.push(method, 10),
            Err(ContentError::MethodMidContent { channel: 5 })
        );
        assert_eq!(
            ContentError::MethodMidContent { channel: 5 }.to_string(),
            "expected content header or body on channel 5, got a method frame"
        );
    }

    #[test]
    fn content_without_publish_is_refused() {
        let mut a = ContentAssembler::new(2);
        let e = a.push(body(2, b"x"), 10).unwrap_err();
        assert_eq!(
            e,
            ContentError::NoPublish {
                channel: 2,
                kind: FRAME_BODY
            }
        );
        assert_eq!(
            e.to_string(),
            "content body frame on channel 2 without a preceding basic.publish"
        );
        let e = a.push(header_declaring(2, CLASS_BASIC, 1), 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "content header frame on channel 2 without a preceding basic.publish"
        );
    }

    #[test]
    fn body_before_header_and_second_header_are_out_of_order() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        assert_eq!(
            a.push(body(1, b"x"), 10),
            Err(ContentError::OutOfOrder { channel: 1 })
        );
        a.start(publish()).unwrap();
        a.push(header_declaring(1, CLASS_BASIC, 2), 10).unwrap();
        assert_eq!(
            a.push(header_declaring(1, CLASS_BASIC, 2), 10),
            Err(ContentError::OutOfOrder { channel: 1 })
        );
    }

    #[test]
    fn header_of_another_class_or_malformed_is_refused() {
        let mut a = ContentAssembler::new(1);
        a.start(publish()).unwrap();
        let e = a.push(header_declaring(1, 50, 1), 10).unwrap_err();
        assert_eq!(e.to_string(), "content header for class 50 (expected 60)");
        a.start(publish()).unwrap();
        let short = Frame {
            kind: FRAME_HEADER,
            channel: 1,
            payload: Bytes::from_static(&[0, 60, 0]),
        };
        assert!(matches!(
            a.push(short, 10),
            Err(ContentError::Header(DecodeError::BadContentHeader(_)))
        ));
    }

    /// Arbitrary frame sequences (a cheap fuzz): never a panic, and a
    /// completed body always has the size its header declared.
    #[test]
    fn arbitrary_frame_sequences_never_panic_or_overrun() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2_000 {
            let mut a = ContentAssembler::new(1);
            let mut declared = None;
            for _ in 0..8 {
                let r = next();
                let frame = match r % 4 {
                    0 => {
                        let _refused_mid_content_is_fine_here = a.start(publish());
                        continue;
                    }
                    1 => {
                        let size = (r >> 8) % 12;
                        declared = Some(size);
                        header_declaring(1, if r & 0x10 == 0 { 60 } else { 10 }, size)
                    }
                    2 => {
                        let len = ((r >> 8) % 6) as usize;
                        Frame {
                            kind: FRAME_BODY,
                            channel: 1 + u16::from(r & 0x20 != 0),
                            payload: Bytes::from(vec![7u8; len]),
                        }
                    }
                    _ => Frame {
                        kind: (r >> 8) as u8 % 10,
                        channel: 1,
                        payload: Bytes::from(((r >> 16) as u32).to_be_bytes().to_vec()),
                    },
                };
                if let Ok(Some(m)) = a.push(frame, 8) {
                    assert_eq!(Some(m.body.len() as u64), declared);
                }
            }
        }
    }
}
