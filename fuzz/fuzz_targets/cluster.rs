//! Bytes a peer node or the cluster directory supplies: handshake frames
//! (read before the peer has proven the secret), Raft requests, the entries
//! inside them, and Raft log frames. Checked besides "no panic": entries
//! round-trip and accepted log frames lie end to end.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    berth_cluster::untrusted::decode_everything(data);
});
