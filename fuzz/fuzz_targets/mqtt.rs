//! The MQTT decoder, as a client's bytes reach it: `codec::decode` of
//! the server (`crates/server/src/mqtt/codec.rs`, compiled here on its
//! own: it needs only `bytes` and the `mqtt5-protocol` crate) for 3.1.1
//! and 5.0, packet after packet, with a small size limit; and the topic
//! mapping (`mqtt/topic.rs`) of whatever topic names and filters decoded.
//!
//! Checked besides "no panic": the decoder consumes bytes or stops (no
//! endless loop), never accepts a packet above its limit, and a topic
//! name's routing key maps back to the same name.
#![no_main]

#[allow(dead_code)]
#[path = "../../crates/server/src/mqtt/codec.rs"]
mod codec;
#[allow(dead_code)]
#[path = "../../crates/server/src/mqtt/topic.rs"]
mod topic;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mqtt5_protocol::Packet;

/// A limit small enough that the fuzzer meets it.
const PACKET_BYTES_MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    for version in [4u8, 5] {
        let mut buf = BytesMut::from(data);
        loop {
            let before = buf.len();
            if let Ok(Some(size)) = codec::check(&buf, PACKET_BYTES_MAX) {
                assert!(size <= PACKET_BYTES_MAX, "a packet above the limit");
            }
            match codec::decode(&mut buf, version, PACKET_BYTES_MAX) {
                Ok(Some(p)) => {
                    assert!(buf.len() < before, "a packet decoded from no bytes");
                    topics(&p);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
});

fn topics(p: &Packet) {
    match p {
        Packet::Publish(p) => {
            if let Ok(key) = topic::routing_key(&p.topic_name) {
                assert_eq!(topic::topic_name(&key), p.topic_name, "round trip");
            }
        }
        Packet::Subscribe(s) => {
            for f in &s.filters {
                let _valid_or_refused = topic::binding_key(&f.filter);
            }
        }
        _ => {}
    }
}
