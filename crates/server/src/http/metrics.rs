//! `GET /metrics`: Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::queues::sorted_queues;
use super::HttpState;

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(super) async fn metrics(State(st): State<HttpState>) -> Response {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP berth_connections Open AMQP connections.\n# TYPE berth_connections gauge"
    );
    let _ = writeln!(
        out,
        "berth_connections {}",
        st.connections.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "# HELP berth_message_bytes Bytes of message data held in memory.\n# TYPE berth_message_bytes gauge");
    let _ = writeln!(
        out,
        "berth_message_bytes {}",
        berth_broker::message::message_bytes()
    );
    for (metric, help) in [
        ("berth_queue_messages_ready", "Messages ready for delivery."),
        (
            "berth_queue_messages_unacked",
            "Messages delivered and not yet acknowledged.",
        ),
        ("berth_queue_consumers", "Consumers attached to the queue."),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for v in st.shared.broker.vhosts() {
            for q in sorted_queues(v) {
                let s = q.stats();
                let value = match metric {
                    "berth_queue_messages_ready" => s.ready,
                    "berth_queue_messages_unacked" => s.unacked,
                    _ => s.consumers,
                };
                let _ = writeln!(
                    out,
                    "{metric}{{vhost=\"{}\",queue=\"{}\"}} {value}",
                    escape_label(&v.name),
                    escape_label(&q.name)
                );
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
