//! kill -9 of the real binary while its segments roll and the next one is
//! being prepared (`next.seg.prep`, docs/FORMAT.md): small segments under
//! a steady stream of confirmed persistent publishes roll every fraction
//! of a second, so a kill at a random moment lands before, during or after
//! a roll, with the helper writing zeros, holding a finished file, or
//! having just handed it over. After every restart each confirmed message
//! is in its queue, flagged `redelivered`, its body intact, and the broker
//! logged no `ERROR`.
//!
//! Seeded (`BERTH_TEST_SEED=N` replays the choices), bounded: cycles run
//! until `BERTH_KILL9_ROLL_BUDGET_S` (default 15 s) is spent. It fails if
//! the cycles did not roll segments or never killed the broker with a
//! prepared file on disk: then it proved nothing about the roll.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};
use rand::{Rng, SeedableRng};

mod common;
use common::{bounded, connect, declare_durable, Broker};

const BUDGET_ENV: &str = "BERTH_KILL9_ROLL_BUDGET_S";
const BUDGET_S_DEFAULT: u64 = 15;
/// Fewer cycles than this proves too little: the test fails.
const CYCLES_MIN: u32 = 3;
const PUBLISHERS: usize = 4;
/// Bodies of 1 to 4 KiB: a 512 KiB segment holds a few hundred.
const BODY_BYTES_MAX: usize = 4096;
/// Load time of one cycle before the kill, in ms.
const LOAD_MS_MIN: u64 = 200;
const LOAD_MS_MAX: u64 = 1200;
/// One log group, so every publish goes to the segments being rolled;
/// small segments, so they roll many times a cycle and the helper is
/// always preparing the next one.
const FLAGS: &[&str] = &["--log-groups", "1", "--segment-size-bytes", "524288"];
const QUEUE: &str = "kill9-roll";

/// A body that proves its bytes: its id, then padding derived from it.
fn body(id: u64, len: usize) -> Vec<u8> {
    let mut b = id.to_le_bytes().to_vec();
    b.extend((0..len).map(|i| (id.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8));
    b
}

/// What the data directory holds at a moment: the highest segment number
/// and whether a prepared (or half-prepared) next segment is there.
#[derive(Default, Debug, Clone, Copy)]
struct OnDisk {
    segment_seq_max: u64,
    prepared: bool,
}

fn on_disk(dir: &Path) -> OnDisk {
    let mut seen = OnDisk::default();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            } else if name == "next.seg.prep" {
                seen.prepared = true;
            } else if let Some(seq) = name.strip_suffix(".seg").and_then(|s| s.parse().ok()) {
                seen.segment_seq_max = seen.segment_seq_max.max(seq);
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_messages_survive_kill9_while_segments_roll_and_prepare() {
    let seed = common::seed("kill -9 mid-roll");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let budget = Duration::from_secs(
        std::env::var(BUDGET_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(BUDGET_S_DEFAULT),
    );
    let dir = common::temp_dir("kill9-roll", seed);
    let started = Instant::now();
    let mut cycles = 0u32;
    let mut kills_with_prepared = 0u32;
    let mut rolls = 0u64;
    let mut confirmed_total = 0usize;
    while cycles < CYCLES_MIN || started.elapsed() < budget {
        let mut broker = Broker::start(&[dir.path()], FLAGS);
        let conn = connect(&broker.uri).await;
        let setup = conn.create_channel().await.expect("channel");
        declare_durable(&setup, QUEUE).await;
        let before_load = on_disk(dir.path());
        let confirmed = Arc::new(Mutex::new(HashSet::new()));
        let mut tasks = Vec::new();
        for p in 0..PUBLISHERS {
            let (uri, confirmed) = (broker.uri.clone(), Arc::clone(&confirmed));
            let mut rng = rand::rngs::StdRng::seed_from_u64(rng.random());
            tasks.push(tokio::spawn(async move {
                let conn = connect(&uri).await;
                let ch = conn.create_channel().await.expect("channel");
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .expect("confirm.select");
                for n in 0u64.. {
                    let id = (u64::from(cycles) << 40) | ((p as u64) << 32) | n;
                    let len = rng.random_range(1024..=BODY_BYTES_MAX);
                    let props = BasicProperties::default().with_delivery_mode(2);
                    let Ok(pending) = ch
                        .basic_publish(
                            "".into(),
                            QUEUE.into(),
                            BasicPublishOptions::default(),
                            &body(id, len),
                            props,
                        )
                        .await
                    else {
                        return;
                    };
                    match pending.await {
                        Ok(Confirmation::Ack(_)) => {
                            confirmed.lock().unwrap().insert((id, len));
                        }
                        _ => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(
            rng.random_range(LOAD_MS_MIN..LOAD_MS_MAX),
        ))
        .await;
        let at_kill = on_disk(dir.path());
        broker.kill9();
        for t in tasks {
            let _clients_end_with_the_broker =
                tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        drop(conn);
        kills_with_prepared += u32::from(at_kill.prepared);
        rolls += at_kill.segment_seq_max - before_load.segment_seq_max;

        // Restart and take every message: each confirmed one must be back.
        let broker = Broker::start(&[dir.path()], FLAGS);
        let conn = connect(&broker.uri).await;
        let ch = conn.create_channel().await.expect("channel");
        let mut back = HashSet::new();
        while let Some(m) = bounded(ch.basic_get(QUEUE.into(), BasicGetOptions { no_ack: true }))
            .await
            .expect("basic.get answered")
        {
            let data = &m.delivery.data;
            let id = u64::from_le_bytes(data[..8].try_into().expect("8-byte id"));
            let len = data.len() - 8;
            assert_eq!(
                data[..],
                body(id, len)[..],
                "seed {seed}, cycle {cycles}: message {id:#x} came back damaged"
            );
            assert!(
                m.delivery.redelivered,
                "seed {seed}, cycle {cycles}: message {id:#x} recovered but not flagged redelivered"
            );
            back.insert((id, len));
        }
        let confirmed = confirmed.lock().unwrap();
        let lost: Vec<_> = confirmed.difference(&back).take(5).collect();
        assert!(
            lost.is_empty(),
            "seed {seed}, cycle {cycles} (on disk at the kill: {at_kill:?}): {} confirmed messages lost, e.g. {lost:x?}; broker log:\n{}",
            confirmed.difference(&back).count(),
            broker.log_tail()
        );
        let errors = broker.errors();
        assert!(
            errors.is_empty(),
            "seed {seed}, cycle {cycles}: the broker logged errors: {errors:#?}"
        );
        confirmed_total += confirmed.len();
        eprintln!(
            "cycle {cycles}: {} confirmed, {} back, at the kill {at_kill:?}",
            confirmed.len(),
            back.len()
        );
        drop(conn);
        cycles += 1;
    }
    eprintln!(
        "{cycles} cycles, {confirmed_total} confirmed messages checked, {rolls} rolls under load, {kills_with_prepared} kills with a prepared file on disk"
    );
    assert!(confirmed_total > 0, "seed {seed}: nothing was confirmed");
    assert!(
        rolls >= u64::from(cycles),
        "seed {seed}: {rolls} rolls in {cycles} cycles: too few to test the roll"
    );
    assert!(
        kills_with_prepared > 0,
        "seed {seed}: no kill found a prepared segment on disk"
    );
}
