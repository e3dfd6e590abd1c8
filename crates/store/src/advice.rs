//! Recommendations from a scan (`berth store scan`), each with the
//! reasoning the operator reads: the segment size for the observed message
//! sizes, the log-group count for the observed spread of queues, and
//! whether compaction would pay.
//!
//! Invariants:
//! - Pure functions of the reports: no I/O, so every rule is unit-tested.
//! - A recommendation says what it saw, what it suggests, and why.

use crate::inspect::{GroupReport, Histogram};

/// Messages a segment should hold at the 99th-percentile size, so that a
/// message larger than a segment (which gets one of its own) stays rare
/// and one long-lived message pins at most 1/256 of a segment's worth.
pub const SEGMENT_MESSAGES_MIN: u64 = 256;
/// Bounds of a recommended segment size.
pub const SEGMENT_SIZE_BYTES_RECOMMENDED_MIN: u64 = 4 * 1024 * 1024;
pub const SEGMENT_SIZE_BYTES_RECOMMENDED_MAX: u64 = 1024 * 1024 * 1024;
/// Compaction pays when at least this share of sealed segments' bytes is
/// dead and it frees at least one segment's worth.
pub const COMPACTION_DEAD_SHARE_MIN: f64 = 0.5;
/// Bounds of a recommended log-group count (`store.log_groups`).
pub const LOG_GROUPS_RECOMMENDED_MIN: u64 = 2;
pub const LOG_GROUPS_RECOMMENDED_MAX: u64 = 16;

/// One piece of advice.
#[derive(Clone, Debug, PartialEq)]
pub struct Advice {
    /// The setting concerned (`store.segment_size_bytes`, ...) or action.
    pub topic: &'static str,
    /// What to do: a value, "keep", or "run berth store compact".
    pub recommendation: String,
    /// Why, in words, with the numbers seen.
    pub reasoning: String,
}

/// The size the store rolls segments at, as seen on disk: the largest
/// sealed segment (segments roll once they would grow past it).
pub fn observed_segment_size(groups: &[GroupReport]) -> Option<u64> {
    groups
        .iter()
        .flat_map(|g| {
            g.segments
                .split_last()
                .map_or(&[][..], |(_, sealed)| sealed)
        })
        .map(|s| s.bytes)
        .max()
}

/// All recommendations for a scanned store.
pub fn advise(groups: &[GroupReport], group_count: u32, dir_count: u32) -> Vec<Advice> {
    let mut sizes = Histogram::default();
    for g in groups {
        sizes.merge(&g.sizes);
    }
    vec![
        segment_size(&sizes, observed_segment_size(groups)),
        log_groups(groups, group_count, dir_count),
        compaction(groups, observed_segment_size(groups)),
    ]
}

/// Bytes for people: B, KiB, MiB or GiB.
pub fn human_bytes(b: u64) -> String {
    let f = b as f64;
    if b < 1024 {
        format!("{b} B")
    } else if b < 1024 * 1024 {
        format!("{:.1} KiB", f / 1024.0)
    } else if b < 1024 * 1024 * 1024 {
        format!("{:.1} MiB", f / 1_048_576.0)
    } else {
        format!("{:.2} GiB", f / 1_073_741_824.0)
    }
}

pub fn segment_size(sizes: &Histogram, observed: Option<u64>) -> Advice {
    let topic = "store.segment_size_bytes";
    if sizes.count == 0 {
        return Advice {
            topic,
            recommendation: "keep".into(),
            reasoning: "no message in the journal to size segments by".into(),
        };
    }
    let p99 = sizes.quantile_upper(0.99);
    let want = (p99 * SEGMENT_MESSAGES_MIN).next_power_of_two().clamp(
        SEGMENT_SIZE_BYTES_RECOMMENDED_MIN,
        SEGMENT_SIZE_BYTES_RECOMMENDED_MAX,
    );
    let seen = observed.map_or("no sealed segment yet".to_owned(), |o| {
        format!("segments roll at about {}", human_bytes(o))
    });
    // Within a factor of 4 either way, the difference does not matter.
    let keep = observed.is_none_or(|o| o >= want / 4 && o <= want.saturating_mul(4));
    Advice {
        topic,
        recommendation: if keep {
            "keep".into()
        } else {
            format!("{want}")
        },
        reasoning: format!(
            "{} messages, 99% of them below {p99} bytes (largest {}); a segment of {} holds \
             {SEGMENT_MESSAGES_MIN}+ of them, so messages larger than a segment stay rare and a \
             long-lived message pins little; {seen}. A log-structured store appends a message \
             of any size in one write, so this is about file count and reclamation, not speed.",
            sizes.count,
            sizes.max,
            human_bytes(want)
        ),
    }
}

pub fn log_groups(groups: &[GroupReport], group_count: u32, dir_count: u32) -> Advice {
    let topic = "store.log_groups";
    let queues: u64 = groups.iter().map(|g| g.queues_published).sum();
    let busy = groups
        .iter()
        .filter(|g| g.replay_records > 0 || g.live_messages > 0)
        .count();
    let want = queues.clamp(LOG_GROUPS_RECOMMENDED_MIN, LOG_GROUPS_RECOMMENDED_MAX);
    let have = u64::from(group_count);
    let recommendation = if want < have / 2 || want > have * 2 {
        format!("{want} (takes effect for a new store: reshaping an existing one is not implemented yet; back up, and restore into a new store)")
    } else {
        "keep".into()
    };
    Advice {
        topic,
        recommendation,
        reasoning: format!(
            "{queues} queues published to in the journal, spread over {have} groups in {dir_count} \
             data director{} ({busy} groups in use); a group is one writer with one fsync, and \
             throughput stops growing once groups ≈ concurrent publishing queues (at most one per \
             disk's worth of fsyncs), so about min(queues, {LOG_GROUPS_RECOMMENDED_MAX}) groups, \
             at least {LOG_GROUPS_RECOMMENDED_MIN}",
            if dir_count == 1 { "y" } else { "ies" }
        ),
    }
}

pub fn compaction(groups: &[GroupReport], observed: Option<u64>) -> Advice {
    let topic = "compaction";
    let (mut dead, mut total) = (0u64, 0u64);
    for g in groups {
        if let Some((_, sealed)) = g.segments.split_last() {
            for s in sealed {
                dead += s.dead_bytes;
                total += s.bytes;
            }
        }
    }
    let share = if total == 0 {
        0.0
    } else {
        dead as f64 / total as f64
    };
    let pays = share >= COMPACTION_DEAD_SHARE_MIN && dead >= observed.unwrap_or(u64::MAX);
    Advice {
        topic,
        recommendation: if pays {
            "run berth store compact".into()
        } else {
            "not needed".into()
        },
        reasoning: format!(
            "sealed segments hold {} of which {} ({:.0}%) are dead (acked messages, acks, \
             metadata); compaction pays when at least {:.0}% is dead and that is at least a \
             segment's worth; fully dead segments are deleted automatically anyway",
            human_bytes(total),
            human_bytes(dead),
            share * 100.0,
            COMPACTION_DEAD_SHARE_MIN * 100.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::SegmentReport;

    #[test]
    fn segment_size_follows_the_99th_percentile() {
        let mut h = Histogram::default();
        for _ in 0..1000 {
            h.add(16 * 1024);
        }
        // 16 KiB messages: 256 of them need 8 MiB (bucket upper bound 32 KiB,
        // capped at the largest size 16 KiB → 4 MiB, the floor).
        let a = segment_size(&h, Some(256 * 1024 * 1024));
        assert_eq!(a.recommendation, (4u64 * 1024 * 1024).to_string(), "{a:?}");
        let a = segment_size(&h, Some(8 * 1024 * 1024));
        assert_eq!(a.recommendation, "keep");
        let mut big = Histogram::default();
        for _ in 0..100 {
            big.add(1024 * 1024);
        }
        let a = segment_size(&big, Some(4 * 1024 * 1024));
        assert_eq!(a.recommendation, (256u64 * 1024 * 1024).to_string());
        assert!(a.reasoning.contains("99%"), "{}", a.reasoning);
    }

    #[test]
    fn compaction_pays_only_when_mostly_dead_and_a_segment_s_worth() {
        let seg = |bytes, dead| SegmentReport {
            bytes,
            dead_bytes: dead,
            ..SegmentReport::default()
        };
        let mut g = GroupReport {
            segments: vec![seg(1000, 900), seg(1000, 800), seg(10, 0)],
            ..GroupReport::default()
        };
        assert_eq!(
            compaction(std::slice::from_ref(&g), Some(1000)).recommendation,
            "run berth store compact"
        );
        g.segments = vec![seg(1000, 100), seg(1000, 200), seg(10, 0)];
        assert_eq!(
            compaction(std::slice::from_ref(&g), Some(1000)).recommendation,
            "not needed"
        );
    }

    #[test]
    fn log_groups_follow_published_queues() {
        let g = GroupReport {
            queues_published: 40,
            ..GroupReport::default()
        };
        assert!(log_groups(std::slice::from_ref(&g), 2, 1)
            .recommendation
            .starts_with("16"));
        assert_eq!(
            log_groups(std::slice::from_ref(&g), 16, 1).recommendation,
            "keep"
        );
    }
}
