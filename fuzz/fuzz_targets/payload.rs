//! The broker's own encodings read back from the store: a stored message
//! payload (`durable::decode_message`, then rebuilding the message as a
//! restart does) and a stored definition (`durable::read_table`, then the
//! queue arguments a restored queue parses).
//!
//! Checked besides "no panic": a payload that decodes re-encodes to the
//! same bytes.
#![no_main]

use berth_broker::args::QueueArgs;
use berth_broker::durable::{decode_message, encode_message, read_table};
use berth_broker::message::Message;
use berth_protocol::AMQPValue;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Some((exchange, routing_key, properties, body)) = decode_message(&payload) {
        let again = encode_message(&exchange, &routing_key, &properties, &body);
        assert_eq!(
            again, payload,
            "a stored payload does not re-encode to its bytes"
        );
        let _restored_or_refused = Message::from_stored(&payload);
    }
    if let Some(table) = read_table(data) {
        if let Some(AMQPValue::FieldTable(arguments)) = table.inner().get("arguments") {
            let _parsed_or_refused = QueueArgs::parse("q", "/", arguments);
        }
    }
});
