//! The checkpoint decoder must never panic or over-allocate on any input.
#![no_main]

use berth_store::checkpoint::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _decoded = decode(0, data, std::path::Path::new("fuzz.ckpt"));
});
