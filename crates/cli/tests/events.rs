//! Black-box tests of the event log: the real binary with
//! `--event-log-enabled`, real clients (lapin), and `berth events`.

mod common;

use std::path::Path;
use std::process::Command;

use berth_events::writer::decode_file;
use common::{connect, temp_dir, Broker};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use serde_json::Value;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn events_json(dir: &Path, extra: &[&str]) -> (Vec<Value>, i32) {
    let out = Command::new(BERTH)
        .args(["events", "--json", "--data-dir"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("run berth events");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    (lines, out.status.code().unwrap_or(-1))
}

fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn key(e: &Value) -> (u64, u64, u64) {
    (
        e["time_us"].as_u64().unwrap(),
        e["group"].as_u64().unwrap(),
        e["seq"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishers_merge_in_time_order_and_every_kind_is_reported() {
    let dir = temp_dir("events-order", 0);
    let broker = Broker::start(
        &[&dir],
        &[
            "--log-groups",
            "4",
            "--event-log-enabled",
            "true",
            "--event-log-merge-interval-s",
            "1",
        ],
    );
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.unwrap();
    let none = FieldTable::default();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    for i in 0..8 {
        ch.queue_declare(format!("load-{i}").as_str().into(), durable, none.clone())
            .await
            .unwrap();
    }
    // Concurrent publishers, each on its own connection, over queues that
    // fall into different groups.
    let mut tasks = Vec::new();
    for p in 0..4 {
        let uri = broker.uri.clone();
        tasks.push(tokio::spawn(async move {
            let conn = connect(&uri).await;
            let ch = conn.create_channel().await.unwrap();
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .unwrap();
            for n in 0..200 {
                let q = format!("load-{}", (p + n) % 8);
                ch.basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    b"x",
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // One of each lifecycle kind.
    let dlx = table(&[
        ("x-dead-letter-exchange", AMQPValue::LongString("".into())),
        (
            "x-dead-letter-routing-key",
            AMQPValue::LongString("dead".into()),
        ),
    ]);
    let opts = QueueDeclareOptions::default();
    ch.queue_declare("dead".into(), opts, none.clone())
        .await
        .unwrap();
    ch.queue_declare("life".into(), opts, dlx).await.unwrap();
    let ttl = table(&[("x-message-ttl", AMQPValue::LongLongInt(1))]);
    ch.queue_declare("short".into(), opts, ttl).await.unwrap();
    let max = table(&[("x-max-length", AMQPValue::LongLongInt(1))]);
    ch.queue_declare("tiny".into(), opts, max).await.unwrap();
    let publish = |q: &'static str| {
        let ch = ch.clone();
        async move {
            ch.basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                b"body",
                BasicProperties::default(),
            )
            .await
            .unwrap();
        }
    };
    for q in ["life", "life", "short", "tiny", "tiny"] {
        publish(q).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let get = |q: &'static str| {
        let ch = ch.clone();
        async move {
            ch.basic_get(q.into(), BasicGetOptions::default())
                .await
                .unwrap()
                .expect("a message")
        }
    };
    let m = get("life").await;
    m.delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let m = get("life").await;
    m.delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
    let m = get("life").await;
    m.delivery
        .acker
        .nack(BasicNackOptions {
            requeue: false,
            ..Default::default()
        })
        .await
        .unwrap();
    // The expired message is found when the queue is next looked at.
    assert!(ch
        .basic_get("short".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .is_none());
    // Let the writers and one merge run.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;

    let (events, code) = events_json(&dir, &[]);
    assert_eq!(code, 0);
    assert!(events.len() >= 800, "got {} events", events.len());
    for w in events.windows(2) {
        assert!(
            key(&w[0]) < key(&w[1]),
            "not in (time, group, seq) order: {} then {}",
            w[0],
            w[1]
        );
    }
    let mut last_seq = std::collections::HashMap::new();
    for e in &events {
        let (_, g, s) = key(e);
        if let Some(prev) = last_seq.insert(g, s) {
            assert_eq!(s, prev + 1, "group {g}: sequence not +1");
        }
    }
    assert!(last_seq.len() >= 2, "the load spread over several groups");
    let has = |kind: &str, queue: &str, reason: &str| {
        events
            .iter()
            .any(|e| e["event"] == kind && e["queue"] == queue && e["reason"] == reason)
    };
    assert!(has("published", "life", ""));
    assert!(has("delivered", "life", ""));
    assert!(has("requeued", "life", ""));
    assert!(has("acked", "life", ""));
    assert!(has("rejected", "life", ""));
    assert!(has("dead_lettered", "life", "rejected"));
    assert!(has("published", "dead", ""));
    assert!(has("expired", "short", "expired"));
    assert!(has("dropped", "tiny", "maxlen"));
    let nacker_known = events
        .iter()
        .any(|e| e["event"] == "dead_lettered" && e["queue"] == "life" && e["user"] == "guest");
    assert!(
        nacker_known,
        "a dead letter caused by a nack names its client"
    );
    let user_known = events
        .iter()
        .any(|e| e["event"] == "published" && e["user"] == "guest");
    assert!(user_known, "publishes name their user");

    // --queue filters by regex.
    let (only, _) = events_json(&dir, &["--queue", "^life$"]);
    assert!(!only.is_empty() && only.iter().all(|e| e["queue"] == "life"));

    // The combined log exists and is in order.
    let mut merged = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("events-merged-")
        {
            merged.extend(decode_file(&std::fs::read(&p).unwrap()).0);
        }
    }
    assert!(!merged.is_empty(), "the merge ran");
    let (via_cli, code) = events_json(&dir, &["--merged"]);
    assert_eq!((via_cli.len(), code), (merged.len(), 0));
    for w in merged.windows(2) {
        assert!(
            w[0].order_key() < w[1].order_key(),
            "combined log out of order"
        );
    }

    // A torn tail (a crash mid-write) is skipped, not fatal.
    drop(conn);
    drop(broker);
    let gdir = dir.join("group-0000");
    let newest = std::fs::read_dir(&gdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events-")
        })
        .max()
        .expect("group 0 has event files");
    let mut bytes = std::fs::read(&newest).unwrap();
    bytes.extend_from_slice(&[0x55; 17]);
    std::fs::write(&newest, bytes).unwrap();
    let (after, code) = events_json(&dir, &[]);
    assert_eq!(code, 0, "a torn tail of the newest file is normal");
    assert_eq!(after.len(), events.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_each_group_within_its_size_bound() {
    let dir = temp_dir("events-rotate", 0);
    let retained: u64 = 40_000;
    let broker = Broker::start(
        &[&dir],
        &[
            "--log-groups",
            "1",
            "--event-log-enabled",
            "true",
            "--event-log-file-bytes-max",
            "16384",
            "--event-log-buffer-bytes-max",
            "8192",
            "--event-log-retained-bytes-max",
            &retained.to_string(),
        ],
    );
    let conn = connect(&broker.uri).await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch.queue_declare(
        "r".into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for _ in 0..3000 {
        ch.basic_publish(
            "".into(),
            "r".into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let gdir = dir.join("group-0000");
    let files: Vec<_> = std::fs::read_dir(&gdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events-")
        })
        .collect();
    let total: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(files.len() >= 2, "rotated: {files:?}");
    assert!(files
        .iter()
        .all(|p| std::fs::metadata(p).unwrap().len() <= 16384));
    assert!(total <= retained, "{total} bytes kept, bound {retained}");
    let (events, code) = events_json(&dir, &[]);
    assert_eq!(code, 0);
    assert!(
        !events.is_empty() && events.len() < 3000,
        "old events retired"
    );
    drop(broker);
}
