//! Every decoder of this crate that reads bytes another process or the disk
//! supplied, in one call, for the fuzz target `cluster` (fuzz/): a peer's
//! handshake frames (read before it has proven anything), its requests,
//! the entries inside them, and the frames of the cluster directory.
//! Each must return an error for bad input, never panic or over-allocate.

use crate::log_file::{self, FRAME_HEADER_BYTES};

/// Runs `bytes` through every decoder and checks what decodes: an entry
/// that decodes encodes back to the same bytes, and the frames a scan
/// accepts lie end to end from byte 0 up to where the scan stopped.
///
/// # Panics
///
/// When a decoder breaks one of those properties (a bug to fix).
pub fn decode_everything(bytes: &[u8]) {
    let scan = log_file::scan(bytes);
    let mut at = 0u64;
    for (offset, payload) in &scan.frames {
        assert_eq!(*offset, at, "frames are not end to end");
        at += (FRAME_HEADER_BYTES + payload.len()) as u64;
    }
    match scan.tail {
        log_file::Tail::Clean => assert_eq!(at, bytes.len() as u64),
        log_file::Tail::Torn { at: t } | log_file::Tail::Damaged { at: t } => assert_eq!(t, at),
    }
    if let Ok(commands) = crate::batch::decode(bytes) {
        assert_eq!(
            crate::batch::encode(commands.iter().copied()),
            bytes,
            "an entry does not round-trip"
        );
    }
    crate::transport::decode_untrusted(bytes);
}

#[cfg(test)]
mod tests {
    #[test]
    fn valid_and_damaged_inputs_keep_the_properties() {
        let entry = crate::batch::encode([b"alpha".as_slice(), b"".as_slice()].into_iter());
        let frames: Vec<u8> = [
            crate::log_file::encode_frame(&entry),
            crate::log_file::encode_frame(b"x"),
        ]
        .concat();
        for input in [
            entry.as_slice(),
            frames.as_slice(),
            &frames[..frames.len() - 1],
            b"",
            &[0xff; 40],
        ] {
            super::decode_everything(input);
        }
    }
}
