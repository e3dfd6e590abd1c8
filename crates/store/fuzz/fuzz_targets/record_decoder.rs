//! The record decoder must never panic, whatever the bytes, and whatever it
//! accepts must re-encode to exactly the bytes it consumed.
#![no_main]

use berth_store::record::{decode, encode, Decoded};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Walk the input as a journal would be walked.
    let mut at = 0;
    while at < data.len() {
        match decode(0, &data[at..]) {
            Decoded::Record { lsn, record, len } => {
                let mut again = Vec::new();
                encode(0, lsn, &record, &mut again);
                assert_eq!(&again[..], &data[at..at + len], "decode/encode disagree");
                at += len;
            }
            Decoded::Unparseable { len, .. } => {
                assert!(len <= data.len() - at);
                at += len;
            }
            Decoded::Incomplete { needed } => {
                assert!(needed > data.len() - at);
                break;
            }
            Decoded::Corrupt(_) => at += 1,
        }
    }
});
