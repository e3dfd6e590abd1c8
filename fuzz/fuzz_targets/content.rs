//! Content assembly (`ContentAssembler`): method, header and body frames
//! in any order, sizes and channels, as one channel of a connection sees
//! them. The input is a sequence of frames described compactly
//! (`kind u8 | channel u8 | len u16 LE | payload`), so the fuzzer spends
//! its time on the assembler's states rather than on frame syntax.
//!
//! Checked besides "no panic": an assembled message has exactly the body
//! size its content header declared, and never more than the limit.
#![no_main]

use berth_protocol::codec::{decode_content_header, decode_method, Method};
use berth_protocol::content::ContentAssembler;
use berth_protocol::frame::{Frame, FRAME_HEADER, FRAME_METHOD};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

/// The body limit of this run; small so that "too large" is reachable.
const BODY_SIZE_BYTES_MAX: u64 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let mut assembler = ContentAssembler::new(1);
    let mut declared = None;
    let mut rest = data;
    while rest.len() >= 4 {
        let kind = rest[0];
        let channel = u16::from(rest[1] & 1) + u16::from(rest[1] >> 7); // mostly 1, sometimes 0 or 2
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]])).min(rest.len() - 4);
        let payload = Bytes::copy_from_slice(&rest[4..4 + len]);
        rest = &rest[4 + len..];
        let frame = Frame {
            kind: kind % 9,
            channel,
            payload,
        };
        if frame.kind == FRAME_METHOD && assembler.is_idle() {
            // What the connection does: a publish starts content, any other
            // method must find the assembler idle.
            match decode_method(&frame.payload) {
                Ok(Method::Publish(p)) => {
                    assembler
                        .start(p)
                        .expect("idle assembler accepts a publish");
                    declared = None;
                }
                Ok(Method::Other(_)) | Err(_) => {
                    assert!(assembler.check_method().is_ok());
                }
            }
            continue;
        }
        if frame.kind == FRAME_HEADER {
            declared = decode_content_header(&frame.payload)
                .ok()
                .map(|h| h.body_size);
        }
        match assembler.push(frame, BODY_SIZE_BYTES_MAX) {
            Ok(Some(m)) => {
                let size = m.body.len() as u64;
                assert!(size <= BODY_SIZE_BYTES_MAX);
                if let Some(declared) = declared {
                    assert_eq!(size, declared, "body differs from the declared size");
                }
                assert!(assembler.is_idle());
            }
            Ok(None) => {}
            // The connection closes the channel or connection: start over.
            Err(_) => assembler.reset(),
        }
    }
});
