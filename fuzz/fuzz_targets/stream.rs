//! The stream protocol's frame decoder, as a client's bytes reach it:
//! `frame::decode` of the server (`crates/server/src/stream_proto/frame.rs`,
//! compiled here on its own: it needs only `bytes` and `thiserror`), frame
//! after frame, with a small frame_max.
//!
//! Checked besides "no panic": the decoder consumes bytes or stops (no
//! endless loop) and never accepts a frame above its limit.
#![no_main]

#[allow(dead_code)]
#[path = "../../crates/server/src/stream_proto/frame.rs"]
mod frame;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

/// A limit small enough that the fuzzer meets it.
const FRAME_BYTES_MAX: u32 = 4096;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        if let Ok(Some(size)) = frame::check(&buf, FRAME_BYTES_MAX) {
            assert!(size <= FRAME_BYTES_MAX as usize + frame::SIZE_BYTES);
        }
        match frame::decode(&mut buf, FRAME_BYTES_MAX) {
            Ok(Some(_)) => assert!(buf.len() < before, "a frame decoded from no bytes"),
            Ok(None) | Err(_) => break,
        }
    }
});
