//! MQTT packets from bytes and back, sans-I/O: [`check`] finds whether a
//! whole packet is buffered (and refuses one above the size limit before
//! its body is read), [`decode`] turns it into a value with the
//! `mqtt5-protocol` crate, [`encode`] writes one. An incomplete packet is
//! a normal value (`Ok(None)`), not an error.
//!
//! Invariants:
//! - A packet's size is checked from its fixed header alone, so a client
//!   never makes the server buffer more than the limit it was given.
//! - Every error names what was wrong; none panics (the decoder is fuzzed
//!   through `decode`, see fuzz/).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use mqtt5_protocol::packet::MqttPacket;
use mqtt5_protocol::{FixedHeader, MqttError, Packet};

/// The bytes of a remaining-length field at most (MQTT §2.2.3).
const REMAINING_LENGTH_BYTES_MAX: usize = 4;

/// Why the bytes are not a packet.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("packet of {size_bytes} bytes is above the limit of {max_bytes}")]
    TooLarge { size_bytes: usize, max_bytes: usize },
    #[error("malformed packet: {0}")]
    Malformed(#[source] MqttError),
    #[error("malformed remaining length")]
    BadLength,
}

/// The length of the first packet of `buf` if it is whole, `None` if
/// more bytes are needed; an error if its header is malformed or it is
/// larger than `max_bytes`.
pub fn check(buf: &[u8], max_bytes: usize) -> Result<Option<usize>, CodecError> {
    // Byte 0 is the type and flags; then 1 to 4 bytes of length, the
    // last one with its top bit clear.
    let Some(end) = buf
        .iter()
        .skip(1)
        .take(REMAINING_LENGTH_BYTES_MAX)
        .position(|b| b & 0x80 == 0)
    else {
        if buf.len() > REMAINING_LENGTH_BYTES_MAX {
            return Err(CodecError::BadLength);
        }
        return Ok(None);
    };
    let header_bytes = 2 + end;
    let mut head = &buf[..header_bytes];
    let fixed = FixedHeader::decode(&mut head).map_err(CodecError::Malformed)?;
    let size_bytes = header_bytes + fixed.remaining_length as usize;
    if size_bytes > max_bytes {
        return Err(CodecError::TooLarge {
            size_bytes,
            max_bytes,
        });
    }
    Ok((buf.len() >= size_bytes).then_some(size_bytes))
}

/// Takes the first packet off `buf` if it is whole. `version` is the
/// connection's protocol level (4 for 3.1.1, 5), which decides how some
/// packets read; a CONNECT says its own.
pub fn decode(
    buf: &mut BytesMut,
    version: u8,
    max_bytes: usize,
) -> Result<Option<Packet>, CodecError> {
    let Some(size) = check(buf, max_bytes)? else {
        return Ok(None);
    };
    let mut packet: Bytes = buf.split_to(size).freeze();
    let fixed = FixedHeader::decode(&mut packet).map_err(CodecError::Malformed)?;
    let decoded =
        Packet::decode_from_body_with_version(fixed.packet_type, &fixed, &mut packet, version)
            .map_err(CodecError::Malformed)?;
    if packet.has_remaining() {
        return Err(CodecError::Malformed(MqttError::MalformedPacket(format!(
            "{} bytes after the end of a {}",
            packet.remaining(),
            decoded.packet_type_name()
        ))));
    }
    Ok(Some(decoded))
}

/// Appends `packet` to `out`.
pub fn encode(packet: &impl MqttPacket, out: &mut BytesMut) -> Result<(), CodecError> {
    packet.encode(out).map_err(CodecError::Malformed)
}

/// A PINGRESP: two bytes, which the crate models as a unit variant.
pub fn encode_pingresp(out: &mut BytesMut) {
    out.put_slice(&[0xD0, 0x00]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqtt5_protocol::packet::puback::PubAckPacket;

    #[test]
    fn an_incomplete_packet_is_a_value_not_an_error() {
        let mut out = BytesMut::new();
        encode(&PubAckPacket::new(7), &mut out).unwrap();
        for cut in 0..out.len() {
            assert!(check(&out[..cut], 1024).unwrap().is_none(), "cut at {cut}");
        }
        assert_eq!(check(&out, 1024).unwrap(), Some(out.len()));
        let mut buf = out.clone();
        match decode(&mut buf, 4, 1024).unwrap() {
            Some(Packet::PubAck(p)) => assert_eq!(p.packet_id, 7),
            other => panic!("expected a PUBACK, got {other:?}"),
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn a_packet_above_the_limit_is_refused_from_its_header() {
        // A PUBLISH that says it has 1 MiB of body, none of it sent.
        let head = [0x30, 0x80, 0x80, 0x40];
        assert!(matches!(
            check(&head, 64 * 1024),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_length_of_five_bytes_is_malformed() {
        let head = [0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01];
        assert!(matches!(
            check(&head, usize::MAX),
            Err(CodecError::BadLength)
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for first in 0u8..=255 {
            let mut buf = BytesMut::from(&[first, 3, 0xFF, 0x00, 0x12][..]);
            let _any_result_but_no_panic = decode(&mut buf, 4, 1024);
            let mut buf = BytesMut::from(&[first, 3, 0xFF, 0x00, 0x12][..]);
            let _any_result_but_no_panic = decode(&mut buf, 5, 1024);
        }
    }
}
