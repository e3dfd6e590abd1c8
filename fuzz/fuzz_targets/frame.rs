//! The frame decoder and the method and content-header decoders behind it,
//! fed a raw byte stream as a client could send it.
//!
//! Checked besides "no panic": a decoded frame consumed exactly its own
//! bytes (header, payload, end octet), and a decoder that needs more bytes
//! consumed nothing.
#![no_main]

use berth_protocol::codec::{decode_content_header, decode_method, decode_properties};
use berth_protocol::frame::{
    decode_frame, FRAME_HEADER, FRAME_METHOD, FRAME_MIN_SIZE, FRAME_OVERHEAD,
};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the negotiated frame_max, so small and large
    // limits are both explored.
    let Some((&pick, stream)) = data.split_first() else {
        return;
    };
    let frame_max = FRAME_MIN_SIZE << (pick % 6);
    let mut buf = BytesMut::from(stream);
    loop {
        let before = buf.len();
        match decode_frame(&mut buf, frame_max) {
            Ok(Some(frame)) => {
                assert_eq!(before - buf.len(), frame.payload.len() + FRAME_OVERHEAD);
                assert!(frame.payload.len() + FRAME_OVERHEAD <= frame_max as usize);
                match frame.kind {
                    FRAME_METHOD => {
                        let _outcome = decode_method(&frame.payload);
                    }
                    FRAME_HEADER => {
                        if let Ok(h) = decode_content_header(&frame.payload) {
                            assert!(decode_properties(&h.properties).is_ok());
                        }
                    }
                    _ => {}
                }
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete frame consumed bytes");
                break;
            }
            Err(_) => break,
        }
    }
});
