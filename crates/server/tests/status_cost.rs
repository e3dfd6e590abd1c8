//! What `berth status` asks for costs the same with 10 queues as with
//! 10,000: `GET /api/overview` and `GET /metrics` read totals kept as the
//! queues change, and visit no queue (counted by
//! `berth_broker::queue::view_reads`, not timed); a page of the queue list
//! reads its own queues. Their totals still say what a walk over every
//! queue would.
//!
//! One test in this binary, so no other test's reads are counted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use berth_server::Config;
use serde_json::Value;

mod common;
use common::TempDir;

/// `Basic guest:guest`.
const AUTH: &str = "Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=";

/// One HTTP/1.1 request on its own connection: (status, body).
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the HTTP listener");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{AUTH}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {out:?}"));
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

fn ok(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let (status, text) = request(addr, method, path, body);
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {text}"
    );
    text
}

/// A sample's value from Prometheus text: the line `NAME VALUE` (no labels).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .parse()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_and_metrics_visit_no_queue_and_agree_with_the_queues() {
    let dir = TempDir::new("status-cost");
    let mut config = Config::default();
    config.net.amqp_listen = vec!["127.0.0.1:0".into()];
    config.net.http_listen = vec!["127.0.0.1:0".into()];
    config.store.data_dirs = vec![dir.to_path_buf()];
    let running = berth_server::start(config).await.expect("start");
    let http = running.http_addrs[0];

    let checks = tokio::task::spawn_blocking(move || {
        let queues = 300;
        for i in 0..queues {
            ok(http, "PUT", &format!("/api/queues/%2F/q{i:04}"), r#"{"durable":true}"#);
        }
        // Three messages in every tenth queue.
        for i in (0..queues).step_by(10) {
            for _ in 0..3 {
                let body = format!(
                    r#"{{"routing_key":"q{i:04}","payload":"hello","payload_encoding":"string","properties":{{"delivery_mode":2}}}}"#
                );
                ok(http, "POST", "/api/exchanges/%2F/amq.default/publish", &body);
            }
        }
        // One is got; the API settles it at once, so every message left
        // is ready.
        ok(
            http,
            "POST",
            "/api/queues/%2F/q0000/get",
            r#"{"count":1,"ackmode":"ack_requeue_false","encoding":"auto"}"#,
        );
        let messages = 3 * queues / 10 - 1;

        let before = berth_broker::queue::view_reads();
        let overview: Value = serde_json::from_str(&ok(http, "GET", "/api/overview", ""))
            .expect("overview is JSON");
        let after_overview = berth_broker::queue::view_reads();
        let metrics = ok(http, "GET", "/metrics", "");
        let after_metrics = berth_broker::queue::view_reads();
        // berth status's page of queues: the page's queues alone.
        let page: Value = serde_json::from_str(&ok(
            http,
            "GET",
            "/api/queues?page=2&page_size=20",
            "",
        ))
        .expect("a page is JSON");
        let after_page = berth_broker::queue::view_reads();

        assert_eq!(overview["object_totals"]["queues"], queues);
        assert_eq!(overview["queue_totals"]["messages"], messages);
        assert_eq!(overview["queue_totals"]["messages_ready"], messages);
        assert_eq!(overview["message_stats"]["publish"], 3 * queues / 10);
        assert_eq!(overview["message_stats"]["deliver_get"], 1);
        let (queues_f, messages_f) = (queues as f64, messages as f64);
        assert!((metric(&metrics, "rabbitmq_queues") - queues_f).abs() < 0.5);
        assert!((metric(&metrics, "rabbitmq_queue_messages") - messages_f).abs() < 0.5);
        assert!((metric(&metrics, "rabbitmq_queue_messages_ready") - messages_f).abs() < 0.5);
        assert!(
            (metric(&metrics, "rabbitmq_queue_messages_ready_bytes") - 5.0 * messages_f).abs()
                < 0.5
        );

        assert_eq!(page["total_count"], queues);
        assert_eq!(page["page_count"], queues / 20);
        let names: Vec<&str> = (page["items"].as_array().expect("items").iter())
            .map(|q| q["name"].as_str().expect("a name"))
            .collect();
        let want: Vec<String> = (20..40).map(|i| format!("q{i:04}")).collect();
        assert_eq!(names, want);
        assert_eq!(after_page - after_metrics, 20, "a page reads its own queues only");

        assert_eq!(
            after_overview - before,
            0,
            "GET /api/overview read {} queues' state; its cost grows with the number of queues",
            after_overview - before
        );
        assert_eq!(
            after_metrics - after_overview,
            0,
            "GET /metrics read {} queues' state; its cost grows with the number of queues",
            after_metrics - after_overview
        );
    })
    .await;
    running.shutdown().await;
    if let Err(e) = checks {
        std::panic::resume_unwind(e.into_panic());
    }
}
