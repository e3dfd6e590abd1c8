//! Retention: which whole segments at the head of a stream go, by size
//! (`max-length-bytes`) and by age (`max-age`), as RabbitMQ's osiris
//! decides it: the active (last) segment never goes; by size, head
//! segments go while the stream is over its limit; by age, head segments
//! whose newest message is older than the limit go.
//!
//! Invariants:
//! - Only whole segments, only from the head, never the last one.

/// What retention needs to know of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentFacts {
    pub bytes: u64,
    /// Timestamp of its newest message (Unix milliseconds).
    pub last_timestamp_ms: u64,
}

/// The limits in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: Option<u64>,
    pub max_age_ms: Option<u64>,
}

/// How many segments at the head of `segments` retention removes now.
pub fn head_segments_to_drop(segments: &[SegmentFacts], limits: Limits, now_unix_ms: u64) -> usize {
    let total: u64 = segments.iter().map(|s| s.bytes).sum();
    let removable = segments.len().saturating_sub(1);
    let mut drop = 0;
    let mut left = total;
    while drop < removable {
        let s = segments[drop];
        let over_size = limits.max_bytes.is_some_and(|max| left > max);
        let too_old = limits
            .max_age_ms
            .is_some_and(|age| s.last_timestamp_ms.saturating_add(age) < now_unix_ms);
        if !(over_size || too_old) {
            break;
        }
        left -= s.bytes;
        drop += 1;
    }
    drop
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(list: &[(u64, u64)]) -> Vec<SegmentFacts> {
        list.iter()
            .map(|&(bytes, last_timestamp_ms)| SegmentFacts {
                bytes,
                last_timestamp_ms,
            })
            .collect()
    }

    #[test]
    fn size_drops_whole_head_segments_until_within_the_limit() {
        let s = segs(&[(100, 0), (100, 0), (100, 0), (50, 0)]);
        let l = |max| Limits {
            max_bytes: Some(max),
            max_age_ms: None,
        };
        assert_eq!(head_segments_to_drop(&s, l(350), 0), 0);
        assert_eq!(head_segments_to_drop(&s, l(349), 0), 1);
        assert_eq!(head_segments_to_drop(&s, l(150), 0), 2);
        // The active segment stays, even over the limit.
        assert_eq!(head_segments_to_drop(&s, l(0), 0), 3);
    }

    #[test]
    fn age_drops_head_segments_whose_newest_message_is_too_old() {
        let s = segs(&[(1, 1_000), (1, 2_000), (1, 9_000), (1, 9_500)]);
        let l = Limits {
            max_bytes: None,
            max_age_ms: Some(5_000),
        };
        assert_eq!(head_segments_to_drop(&s, l, 6_500), 1);
        assert_eq!(head_segments_to_drop(&s, l, 7_001), 2);
        assert_eq!(head_segments_to_drop(&s, l, 100_000), 3);
    }

    #[test]
    fn no_limits_keep_everything() {
        let s = segs(&[(1, 0), (1, 0)]);
        assert_eq!(head_segments_to_drop(&s, Limits::default(), u64::MAX), 0);
    }
}
