//! A stream's fields in the queue JSON: RabbitMQ's names where it has
//! them (`committed_offset`, `messages` counting every message kept,
//! none of them "unacknowledged" in the classic sense) and berth's for
//! what `rabbitmq-streams stream_status` shows (`first_offset`,
//! `segments`).

use berth_broker::stream::log::StreamStats;
use serde_json::{json, Value};

/// Sets the stream fields of a queue's JSON.
pub(crate) fn add(v: &mut Value, st: &StreamStats) {
    // A stream keeps every message whatever its consumers acked.
    v["messages"] = json!(st.messages);
    v["messages_ready"] = json!(st.messages);
    v["message_bytes"] = json!(st.bytes);
    v["messages_ram"] = json!(0);
    v["first_offset"] = json!(st.first_offset);
    // The offset of the newest message; absent while the stream is empty.
    let last = st
        .next_offset
        .checked_sub(1)
        .filter(|l| *l >= st.first_offset);
    v["last_offset"] = json!(last);
    // The newest durable offset (what consumers can read up to).
    let committed = st
        .committed_next
        .checked_sub(1)
        .filter(|c| *c >= st.first_offset);
    v["committed_offset"] = json!(committed);
    v["segments"] = json!(st.segments);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_stream_has_no_last_offset() {
        let mut v = json!({});
        add(&mut v, &StreamStats::default());
        assert_eq!(v["last_offset"], Value::Null);
        let mut v = json!({});
        add(
            &mut v,
            &StreamStats {
                messages: 3,
                bytes: 30,
                first_offset: 4,
                next_offset: 7,
                committed_next: 6,
                segments: 2,
            },
        );
        assert_eq!(
            (v["first_offset"].clone(), v["last_offset"].clone()),
            (json!(4), json!(6))
        );
        assert_eq!(v["segments"], json!(2));
        assert_eq!(v["committed_offset"], json!(5));
    }
}
