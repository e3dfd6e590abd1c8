//! The checkpoint decoder (`berth_store::checkpoint::decode`) on arbitrary
//! bytes. Like records, a checkpoint is guarded by one CRC32C, so each
//! input is decoded as it is and with a valid trailing checksum (and, for
//! half the inputs, the right magic and version), which puts the body
//! parser and the index it builds under the fuzzer.
//!
//! Checked besides "no panic": a decoded checkpoint re-encodes to a
//! checkpoint that decodes to the same position and index, and the index
//! it builds keeps its own invariants (`Index::check`, streams' journal
//! order included: `StreamIndex::check`).
//!
//! A file in `fuzz/corpus/checkpoint/` (or `fuzz/artifacts/`) is the raw
//! input: to replay one in a unit test, feed it as this target does, with
//! its CRC32C appended (and, for an odd first byte, the header patched),
//! or it only fails the checksum (`checkpoint/streams/tests.rs` does so).
#![no_main]

use std::path::Path;

use berth_store::checkpoint::{decode, encode, CHECKPOINT_MAGIC, CK_OFF_GROUP, CK_OFF_VERSION};
use berth_store::segment::FORMAT_VERSION;
use libfuzzer_sys::fuzz_target;

const GROUP: u32 = 3;

fn check(bytes: &[u8]) {
    let path = Path::new("fuzz/ckpt-00000000000000000001.ckpt");
    if let Ok((info, index)) = decode(GROUP, bytes, path) {
        // A checkpoint that decodes gives an index whose counts hold.
        index.check();
        let again = encode(GROUP, info, &index);
        let (info2, index2) = decode(GROUP, &again, path).expect("a re-encoded checkpoint decodes");
        assert_eq!(info, info2);
        assert_eq!(index.msg_id_hw, index2.msg_id_hw);
        assert_eq!(index.meta, index2.meta);
        assert_eq!(index.live_messages(), index2.live_messages());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut patched = data.to_vec();
    if patched.first().is_some_and(|b| b & 1 == 1) && patched.len() >= CK_OFF_GROUP + 4 {
        patched[..8].copy_from_slice(&CHECKPOINT_MAGIC);
        patched[CK_OFF_VERSION..CK_OFF_VERSION + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        patched[CK_OFF_GROUP..CK_OFF_GROUP + 4].copy_from_slice(&GROUP.to_le_bytes());
    }
    let crc = crc32c::crc32c(&patched);
    patched.extend_from_slice(&crc.to_le_bytes());
    check(&patched);
});
