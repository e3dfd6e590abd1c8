//! Black-box tests of `berth store ...` on stores made by the real binary
//! with a real client: intact, live (a publisher running), and corrupted
//! copies (a flipped bit, a truncation, a missing segment).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use berth_testdir::TestDir;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::Value;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");
/// Small segments so that a few hundred messages make several of them.
const SEGMENT_SIZE_BYTES: &str = "65536";

struct Broker {
    child: Child,
    uri: String,
    /// `http://ADDR` of its management API.
    http: String,
}

impl Broker {
    fn start(dirs: &[PathBuf], groups: u32) -> Broker {
        let mut cmd = Command::new(BERTH);
        cmd.args(["serve", "--amqp-listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0"])
            .args(["--segment-size-bytes", SEGMENT_SIZE_BYTES])
            .args(["--log-groups", &groups.to_string()]);
        for d in dirs {
            cmd.arg("--data-dir").arg(d);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start berth");
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !line.contains("berth ready") {
                    continue;
                }
                let first = |kind: &str| {
                    line.split(kind)
                        .nth(1)
                        .and_then(|a| a.split([',', ' ']).next())
                        .unwrap_or_default()
                        .to_owned()
                };
                if let Some(tx) = tx.take() {
                    let _receiver_may_have_given_up = tx.send((first("amqp="), first("http=")));
                }
            }
        });
        let (addr, http) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("berth did not report ready within 30 s");
        Broker {
            child,
            uri: format!("amqp://guest:guest@{addr}/%2f"),
            http: format!("http://{http}"),
        }
    }

    /// SIGTERM, and wait for the clean shutdown.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(st.success());
        for _ in 0..300 {
            if self.child.try_wait().expect("wait").is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("berth did not stop within 30 s of SIGTERM");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _already_dead_is_fine = self.child.kill();
            let _reap_errors_do_not_matter_on_drop = self.child.wait();
        }
    }
}

/// A test's directories (none made yet), removed when it drops: when the
/// test ends, passed or failed (see berth-testdir). Declared first in a
/// test, so it drops after the brokers using them.
#[derive(Default)]
struct Scratch(Vec<TestDir>);

impl Scratch {
    fn dir(&mut self, name: &str) -> PathBuf {
        let (guard, path) = TestDir::unmade(&format!("tools-{name}")).and_path();
        self.0.push(guard);
        path
    }
}

fn berth(args: &[&str], dirs: &[PathBuf]) -> Output {
    let mut cmd = Command::new(BERTH);
    cmd.args(args);
    for d in dirs {
        cmd.arg("--data-dir").arg(d);
    }
    cmd.output().expect("run berth")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The body of message `i` of `queue`: its name and number, padded.
fn body(queue: &str, i: usize, size: usize) -> Vec<u8> {
    let mut b = format!("{queue}:{i}:").into_bytes();
    b.resize(size, b'x');
    b
}

/// Publishes `n` persistent messages to durable `queue`, with confirms.
async fn publish(uri: &str, queue: &str, n: usize, size: usize) {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    for i in 0..n {
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            &body(queue, i, size),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    }
    conn.close(200, "done".into()).await.expect("close");
}

/// Gets and acks `n` messages of `queue`.
async fn ack(uri: &str, queue: &str, n: usize) {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    for _ in 0..n {
        let m = ch
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .expect("get")
            .expect("a message");
        m.ack(BasicAckOptions::default()).await.expect("ack");
    }
    conn.close(200, "done".into()).await.expect("close");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A sealed segment holding live messages, as `berth store scan` sees it.
fn live_sealed_segment(dir: &Path) -> PathBuf {
    let v = json_of(&berth(&["store", "scan", "--json"], &[dir.to_path_buf()]));
    for g in v["groups"].as_array().unwrap() {
        let segs = g["segments"].as_array().unwrap();
        if let Some((_, sealed)) = segs.split_last() {
            if let Some(s) = sealed
                .iter()
                .find(|s| s["live_messages"].as_u64() > Some(0))
            {
                return PathBuf::from(s["file"].as_str().unwrap());
            }
        }
    }
    panic!("no sealed segment with live messages: {v}");
}

fn segments(group_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(group_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

const QUEUES: [&str; 3] = ["tools-a", "tools-b", "tools-c"];
const PER_QUEUE: usize = 200;
const ACKED_PER_QUEUE: usize = 50;
const SIZE: usize = 1000;

/// A stopped store of 2 groups: 600 messages of 1000 bytes, 150 acked.
async fn make_store(dir: &Path) {
    let broker = Broker::start(&[dir.to_path_buf()], 2);
    for q in QUEUES {
        publish(&broker.uri, q, PER_QUEUE, SIZE).await;
        ack(&broker.uri, q, ACKED_PER_QUEUE).await;
    }
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_and_verify_report_a_real_store() {
    let mut scratch = Scratch::default();
    let dir = scratch.dir("scan");
    make_store(&dir).await;
    let dirs = [dir.clone()];

    let out = berth(&["store", "verify", "--json"], &dirs);
    let v = json_of(&out);
    assert!(out.status.success(), "{v}");
    assert_eq!(v["ok"], true);
    assert_eq!(v["live_messages"], 450);

    let out = berth(&["store", "scan", "--json"], &dirs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["log_groups"], 2);
    let queues = v["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 3, "{v}");
    for q in queues {
        assert_eq!(q["messages"], 150, "{q}");
        assert!(q["name"].as_str().unwrap().contains("tools-"), "{q}");
    }
    // Every publish is in one log-2 bucket (payload = body + routing data).
    assert!(v["message_sizes"]["count"].as_u64().unwrap() >= 600, "{v}");
    let buckets = v["message_sizes"]["buckets"].as_array().unwrap();
    assert!(
        buckets
            .iter()
            .any(|b| b["from_bytes"] == 1024 || b["from_bytes"] == 512),
        "{buckets:?}"
    );
    let topics: Vec<&str> = v["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["topic"].as_str().unwrap())
        .collect();
    assert_eq!(
        topics,
        ["store.segment_size_bytes", "store.log_groups", "compaction"]
    );
    // The text form names the queues and gives its reasoning.
    let out = berth(&["store", "scan"], &dirs);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("'tools-a' in vhost '/'"), "{text}");
    assert!(text.contains("because"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_bit_flips_truncations_and_missing_segments() {
    let mut scratch = Scratch::default();
    let dir = scratch.dir("damage");
    make_store(&dir).await;
    let verify = |d: &Path| berth(&["store", "verify"], &[d.to_path_buf()]);

    // A flipped bit inside the first record of group 0's first segment.
    let flipped = scratch.dir("flipped");
    copy_dir(&dir, &flipped);
    let seg = flipped.join(live_sealed_segment(&dir).strip_prefix(&dir).unwrap());
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[32 + 20 + 5] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let out = verify(&flipped);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("{} offset 32: damaged record", seg.display())),
        "{text}"
    );

    // A sealed segment cut in the middle of a record.
    let cut = scratch.dir("cut");
    copy_dir(&dir, &cut);
    let seg = cut.join(live_sealed_segment(&dir).strip_prefix(&dir).unwrap());
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 300)
        .unwrap();
    let out = verify(&cut);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&seg.display().to_string()) && text.contains("cut short"),
        "{text}"
    );

    // A missing segment holding live messages.
    let missing = scratch.dir("missing");
    copy_dir(&dir, &missing);
    let seg = missing.join(live_sealed_segment(&dir).strip_prefix(&dir).unwrap());
    std::fs::remove_file(&seg).unwrap();
    let out = verify(&missing);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&seg.display().to_string()) && text.contains("missing"),
        "{text}"
    );

    // Not a store at all: exit 2 with what is wrong.
    let out = verify(&scratch.dir("empty"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no berth store"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_and_scan_work_on_a_running_broker_while_it_publishes() {
    let mut scratch = Scratch::default();
    let dir = scratch.dir("live");
    let broker = Broker::start(std::slice::from_ref(&dir), 2);
    let uri = broker.uri.clone();
    let publisher = tokio::spawn(async move {
        for round in 0..6 {
            publish(&uri, &format!("live-{round}"), 150, 700).await;
            ack(&uri, &format!("live-{round}"), 100).await;
        }
    });
    let mut runs = 0;
    while !publisher.is_finished() {
        let out = berth(&["store", "verify", "--json"], std::slice::from_ref(&dir));
        let v = json_of(&out);
        assert!(out.status.success(), "live verify found problems: {v}");
        runs += 1;
    }
    publisher.await.unwrap();
    let out = berth(&["store", "scan", "--json"], std::slice::from_ref(&dir));
    assert!(out.status.success());
    assert!(runs >= 2, "verify ran {runs} times during publishing");
    broker.stop();
}

/// Gets every message of `queue`, acking each; returns their bodies.
async fn drain(uri: &str, queue: &str) -> Vec<Vec<u8>> {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let mut bodies = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .expect("get")
    {
        bodies.push(m.delivery.data.clone());
        m.ack(BasicAckOptions::default()).await.expect("ack");
    }
    conn.close(200, "done".into()).await.expect("close");
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_backup_while_publishing_restores_every_confirmed_message() {
    let mut scratch = Scratch::default();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    const Q: &str = "backup-q";
    const BODY: usize = 900;
    let dir = scratch.dir("bk-src");
    let out = scratch.dir("bk-out");
    let broker = Broker::start(std::slice::from_ref(&dir), 3);
    let confirmed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (uri, confirmed, stop) = (
            broker.uri.clone(),
            Arc::clone(&confirmed),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            let conn = Connection::connect(&uri, ConnectionProperties::default())
                .await
                .expect("connect");
            let ch = conn.create_channel().await.expect("channel");
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(Q.into(), durable, FieldTable::default())
                .await
                .expect("declare");
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirm.select");
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                ch.basic_publish(
                    "".into(),
                    Q.into(),
                    BasicPublishOptions::default(),
                    &body(Q, i, BODY),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
                i += 1;
                confirmed.store(i, Ordering::SeqCst);
            }
            conn.close(200, "done".into()).await.expect("close");
        })
    };
    while confirmed.load(Ordering::SeqCst) < 300 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Reading a running broker's files group by group is not one instant
    // of the store: refused, pointing at --online.
    let offline = berth(
        &["store", "backup", out.to_str().unwrap()],
        std::slice::from_ref(&dir),
    );
    let err = String::from_utf8_lossy(&offline.stderr);
    assert_eq!(offline.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a broker is running") && err.contains("--online"),
        "{err}"
    );
    assert!(!out.join("BACKUP").exists(), "no backup taken offline");
    let before = confirmed.load(Ordering::SeqCst);
    let (o, url) = (out.clone(), broker.http.clone());
    let backup = tokio::task::spawn_blocking(move || {
        berth(
            &[
                "store",
                "backup",
                o.to_str().unwrap(),
                "--online",
                "--url",
                &url,
                "--json",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    let during = confirmed.load(Ordering::SeqCst);
    assert!(
        backup.status.success(),
        "{}",
        String::from_utf8_lossy(&backup.stderr)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    publisher.await.unwrap();
    broker.stop();
    eprintln!(
        "backup taken with {before} confirmed before and {during} after: {}",
        String::from_utf8_lossy(&backup.stdout)
    );
    assert!(
        during > before,
        "the publisher kept going during the backup"
    );

    // Restore into two directories (the source had one), start, and check
    // message by message.
    let r = [scratch.dir("bk-r1"), scratch.dir("bk-r2")];
    let restored = berth(&["store", "restore", out.to_str().unwrap()], &r);
    assert!(
        restored.status.success(),
        "{}{}",
        String::from_utf8_lossy(&restored.stdout),
        String::from_utf8_lossy(&restored.stderr)
    );
    // The backup's group count: another one would ask for --reshape.
    let broker = Broker::start(&r, 3);
    let bodies = drain(&broker.uri, Q).await;
    broker.stop();
    let mut seen = std::collections::BTreeSet::new();
    for b in &bodies {
        let text = String::from_utf8_lossy(b);
        let i: usize = text
            .split(':')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("malformed body {text:.40}"));
        assert_eq!(b, &body(Q, i, BODY), "body of message {i} intact");
        assert!(seen.insert(i), "message {i} restored twice");
    }
    let missing: Vec<usize> = (0..before).filter(|i| !seen.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "confirmed before the backup but not restored: {missing:?}"
    );
    assert!(
        seen.iter().all(|&i| i <= during),
        "nothing published after the backup"
    );

    // A non-empty target, a corrupt backup, a newer format: refused.
    let res = berth(
        &["store", "restore", out.to_str().unwrap()],
        &[r[0].clone()],
    );
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(2), "{err}");
    assert!(err.contains("not empty"), "{err}");
    let seg = (0..3)
        .map(|g| out.join("data").join(format!("group-{g:04}")))
        .filter(|d| d.exists())
        .flat_map(|d| segments(&d))
        .next()
        .expect("a segment in the backup");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[40] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    let target = scratch.dir("bk-r3");
    let res = berth(
        &["store", "restore", out.to_str().unwrap()],
        std::slice::from_ref(&target),
    );
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&seg.display().to_string()) && err.contains("corrupt"),
        "{err}"
    );
    assert!(
        !target.join("MANIFEST").exists(),
        "nothing restored from a corrupt backup"
    );

    let manifest = out.join("BACKUP");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("berth-backup 1", "berth-backup 9")).unwrap();
    let res = berth(
        &["store", "restore", out.to_str().unwrap()],
        &[scratch.dir("bk-r4")],
    );
    let err = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(2), "{err}");
    assert!(err.contains("format version 9"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_frees_mostly_dead_segments_keeps_every_live_message_and_refuses_a_running_broker()
{
    let mut scratch = Scratch::default();
    const KEEP: usize = 80;
    const DROP_PER_KEEP: usize = 4;
    let dir = scratch.dir("compact");
    let dirs = [dir.clone()];
    let broker = Broker::start(&dirs, 1);
    {
        // One group: kept and dropped messages interleave in every segment.
        let conn = Connection::connect(&broker.uri, ConnectionProperties::default())
            .await
            .expect("connect");
        let ch = conn.create_channel().await.expect("channel");
        for q in ["keep", "drop"] {
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(q.into(), durable, FieldTable::default())
                .await
                .expect("declare");
        }
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm.select");
        let mut d = 0;
        for i in 0..KEEP {
            let mut sends = vec![("keep", i)];
            for _ in 0..DROP_PER_KEEP {
                sends.push(("drop", d));
                d += 1;
            }
            for (q, n) in sends {
                ch.basic_publish(
                    "".into(),
                    q.into(),
                    BasicPublishOptions::default(),
                    &body(q, n, 1000),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
            }
        }
        conn.close(200, "done".into()).await.expect("close");
    }
    assert_eq!(drain(&broker.uri, "drop").await.len(), KEEP * DROP_PER_KEEP);

    let out = berth(&["store", "compact"], &dirs);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("in use by another berth process"), "{err}");
    broker.stop();

    let out = berth(&["store", "compact", "--json"], &dirs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert!(v["bytes_freed"].as_u64().unwrap() > 100_000, "{v}");

    let v = json_of(&berth(&["store", "verify", "--json"], &dirs));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["live_messages"], KEEP, "{v}");
    let broker = Broker::start(&dirs, 1);
    let bodies = drain(&broker.uri, "keep").await;
    broker.stop();
    let expected: Vec<Vec<u8>> = (0..KEEP).map(|i| body("keep", i, 1000)).collect();
    assert_eq!(bodies, expected, "every kept message, intact and in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_shows_a_streams_segments_with_their_offsets() {
    let mut scratch = Scratch::default();
    const MESSAGES: u64 = 300;
    let dir = scratch.dir("stream-scan");
    let dirs = [dir.clone()];
    let broker = Broker::start(&dirs, 1);
    {
        let conn = Connection::connect(&broker.uri, ConnectionProperties::default())
            .await
            .expect("connect");
        let ch = conn.create_channel().await.expect("channel");
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            lapin::types::AMQPValue::LongString("stream".into()),
        );
        ch.queue_declare(
            "events".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .expect("declare a stream");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm.select");
        for i in 0..MESSAGES {
            ch.basic_publish(
                "".into(),
                "events".into(),
                BasicPublishOptions::default(),
                &body("events", i as usize, SIZE),
                BasicProperties::default(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        }
        conn.close(200, "bye".into()).await.expect("close");
    }
    broker.stop();

    let out = berth(&["store", "scan", "--json"], &dirs);
    let v = json_of(&out);
    let streams = v["streams"]
        .as_array()
        .unwrap_or_else(|| panic!("no streams in {v}"));
    assert_eq!(streams.len(), 1, "{v}");
    let st = &streams[0];
    assert_eq!(st["name"], "events");
    assert_eq!(st["messages"], MESSAGES);
    let segs = st["segments"].as_array().unwrap();
    assert!(segs.len() > 1, "300 KB in 64 KiB segments: {st}");
    // The segments tile the offsets 0..=299 in order.
    let mut next = 0;
    for s in segs {
        assert_eq!(s["first_offset"], next, "{st}");
        let last = s["last_offset"].as_u64().unwrap();
        assert_eq!(last - next + 1, s["messages"].as_u64().unwrap(), "{st}");
        assert!(s["last_timestamp_ms"].as_u64().unwrap() > 0, "{st}");
        next = last + 1;
    }
    assert_eq!(next, MESSAGES);
    let text = String::from_utf8_lossy(&berth(&["store", "scan"], &dirs).stdout).into_owned();
    assert!(text.contains("'events' in vhost '/': 300 msgs"), "{text}");
    assert!(text.contains("offsets 0.."), "{text}");
}
