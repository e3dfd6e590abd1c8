//! Crash test: SIGKILL the real binary while publishers with confirms and a
//! transactional consumer work, restart it, and check the two promises:
//! every confirmed message is delivered again unless its ack got
//! `tx.commit-ok`, and no message whose ack got `tx.commit-ok` comes back.
//!
//! SIGKILL keeps the page cache, so this cannot catch a missing fsync; the
//! store's power-loss tests (crates/store) do that through the storage seam.
//! Seeded: the seed is printed, and `BERTH_TEST_SEED=N` replays it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use lapin::Confirmation;
use rand::{Rng, SeedableRng};

const ITERATIONS: usize = 4;
const PUBLISHERS: usize = 2;

mod common;
use common::{connect, declare_durable, Broker};

/// A small resident window: most queued bodies are paged out and read back
/// from the store (with read-ahead) when delivered.
const FLAGS: &[&str] = &["--queue-resident-messages-max", "16"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_messages_survive_sigkill_and_committed_acks_stay_acked() {
    let seed = common::seed("crash test");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = common::temp_dir("crash", seed);
    for iteration in 0..ITERATIONS {
        let mut broker = Broker::start(&[&dir], FLAGS);
        let queue = format!("crash-{iteration}");
        let conn = connect(&broker.uri).await;
        let setup = conn.create_channel().await.expect("channel");
        declare_durable(&setup, &queue).await;

        let confirmed = Arc::new(Mutex::new(HashSet::new()));
        let committed = Arc::new(Mutex::new(HashSet::new()));
        // Acked in a transaction whose commit was sent but not answered when
        // the broker died: either outcome is allowed (they were delivered).
        let committing = Arc::new(Mutex::new(HashSet::new()));
        let mut tasks = Vec::new();
        for p in 0..PUBLISHERS {
            let (uri, queue, confirmed) =
                (broker.uri.clone(), queue.clone(), Arc::clone(&confirmed));
            tasks.push(tokio::spawn(async move {
                let conn = connect(&uri).await;
                let ch = conn.create_channel().await.expect("channel");
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .expect("confirm.select");
                for seq in 0u64.. {
                    let id = format!("i{iteration}-p{p}-{seq}");
                    let props = BasicProperties::default().with_delivery_mode(2);
                    let Ok(pending) = ch
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            id.as_bytes(),
                            props,
                        )
                        .await
                    else {
                        return;
                    };
                    match pending.await {
                        Ok(Confirmation::Ack(_)) => {
                            confirmed.lock().unwrap().insert(id);
                        }
                        _ => return,
                    }
                }
            }));
        }
        {
            let (uri, queue, committed, committing) = (
                broker.uri.clone(),
                queue.clone(),
                Arc::clone(&committed),
                Arc::clone(&committing),
            );
            let batch = rng.random_range(1..8usize);
            tasks.push(tokio::spawn(async move {
                let conn = connect(&uri).await;
                let ch = conn.create_channel().await.expect("channel");
                ch.tx_select().await.expect("tx.select");
                let mut pending = Vec::new();
                loop {
                    match ch
                        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                        .await
                    {
                        Ok(Some(m)) => {
                            pending.push(String::from_utf8_lossy(&m.delivery.data).into_owned());
                            if ch
                                .basic_ack(m.delivery.delivery_tag, BasicAckOptions::default())
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                        Err(_) => return,
                    }
                    if pending.len() >= batch {
                        committing.lock().unwrap().extend(pending.iter().cloned());
                        if ch.tx_commit().await.is_err() {
                            return;
                        }
                        let mut in_doubt = committing.lock().unwrap();
                        for id in pending.drain(..) {
                            in_doubt.remove(&id);
                            committed.lock().unwrap().insert(id);
                        }
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        broker.kill9();
        for t in tasks {
            let _clients_end_with_the_broker =
                tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        drop(conn);

        let broker = Broker::start(&[&dir], FLAGS);
        let conn = connect(&broker.uri).await;
        let ch = conn.create_channel().await.expect("channel");
        let mut after = Vec::new();
        while let Some(m) = ch
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("get")
        {
            after.push((
                String::from_utf8_lossy(&m.delivery.data).into_owned(),
                m.delivery.redelivered,
            ));
        }
        let after_ids: HashSet<&str> = after.iter().map(|(id, _)| id.as_str()).collect();
        let confirmed = confirmed.lock().unwrap();
        let committed = committed.lock().unwrap();
        let committing = committing.lock().unwrap();
        assert!(
            !confirmed.is_empty(),
            "seed {seed}: nothing was confirmed in iteration {iteration}; the test proves nothing"
        );
        let lost: Vec<&String> = confirmed
            .iter()
            .filter(|id| {
                !committed.contains(*id)
                    && !committing.contains(*id)
                    && !after_ids.contains(id.as_str())
            })
            .collect();
        assert!(
            lost.is_empty(),
            "seed {seed}, iteration {iteration}: {} confirmed messages lost, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
        let back: Vec<&String> = committed
            .iter()
            .filter(|id| after_ids.contains(id.as_str()))
            .collect();
        assert!(back.is_empty(), "seed {seed}, iteration {iteration}: {} messages acked with tx.commit-ok came back, e.g. {:?}", back.len(), &back[..back.len().min(5)]);
        assert!(
            after.iter().all(|(_, redelivered)| *redelivered),
            "seed {seed}: recovered messages must be flagged redelivered"
        );
        eprintln!(
            "iteration {iteration}: {} confirmed, {} acked in committed transactions, {} recovered",
            confirmed.len(),
            committed.len(),
            after.len()
        );
        drop(conn);
    }
}

/// Transient messages paged out of a deep queue are written to the store
/// only to leave memory: after a kill they must not come back, while the
/// persistent messages of the same queue all do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_transient_messages_do_not_survive_a_restart() {
    let dir = common::temp_dir("paging", 0x7a);
    let mut broker = Broker::start(&[&dir], FLAGS);
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.expect("channel");
    declare_durable(&ch, "paging").await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..400u32 {
        let persistent = i % 100 == 99;
        let props = BasicProperties::default().with_delivery_mode(if persistent { 2 } else { 1 });
        let body = format!("{}-{i}", if persistent { "p" } else { "t" });
        confirms.push(
            ch.basic_publish(
                "".into(),
                "paging".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .expect("publish"),
        );
    }
    for c in confirms {
        assert!(matches!(c.await.expect("confirm"), Confirmation::Ack(_)));
    }
    broker.kill9();
    drop(conn);

    let broker = Broker::start(&[&dir], FLAGS);
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.expect("channel");
    let mut bodies = Vec::new();
    while let Some(m) = ch
        .basic_get("paging".into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
    {
        bodies.push(String::from_utf8_lossy(&m.delivery.data).into_owned());
    }
    assert_eq!(bodies, ["p-99", "p-199", "p-299", "p-399"]);
    drop(broker);
}
