//! `Store::read_heads`: the first bytes of stored payloads, read without
//! the rest (a delayed message's due time at restart), before and after a
//! restart, for records naming one queue or several.

mod common;

use berth_store::{MsgId, QueueId, StoreError};
use bytes::Bytes;
use common::{config, fresh, open, wait};

#[test]
fn read_heads_gives_each_payloads_first_bytes_in_the_order_asked() {
    let cfg = config(1);
    let (fs, store) = fresh(11, &cfg);
    let mut stored: Vec<(MsgId, Bytes)> = Vec::new();
    for i in 0..60u32 {
        let m = store.next_msg_id();
        // Small records run together; every fifth is large, so heads on
        // both sides of it are read apart. Every seventh names two queues
        // (its payload starts 8 bytes later).
        let size = if i % 5 == 0 {
            200_000
        } else {
            (i % 4) as usize
        };
        let body = Bytes::from(format!("{i:08}{}", "b".repeat(size)));
        let queues: &[QueueId] = if i % 7 == 0 {
            &[QueueId(1), QueueId(2)]
        } else {
            &[QueueId(1)]
        };
        wait(|d| store.publish(m, queues, body.clone(), Some(d))).unwrap();
        stored.push((m, body));
    }
    let check = |store: &berth_store::Store| {
        let mut ask: Vec<MsgId> = stored.iter().rev().map(|(m, _)| *m).collect();
        ask.push(MsgId(999_999));
        let got = store.read_heads(QueueId(1), &ask, 8);
        assert_eq!(got.len(), ask.len());
        for (i, (m, body)) in stored.iter().rev().enumerate() {
            assert_eq!(got[i].as_ref().unwrap(), &body[..8], "message {m:?}");
        }
        assert!(matches!(
            got[ask.len() - 1],
            Err(StoreError::NotFound { .. })
        ));
        // A head longer than a payload is the whole payload.
        let (m, body) = &stored[1];
        let whole = store.read_heads(QueueId(1), &[*m], 1 << 20);
        assert_eq!(whole[0].as_ref().unwrap(), body);
    };
    check(&store);
    store.close().unwrap();
    let (store, _) = open(&fs, &cfg);
    check(&store);
}
