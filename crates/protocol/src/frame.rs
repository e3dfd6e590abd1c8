//! Splits a byte stream into AMQP 0-9-1 frames, without I/O.
//!
//! A frame on the wire is `type:u8 channel:u16 size:u32 payload[size] 0xCE`.
//! [`decode_frame`] looks at the 7-byte header first and refuses a frame whose
//! declared size exceeds the negotiated `frame_max` *before* buffering its
//! payload, so a peer cannot make us hold more than one frame's worth of bytes.
//!
//! Invariants:
//! - `Ok(None)` (incomplete input) never consumes bytes.
//! - A returned frame's payload is exactly the declared size, and the end byte
//!   was checked.

use bytes::{Buf, Bytes, BytesMut};

/// Method frame type octet.
pub const FRAME_METHOD: u8 = 1;
/// Content header frame type octet.
pub const FRAME_HEADER: u8 = 2;
/// Content body frame type octet.
pub const FRAME_BODY: u8 = 3;
/// Heartbeat frame type octet.
pub const FRAME_HEARTBEAT: u8 = 8;
/// The octet every frame ends with.
pub const FRAME_END: u8 = 0xCE;
/// Bytes before a frame's payload: type, channel, size.
pub const FRAME_HEADER_SIZE: usize = 7;
/// Bytes a frame adds around its payload (header + end octet).
pub const FRAME_OVERHEAD: usize = FRAME_HEADER_SIZE + 1;
/// The smallest `frame_max` the spec lets a peer negotiate.
pub const FRAME_MIN_SIZE: u32 = 4096;
/// The protocol header a 0-9-1 client sends first, and what we answer a
/// client that sent anything else.
pub const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";

/// One frame, payload still raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub channel: u16,
    pub payload: Bytes,
}

/// Why a byte stream is not a valid frame sequence. All of these are
/// connection errors (501 FRAME_ERROR) in AMQP 0-9-1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the negotiated frame_max of {frame_max} bytes")]
    TooLarge { size: u32, frame_max: u32 },
    #[error("frame does not end with 0xCE (found 0x{found:02X})")]
    BadFrameEnd { found: u8 },
    #[error("unknown frame type {0}")]
    UnknownType(u8),
}

/// Bytes still to come before the frame at the front of `buf` is whole: 0
/// when it is, or when not even its header has come (any read helps then).
/// The size is the peer's claim, not yet checked against `frame_max`.
#[must_use]
pub fn frame_bytes_missing(buf: &[u8]) -> usize {
    claimed(buf).map_or(0, |(_, total)| {
        usize::try_from(total)
            .unwrap_or(usize::MAX)
            .saturating_sub(buf.len())
    })
}

/// The payload size the header at the front of `buf` claims, and the
/// whole frame's, once the header has come.
fn claimed(buf: &[u8]) -> Option<(u32, u64)> {
    let b = buf.get(3..FRAME_HEADER_SIZE)?;
    let size = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((size, u64::from(size) + FRAME_OVERHEAD as u64))
}

/// Takes one complete frame off the front of `buf`, or returns `Ok(None)` if
/// more bytes are needed (it reserves no room for them). `frame_max` bounds
/// the whole frame (header, payload and end octet), as the spec defines it.
pub fn decode_frame(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, FrameError> {
    let Some((size, total)) = claimed(buf) else {
        return Ok(None);
    };
    let kind = buf[0];
    if !matches!(
        kind,
        FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
    ) {
        return Err(FrameError::UnknownType(kind));
    }
    let channel = u16::from_be_bytes([buf[1], buf[2]]);
    if total > u64::from(frame_max) {
        return Err(FrameError::TooLarge { size, frame_max });
    }
    let total = usize::try_from(total).expect("bounded by frame_max: u32");
    if buf.len() < total {
        // The caller makes room (`frame_bytes_missing`): it knows how
        // large its reads should be.
        return Ok(None);
    }
    let end = buf[total - 1];
    if end != FRAME_END {
        return Err(FrameError::BadFrameEnd { found: end });
    }
    buf.advance(FRAME_HEADER_SIZE);
    let payload = buf.split_to(size as usize).freeze();
    buf.advance(1);
    Ok(Some(Frame {
        kind,
        channel,
        payload,
    }))
}

/// Appends a frame header for a payload of `size` bytes.
pub fn put_frame_header(out: &mut BytesMut, kind: u8, channel: u16, size: u32) {
    out.extend_from_slice(&[kind]);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(kind: u8, channel: u16, payload: &[u8], end: u8) -> BytesMut {
        let mut b = BytesMut::new();
        put_frame_header(&mut b, kind, channel, payload.len() as u32);
        b.extend_from_slice(payload);
        b.extend_from_slice(&[end]);
        b
    }

    #[test]
    fn the_bytes_missing_are_what_the_header_claims_beyond_what_came() {
        let full = frame_bytes(FRAME_BODY, 3, &[7; 100], FRAME_END);
        assert_eq!(frame_bytes_missing(&full[..FRAME_HEADER_SIZE - 1]), 0);
        assert_eq!(frame_bytes_missing(&full[..FRAME_HEADER_SIZE]), 101);
        assert_eq!(frame_bytes_missing(&full[..50]), full.len() - 50);
        assert_eq!(frame_bytes_missing(&full), 0);
        let claim = [FRAME_BODY, 0, 1, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(frame_bytes_missing(&claim), 0xffff_ffff + 1);
    }

    #[test]
    fn incomplete_input_consumes_nothing() {
        let full = frame_bytes(FRAME_BODY, 3, b"hello", FRAME_END);
        for cut in 0..full.len() {
            let mut b = BytesMut::from(&full[..cut]);
            assert_eq!(decode_frame(&mut b, 4096), Ok(None));
            assert_eq!(b.len(), cut);
        }
    }

    #[test]
    fn complete_frame_is_split_off() {
        let mut b = frame_bytes(FRAME_BODY, 3, b"hello", FRAME_END);
        b.extend_from_slice(b"rest");
        let f = decode_frame(&mut b, 4096).unwrap().unwrap();
        assert_eq!(
            (f.kind, f.channel, &f.payload[..]),
            (FRAME_BODY, 3, &b"hello"[..])
        );
        assert_eq!(&b[..], b"rest");
    }

    #[test]
    fn oversized_frame_is_refused_before_its_payload_arrives() {
        let mut b = BytesMut::new();
        put_frame_header(&mut b, FRAME_BODY, 1, 1_000_000);
        assert_eq!(
            decode_frame(&mut b, 131_072),
            Err(FrameError::TooLarge {
                size: 1_000_000,
                frame_max: 131_072
            })
        );
    }

    #[test]
    fn frame_max_counts_header_and_end_octet() {
        let payload = vec![0u8; 4096 - FRAME_OVERHEAD];
        let mut b = frame_bytes(FRAME_BODY, 1, &payload, FRAME_END);
        assert!(decode_frame(&mut b, 4096).unwrap().is_some());
        let payload = vec![0u8; 4096 - FRAME_OVERHEAD + 1];
        let mut b = frame_bytes(FRAME_BODY, 1, &payload, FRAME_END);
        assert!(matches!(
            decode_frame(&mut b, 4096),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn wrong_end_octet_is_an_error() {
        let mut b = frame_bytes(FRAME_METHOD, 0, b"xx", 0x00);
        assert_eq!(
            decode_frame(&mut b, 4096),
            Err(FrameError::BadFrameEnd { found: 0 })
        );
    }

    #[test]
    fn unknown_frame_type_is_an_error() {
        let mut b = frame_bytes(9, 0, b"", FRAME_END);
        assert_eq!(decode_frame(&mut b, 4096), Err(FrameError::UnknownType(9)));
    }
}
