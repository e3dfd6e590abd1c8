//! The journal record decoder (`berth_store::record`), as recovery's scan
//! and a message read use it, on arbitrary bytes.
//!
//! Random bytes almost never pass a record's CRC32C, so every input is
//! decoded twice: as it is, and with its header patched to a valid
//! checksum and length, which puts the body parser itself under the fuzzer.
//!
//! Checked besides "no panic": a decoded record re-encodes to exactly the
//! bytes it came from (the format has one encoding per record), a decoder
//! that says `Incomplete` asks for more bytes than it had, and a patched
//! record is never reported corrupt.
#![no_main]

use berth_store::record::{
    decode, encode, message_payload, salvage_publish_header, Decoded, OFF_BODY_LEN, OFF_CRC,
    RECORD_HEADER_BYTES,
};
use berth_store::MsgId;
use libfuzzer_sys::fuzz_target;

/// The record salt the target decodes under. With 0 the checksum is plain
/// CRC32C, so the patched inputs below carry a valid one.
const SALT: u32 = 0;

/// Decodes records back to back from the start of `buf`, as a scan of a
/// segment does; returns how many it read.
fn scan(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut records = 0;
    while at < buf.len() {
        match decode(SALT, &buf[at..]) {
            Decoded::Record { lsn, record, len } => {
                assert!(len >= RECORD_HEADER_BYTES && at + len <= buf.len());
                let mut again = Vec::with_capacity(len);
                encode(SALT, lsn, &record, &mut again);
                assert_eq!(
                    again,
                    &buf[at..at + len],
                    "record does not re-encode to its bytes"
                );
                if let berth_store::record::Record::Publish { msg, payload, .. }
                | berth_store::record::Record::Relocate { msg, payload, .. } = record
                {
                    assert_eq!(message_payload(SALT, &buf[at..], msg), Ok(payload));
                }
                at += len;
                records += 1;
            }
            Decoded::Incomplete { needed } => {
                assert!(needed > buf.len() - at);
                break;
            }
            Decoded::Corrupt(_) => {
                let _report_only = salvage_publish_header(&buf[at..]);
                break;
            }
            Decoded::Unparseable { len, .. } => {
                assert!(len >= RECORD_HEADER_BYTES && at + len <= buf.len());
                break;
            }
        }
    }
    records
}

fuzz_target!(|data: &[u8]| {
    scan(data);
    let _not_that_message = message_payload(SALT, data, MsgId(1));

    // The same bytes with a valid frame: body_len cut to what the input
    // holds, CRC32C recomputed.
    if data.len() >= RECORD_HEADER_BYTES {
        let mut patched = data.to_vec();
        let body_len = u32::try_from(data.len() - RECORD_HEADER_BYTES).unwrap_or(u32::MAX);
        let stored = u32::from_le_bytes(data[OFF_BODY_LEN..OFF_BODY_LEN + 4].try_into().unwrap());
        let body_len = stored.min(body_len);
        patched[OFF_BODY_LEN..OFF_BODY_LEN + 4].copy_from_slice(&body_len.to_le_bytes());
        let end = RECORD_HEADER_BYTES + body_len as usize;
        let crc = crc32c::crc32c(&patched[OFF_BODY_LEN..end]);
        patched[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(
            !matches!(
                decode(SALT, &patched),
                Decoded::Corrupt(_) | Decoded::Incomplete { .. }
            ),
            "a record with a valid checksum and length was called corrupt or incomplete"
        );
        scan(&patched);
    }
});
