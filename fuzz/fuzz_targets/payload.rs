//! The broker's own encodings read back from the store: a stored message
//! payload (`durable::decode_message`, then rebuilding the message as a
//! restart does) and a stored definition (`meta::MetaCommand::decode` of a
//! metadata key and value, then the queue arguments a restored queue
//! parses).
//!
//! Checked besides "no panic": a payload that decodes re-encodes (with
//! the times it opens with, if any: `durable::times_of`) to the same bytes, and a definition that decodes re-encodes to a key and value
//! that decode to a command with the same encoding.
#![no_main]

use berth_broker::args::QueueArgs;
use berth_broker::durable::{decode_message, times_of, MessageHead, MessageParts};
use berth_broker::message::Message;
use berth_broker::meta::MetaCommand;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Some((exchange, routing_key, properties, body)) = decode_message(&payload) {
        let head = MessageHead::timed(
            times_of(&payload),
            &exchange,
            &routing_key,
            properties.len(),
        )
        .expect("names read from a stored payload fit a shortstr");
        let again = MessageParts {
            head: head.as_bytes(),
            properties: &properties,
            body: &body,
        }
        .to_bytes();
        assert_eq!(
            again, payload,
            "a stored payload does not re-encode to its bytes"
        );
        let _restored_or_refused = Message::from_stored(&payload);
    }
    // First byte: how long the key is; the rest after the key: the value.
    let Some((&key_len, rest)) = data.split_first() else {
        return;
    };
    let (key, value) = rest.split_at(usize::from(key_len).min(rest.len()));
    if let Ok(command) = MetaCommand::decode(key, Some(value)) {
        // Compared as bytes: a NaN in an argument is not equal to itself.
        let encoded = command.encode();
        let again = MetaCommand::decode(&encoded.0, encoded.1.as_deref())
            .expect("berth's own encoding of a definition decodes");
        assert_eq!(
            again.encode(),
            encoded,
            "a definition does not survive its own encoding"
        );
        if let MetaCommand::PutQueue(q) = &command {
            let _parsed_or_refused = QueueArgs::parse(&q.name, &q.vhost, &q.arguments);
        }
    }
});
