//! Prometheus text format under `rabbitmq_prometheus`'s names, so the
//! published Grafana dashboards work: `/metrics` aggregates queue metrics
//! over all queues, `/metrics/per-object` has one series per queue
//! (labels `vhost`, `queue`). Both carry `rabbitmq_identity_info`, which
//! the dashboards join on, the global counters and berth's own store
//! metrics per log group (`berth_store_*`, label `group`).
//!
//! Invariants:
//! - Every family has exactly one `# HELP` and `# TYPE` line, before its
//!   samples; counters end in `_total`.
//! - `/metrics` visits no queue: its sums are the totals each vhost keeps
//!   (`berth_broker::totals`), so its cost does not grow with the number
//!   of queues. `/metrics/per-object` takes each queue's lock once, briefly.
//! - Counters (`*_total`) only grow: a deleted queue's counts stay in the
//!   sums.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use berth_broker::totals::Totals;
use berth_store::histogram::HistogramSnapshot;

use super::overview::node_name;
use super::HttpState;
use crate::stats;

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes text into a `String`, which cannot fail.
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }
}

/// The numbers of one queue, or the sums over all queues.
#[derive(Default)]
struct Figures {
    ready: u64,
    unacked: u64,
    /// Ready and unacknowledged; a stream's: every message it keeps.
    messages: u64,
    ready_bytes: u64,
    consumers: u64,
    published: u64,
    acked: u64,
}

impl Figures {
    fn of_totals(t: &Totals) -> Self {
        Self {
            ready: t.ready,
            unacked: t.unacked,
            messages: t.messages,
            ready_bytes: t.ready_bytes,
            consumers: t.consumers,
            published: t.counters.published,
            acked: t.counters.acked,
        }
    }
}

/// One queue's numbers.
struct Row {
    labels: String,
    figures: Figures,
    /// A stream's offsets and segments.
    stream: Option<berth_broker::stream::log::StreamStats>,
}

fn rows(st: &HttpState) -> Vec<Row> {
    let mut out = Vec::new();
    for v in super::sorted_vhosts(st) {
        for q in super::queues::sorted_queues(&v) {
            let (s, c, stream) = (q.stats(), q.counters.snapshot(), q.stream_stats());
            out.push(Row {
                labels: format!(
                    "vhost=\"{}\",queue=\"{}\"",
                    escape_label(&v.name),
                    escape_label(&q.name)
                ),
                figures: Figures {
                    ready: s.ready as u64,
                    unacked: s.unacked as u64,
                    messages: stream.map_or((s.ready + s.unacked) as u64, |st| st.messages),
                    ready_bytes: s.ready_bytes,
                    consumers: s.consumers as u64,
                    published: c.published,
                    acked: c.acked,
                },
                stream,
            });
        }
    }
    out
}

/// The totals over every vhost's queues, visiting none.
fn totals(st: &HttpState) -> Totals {
    let mut all = Totals::default();
    for v in st.shared.broker.vhosts() {
        all.add(&v.totals());
    }
    all
}

type Pick = fn(&Figures) -> u64;

/// The queue families: name, type, help, value.
const QUEUE_FAMILIES: [(&str, &str, &str, Pick); 7] = [
    (
        "rabbitmq_queue_messages_ready",
        "gauge",
        "Messages ready to be delivered to consumers.",
        |f| f.ready,
    ),
    (
        "rabbitmq_queue_messages_unacked",
        "gauge",
        "Messages delivered to consumers but not yet acknowledged.",
        |f| f.unacked,
    ),
    (
        "rabbitmq_queue_messages",
        "gauge",
        "Ready and unacknowledged messages (a stream: every message it keeps).",
        |f| f.messages,
    ),
    (
        "rabbitmq_queue_messages_ready_bytes",
        "gauge",
        "Size in bytes of ready messages.",
        |f| f.ready_bytes,
    ),
    (
        "rabbitmq_queue_consumers",
        "gauge",
        "Consumers on the queue.",
        |f| f.consumers,
    ),
    (
        "rabbitmq_queue_messages_published_total",
        "counter",
        "Messages published into the queue.",
        |f| f.published,
    ),
    (
        "rabbitmq_queue_messages_acked_total",
        "counter",
        "Messages acknowledged by consumers.",
        |f| f.acked,
    ),
];

fn common(st: &HttpState, out: &mut Out, totals: &Totals) {
    let node = escape_label(node_name());
    out.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node and cluster identity info.",
    );
    out.sample(
        "rabbitmq_identity_info",
        &format!("rabbitmq_node=\"{node}\",rabbitmq_cluster=\"{node}\",rabbitmq_cluster_permanent_id=\"{node}\""),
        1,
    );
    out.family(
        "rabbitmq_build_info",
        "untyped",
        "Build info (berth reports the RabbitMQ version it is compatible with).",
    );
    out.sample(
        "rabbitmq_build_info",
        &format!(
            "rabbitmq_version=\"3.10.0\",product_name=\"berth\",product_version=\"{}\",prometheus_plugin_version=\"{}\"",
            env!("CARGO_PKG_VERSION"),
            env!("CARGO_PKG_VERSION")
        ),
        1,
    );
    let connections = st.connections.load(Ordering::Relaxed);
    let channels: usize = st
        .shared
        .registry
        .list()
        .iter()
        .map(|c| c.channels.lock().len())
        .sum();

    out.one(
        "rabbitmq_connections",
        "gauge",
        "Open connections (AMQP and MQTT).",
        connections,
    );
    out.one("rabbitmq_channels", "gauge", "Open channels.", channels);
    out.one(
        "rabbitmq_consumers",
        "gauge",
        "Consumers.",
        totals.consumers,
    );
    out.one("rabbitmq_queues", "gauge", "Queues.", totals.queues);
    let globals: [(&str, &str, u64); 6] = [
        (
            "rabbitmq_global_messages_received_total",
            "Messages received from publishers.",
            stats::get(&stats::MESSAGES_RECEIVED),
        ),
        (
            "rabbitmq_global_messages_routed_total",
            "Messages routed to at least one queue.",
            stats::get(&stats::MESSAGES_ROUTED),
        ),
        (
            "rabbitmq_global_messages_unroutable_dropped_total",
            "Unroutable messages dropped.",
            stats::get(&stats::MESSAGES_UNROUTABLE_DROPPED),
        ),
        (
            "rabbitmq_global_messages_unroutable_returned_total",
            "Unroutable mandatory messages returned.",
            stats::get(&stats::MESSAGES_UNROUTABLE_RETURNED),
        ),
        (
            "rabbitmq_global_messages_delivered_total",
            "Messages delivered to consumers or got.",
            totals.counters.delivered,
        ),
        (
            "rabbitmq_global_messages_acknowledged_total",
            "Messages acknowledged by consumers.",
            totals.counters.acked,
        ),
    ];
    for (name, help, value) in globals {
        out.family(name, "counter", help);
        out.sample(name, "protocol=\"amqp091\"", value);
    }
    out.one(
        "berth_message_bytes",
        "gauge",
        "Bytes of message data held in memory.",
        berth_broker::message::message_bytes(),
    );
    delayed(st, out);
    store(st, out);
    raft(st, out);
}

/// The cluster's Raft state (a cluster member only), with RabbitMQ's
/// quorum-queue names where it has them.
fn raft(st: &HttpState, out: &mut Out) {
    if let Some(r) = super::cluster::Numbers::of(st) {
        raft_numbers(&r, out);
    }
}

/// A follower's `/metrics`: its own Raft state (it holds no broker).
pub(super) fn follower(view: &crate::cluster::view::ClusterView) -> Response {
    let mut out = Out(String::with_capacity(2 * 1024));
    raft_numbers(&super::cluster::Numbers::of_view(view, None), &mut out);
    text(out)
}

fn raft_numbers(r: &super::cluster::Numbers, out: &mut Out) {
    for (name, kind, help, value) in [
        (
            "rabbitmq_raft_term_total",
            "counter",
            "Current Raft term (it grows with every election).",
            r.term,
        ),
        (
            "rabbitmq_raft_log_last_written_index",
            "gauge",
            "Last index in this member's Raft log.",
            r.last_log_index,
        ),
        (
            "rabbitmq_raft_log_last_applied_index",
            "gauge",
            "Last Raft index applied to this member's store.",
            r.applied_index,
        ),
        (
            "rabbitmq_raft_log_snapshot_index",
            "gauge",
            "Raft index of the last snapshot.",
            r.snapshot_index,
        ),
        (
            "berth_raft_leader",
            "gauge",
            "1 on the member that leads.",
            r.leader,
        ),
        (
            "berth_raft_fenced",
            "gauge",
            "1 while this member's Raft log disk stalls (it neither leads nor votes).",
            r.fenced,
        ),
        (
            "berth_raft_on_probation",
            "gauge",
            "1 while this member catches up after a damaged log (it does not vote).",
            r.on_probation,
        ),
    ] {
        out.one(name, kind, help, value);
    }
    if r.members.is_empty() {
        return; // a follower cannot tell the others' state
    }
    out.family(
        "berth_raft_member_lag_entries",
        "gauge",
        "Entries a member is behind the leader's log.",
    );
    for m in &r.members {
        out.sample(
            "berth_raft_member_lag_entries",
            &format!("member=\"{}\"", escape_label(&m.name)),
            m.lag,
        );
    }
    out.family(
        "berth_raft_member_running",
        "gauge",
        "1 while a member answers the leader.",
    );
    for m in &r.members {
        out.sample(
            "berth_raft_member_running",
            &format!("member=\"{}\"", escape_label(&m.name)),
            m.running,
        );
    }
    out.family(
        "berth_raft_member_alarms",
        "gauge",
        "Alarms a member reported to the leader (its disk, its Raft log's disk, its Raft stopped); absent while it sends no report.",
    );
    for m in &r.members {
        if let Some(alarms) = m.alarms {
            out.sample(
                "berth_raft_member_alarms",
                &format!("member=\"{}\"", escape_label(&m.name)),
                alarms,
            );
        }
    }
}

/// Delayed exchanges (docs/DELAYED.md): one series each, as there are few.
fn delayed(st: &HttpState, out: &mut Out) {
    let mut series = Vec::new();
    for v in super::sorted_vhosts(st) {
        for e in v.exchanges() {
            if let Some(d) = e.delayed.as_ref() {
                let labels = format!(
                    "vhost=\"{}\",exchange=\"{}\"",
                    escape_label(&v.name),
                    escape_label(&e.name)
                );
                series.push((labels, d.stats()));
            }
        }
    }
    series.sort_by(|a, b| a.0.cmp(&b.0));
    type PickDelayed = fn(&berth_broker::delayed::DelayedStats) -> u64;
    let families: [(&str, &str, &str, PickDelayed); 3] = [
        (
            "berth_exchange_messages_delayed",
            "gauge",
            "Messages a delayed exchange holds until they are due.",
            |s| s.messages as u64,
        ),
        (
            "berth_exchange_messages_delayed_routed_total",
            "counter",
            "Delayed messages routed once due, since the broker started.",
            |s| s.routed,
        ),
        (
            "berth_exchange_messages_delayed_lateness_ms_max",
            "gauge",
            "The latest a delayed message was routed after it was due, in ms.",
            |s| s.lateness_ms_max,
        ),
    ];
    for (name, kind, help, pick) in families {
        out.family(name, kind, help);
        for (labels, s) in &series {
            out.sample(name, labels, pick(s));
        }
    }
}

type G = berth_store::GroupStats;
/// One per-group store metric: name, type, help, value.
type Family = (&'static str, &'static str, &'static str, fn(&G) -> String);

/// The per-group store metrics (a data table: one row per family).
const STORE_FAMILIES: [Family; 19] = [
    (
        "berth_store_fsyncs_total",
        "counter",
        "fdatasync calls.",
        |g| g.syncs.to_string(),
    ),
    (
        "berth_store_fsync_seconds_total",
        "counter",
        "Time spent in fdatasync.",
        |g| format!("{}", g.sync_us_total as f64 / 1e6),
    ),
    (
        "berth_store_batches_total",
        "counter",
        "Write batches (group commits).",
        |g| g.batches.to_string(),
    ),
    (
        "berth_store_records_total",
        "counter",
        "Records written.",
        |g| g.records.to_string(),
    ),
    (
        "berth_store_bytes_written_total",
        "counter",
        "Bytes written to segments.",
        |g| g.bytes_written.to_string(),
    ),
    ("berth_store_segments", "gauge", "Segment files.", |g| {
        g.segments.to_string()
    }),
    (
        "berth_store_gather_waits_total",
        "counter",
        "Batches the writer held open for more committers (adaptive group commit; a lone committer never waits).",
        |g| g.gather_waits.to_string(),
    ),
    (
        "berth_store_gather_pause_seconds_max",
        "gauge",
        "Longest pause planned for committers to gather, since the start (at most store.commit_delay_us_max).",
        |g| format!("{}", g.gather_us_max as f64 / 1e6),
    ),
    (
        "berth_store_segments_deleted_total",
        "counter",
        "Segments deleted after their messages were acked.",
        |g| g.segments_deleted.to_string(),
    ),
    (
        "berth_store_segments_uncached_total",
        "counter",
        "Sealed segments dropped from the page cache once cold (store.segment_cache_bytes).",
        |g| g.segments_uncached.to_string(),
    ),
    (
        "berth_store_bytes_compacted_total",
        "counter",
        "Bytes copied forward by compaction.",
        |g| g.bytes_compacted.to_string(),
    ),
    (
        "berth_store_live_messages",
        "gauge",
        "Messages stored and not yet removed.",
        |g| g.live_messages.to_string(),
    ),
    (
        "berth_store_checkpoints_total",
        "counter",
        "Index checkpoints written.",
        |g| g.checkpoints.to_string(),
    ),
    (
        "berth_store_segment_bytes",
        "gauge",
        "Bytes of segment files.",
        |g| g.segment_bytes.to_string(),
    ),
    (
        "berth_store_live_bytes",
        "gauge",
        "Bytes of segment records holding live messages.",
        |g| g.live_bytes.to_string(),
    ),
    (
        "berth_store_dead_bytes",
        "gauge",
        "Segment bytes not holding live messages (removed messages, acks, metadata since checkpointed): what compaction and segment deletion reclaim at most.",
        |g| g.segment_bytes.saturating_sub(g.live_bytes).to_string(),
    ),
    (
        "berth_store_recovery_seconds",
        "gauge",
        "Time the group's recovery took at the last start.",
        |g| format!("{}", g.recovery.as_secs_f64()),
    ),
    (
        "berth_store_poisoned",
        "gauge",
        "1 if the group refuses writes after a failed fdatasync or write, until a restart.",
        |g| u8::from(g.poisoned).to_string(),
    ),
    (
        "berth_store_no_space",
        "gauge",
        "1 while the group refuses writes because a write found the disk full; it clears by itself once space is freed.",
        |g| u8::from(g.no_space.is_some()).to_string(),
    ),
];

/// Per log group store metrics.
fn store(st: &HttpState, out: &mut Out) {
    let groups = st.journal.store.stats();
    for (name, kind, help, value) in STORE_FAMILIES {
        out.family(name, kind, help);
        for g in &groups {
            out.sample(name, &format!("group=\"{}\"", g.group), value(g));
        }
    }
    /// Name, help, the histogram, the divisor turning its unit into the metric's.
    type Hist = (
        &'static str,
        &'static str,
        fn(&G) -> &HistogramSnapshot,
        f64,
    );
    let histograms: [Hist; 2] = [
        (
            "berth_store_fsync_duration_seconds",
            "fdatasync latency.",
            |g| &g.sync_latency_us,
            1e6,
        ),
        (
            "berth_store_batch_records",
            "Records per write batch (one write and at most one fdatasync each).",
            |g| &g.batch_records,
            1.0,
        ),
    ];
    for (name, help, pick, unit) in histograms {
        out.family(name, "histogram", help);
        for g in &groups {
            histogram(out, name, &format!("group=\"{}\"", g.group), pick(g), unit);
        }
    }
}

/// One series of a Prometheus histogram: cumulative `_bucket`s, `_sum`, `_count`.
fn histogram(out: &mut Out, name: &str, labels: &str, h: &HistogramSnapshot, unit: f64) {
    let mut cumulative = 0u64;
    for (bound, count) in h.bounds.iter().zip(&h.counts) {
        cumulative += count;
        let le = *bound as f64 / unit;
        out.sample(
            &format!("{name}_bucket"),
            &format!("{labels},le=\"{le}\""),
            cumulative,
        );
    }
    out.sample(
        &format!("{name}_bucket"),
        &format!("{labels},le=\"+Inf\""),
        h.count(),
    );
    let sum = h.sum as f64 / unit;
    out.sample(&format!("{name}_sum"), labels, sum);
    out.sample(&format!("{name}_count"), labels, h.count());
}

fn text(out: Out) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out.0,
    )
        .into_response()
}

/// `GET /metrics`: queue metrics summed over all queues.
pub(super) async fn aggregated(State(st): State<HttpState>) -> Response {
    let totals = totals(&st);
    let sums = Figures::of_totals(&totals);
    let mut out = Out(String::with_capacity(16 * 1024));
    common(&st, &mut out, &totals);
    for (name, kind, help, pick) in QUEUE_FAMILIES {
        out.one(name, kind, help, pick(&sums));
    }
    text(out)
}

/// `GET /metrics/per-object`: one series per queue.
pub(super) async fn per_object(State(st): State<HttpState>) -> Response {
    let rows = rows(&st);
    let mut out = Out(String::with_capacity(64 * 1024 + rows.len() * 512));
    common(&st, &mut out, &totals(&st));
    for (name, kind, help, pick) in QUEUE_FAMILIES {
        out.family(name, kind, help);
        for r in &rows {
            out.sample(name, &r.labels, pick(&r.figures));
        }
    }
    for (name, help, pick) in STREAM_FAMILIES {
        out.family(name, "gauge", help);
        for r in &rows {
            if let Some(st) = &r.stream {
                out.sample(name, &r.labels, pick(st));
            }
        }
    }
    text(out)
}

type StreamPick = fn(&berth_broker::stream::log::StreamStats) -> u64;

/// Per stream (berth's names: RabbitMQ's AMQP metrics have no offsets).
const STREAM_FAMILIES: [(&str, &str, StreamPick); 4] = [
    (
        "berth_stream_first_offset",
        "Offset of the oldest message a stream keeps.",
        |s| s.first_offset,
    ),
    (
        "berth_stream_next_offset",
        "Offset the next message published to a stream gets.",
        |s| s.next_offset,
    ),
    (
        "berth_stream_segments",
        "Logical segments of a stream (retention removes whole ones).",
        |s| s.segments,
    ),
    ("berth_stream_bytes", "Stored bytes a stream keeps.", |s| {
        s.bytes
    }),
];
