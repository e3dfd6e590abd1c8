//! What `berth store scan` shows of streams: for each stream defined in
//! the store, the journal segments holding its messages, with the offsets
//! and newest timestamp of each (read from the oldest and newest entry of
//! the stream in that segment; docs/STREAMS.md, "Operators").
//!
//! Read-only, on what the store's inspection gathered
//! ([`GroupReport::queue_segments`]); it reads two entries per stream and
//! segment, never the whole stream.

use berth_broker::meta::MetaCommand;
use berth_broker::stream::entry;
use berth_store::inspect::{read_payload, read_stream_last, GroupReport, Layout};
use berth_store::storage::OsStorage;

/// One stream's messages in one journal segment.
pub(crate) struct StreamSegment {
    pub group: u32,
    pub seq: u32,
    pub messages: u64,
    pub bytes: u64,
    /// Offsets of its oldest and newest entry (`None`: unreadable, with why).
    pub offsets: Result<(u64, u64), String>,
    pub last_timestamp_ms: Option<u64>,
}

/// A stream and its segments, oldest first.
pub(crate) struct StreamReport {
    pub vhost: String,
    pub name: String,
    pub queue_id: u64,
    pub segments: Vec<StreamSegment>,
}

impl StreamReport {
    pub fn messages(&self) -> u64 {
        self.segments.iter().map(|s| s.messages).sum()
    }
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }
}

/// Every stream the store's definitions name, with its segments.
pub(crate) fn streams(layout: &Layout, groups: &[GroupReport]) -> Vec<StreamReport> {
    let mut out = Vec::new();
    for g in groups {
        for (k, v) in &g.meta {
            let Ok(MetaCommand::PutQueue(q)) = MetaCommand::decode(k, Some(v)) else {
                continue;
            };
            let stream = q
                .arguments
                .inner()
                .get("x-queue-type")
                .and_then(berth_broker::args::as_string)
                .is_some_and(|t| t == "stream");
            if stream {
                out.push(StreamReport {
                    segments: segments_of(layout, groups, q.id),
                    vhost: q.vhost,
                    name: q.name,
                    queue_id: q.id,
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    out
}

fn segments_of(layout: &Layout, groups: &[GroupReport], id: u64) -> Vec<StreamSegment> {
    let mut segs = Vec::new();
    for g in groups {
        // Appended records (the sparse index's spans): offsets from the
        // index, the newest timestamp read from the span's last record.
        if let Some(st) = g.streams.get(&berth_store::QueueId(id)) {
            for span in st.spans() {
                let newest =
                    read_stream_last(&OsStorage, layout, g.group, berth_store::QueueId(id), span)
                        .map_err(|e| e.to_string())
                        .and_then(|p| entry::decode_header(&p).map_err(|e| e.to_string()));
                let first = span.points[0].offset.max(st.trimmed_below);
                segs.push(StreamSegment {
                    group: g.group,
                    seq: span.seg,
                    messages: span.count,
                    bytes: span.bytes,
                    last_timestamp_ms: newest.as_ref().ok().map(|n| n.1),
                    offsets: newest.map(|_| (first, span.last)),
                });
            }
        }
        for (&(q, seq), r) in &g.queue_segments {
            if q.0 != id {
                continue;
            }
            let read = |(msg, loc)| -> Result<(u64, u64), String> {
                let p = read_payload(&OsStorage, layout, g.group, msg, loc)
                    .map_err(|e| e.to_string())?;
                entry::decode_header(&p).map_err(|e| e.to_string())
            };
            let (oldest, newest) = (read(r.oldest), read(r.newest));
            segs.push(StreamSegment {
                group: g.group,
                seq,
                messages: r.messages,
                bytes: r.bytes,
                last_timestamp_ms: newest.as_ref().ok().map(|n| n.1),
                offsets: oldest.and_then(|o| newest.map(|n| (o.0, n.0))),
            });
        }
    }
    // Offsets grow with the journal's ids; a stream is in one group.
    segs.sort_by_key(|s| (s.offsets.as_ref().map_or(u64::MAX, |o| o.0), s.seq));
    segs
}
