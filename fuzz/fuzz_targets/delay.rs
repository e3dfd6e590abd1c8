//! The arguments of delayed messages and delayed retry, as a client sends
//! them: the input is a publish's properties. Its headers are read for
//! `x-delay` (`delayed_args::delay_ms`) and as queue arguments
//! (`QueueArgs::parse`, the `x-delayed-retry-*` keys among them).
//!
//! Checked besides "no panic": a delay read is in 1..=2^32-1 ms; a routed
//! message's negated delay delays no more; the backoff of an accepted
//! retry never goes past its cap; `x-delivery-count` as delivered is the
//! broker's count of returns, whatever the publisher put there.
#![no_main]

use berth_broker::args::QueueArgs;
use berth_broker::delayed_args::{delay_ms, negated, DELAY_MS_MAX};
use berth_broker::message::Message;
use berth_broker::queue::{backoff_ms, with_count, DELIVERY_COUNT_HEADER};
use berth_protocol::AMQPValue;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let properties = Bytes::copy_from_slice(data);
    let Ok(msg) = Message::new("d".into(), "k".into(), properties, Bytes::new()) else {
        return;
    };
    let headers = msg.headers();
    if let Some(ms) = delay_ms(headers.as_ref()) {
        assert!(
            (1..=DELAY_MS_MAX).contains(&ms),
            "delay {ms} ms out of range"
        );
        let routed = negated(&msg).expect("properties that decoded re-encode");
        assert_eq!(delay_ms(routed.headers().as_ref()), None, "delayed twice");
    }
    let Some(table) = headers else {
        return;
    };
    if let Ok(args) = QueueArgs::parse("q", "/", &table) {
        let retry = &args.delayed_retry;
        for returns in [1, 2, 3, 20, 64, u32::MAX] {
            if let (Some(wait), Some(max)) = (backoff_ms(retry, returns), retry.max_ms) {
                assert!(wait <= max, "backoff {wait} ms past its cap {max} ms");
            }
        }
    }
    for returns in [0, 1, 7] {
        let delivered = with_count(std::sync::Arc::clone(&msg), returns);
        let count =
            (delivered.headers()).and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER).cloned());
        let want = (returns > 0).then(|| AMQPValue::LongLongInt(i64::from(returns)));
        assert_eq!(count, want, "x-delivery-count after {returns} returns");
    }
});
