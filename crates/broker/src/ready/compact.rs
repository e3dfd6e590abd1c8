//! Eight-byte forms of the two optional fields of a ready entry, so that
//! an [`super::Entry`] fits in 48 bytes instead of 64: a deep queue holds
//! millions of entries, and a restart of ten million writes every one of
//! them into fresh memory (docs/BENCHMARKS.md, "Restart at ten million on
//! a quieter machine").
//!
//! Invariants:
//! - `Deadline::new(t).get() == t` for every instant within 292 years of
//!   the process's base instant (the first one converted), before or after
//!   it; further away it is clamped to that distance.
//! - `StoredId::new(id).get() == id` for every id but `u64::MAX` (journal
//!   ids are counters, paging ids a counter with the top bit set: neither
//!   comes near it).

use std::num::{NonZeroI64, NonZeroU64};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The instant every [`Deadline`] is counted from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX - 1)
}

/// An `Option<Instant>` in 8 bytes: nanoseconds from [`base`], shifted
/// so that no instant is zero (zero is `None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deadline(Option<NonZeroI64>);

impl Deadline {
    pub(crate) fn new(at: Option<Instant>) -> Self {
        Self(at.and_then(|at| {
            let b = base();
            let v = match at.checked_duration_since(b) {
                Some(after) => nanos(after) + 1,
                None => -nanos(b.duration_since(at)),
            };
            NonZeroI64::new(v)
        }))
    }

    pub(crate) fn get(self) -> Option<Instant> {
        let v = self.0?.get();
        let b = base();
        Some(if v > 0 {
            b + Duration::from_nanos(v.unsigned_abs() - 1)
        } else {
            b - Duration::from_nanos(v.unsigned_abs())
        })
    }
}

/// An `Option<u64>` journal id in 8 bytes: the id plus one, so that id 0
/// is representable and zero is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StoredId(Option<NonZeroU64>);

impl StoredId {
    pub(crate) fn new(id: Option<u64>) -> Self {
        Self(id.and_then(|id| {
            debug_assert!(id != u64::MAX, "journal id u64::MAX has no compact form");
            NonZeroU64::new(id.wrapping_add(1))
        }))
    }

    pub(crate) fn get(self) -> Option<u64> {
        self.0.map(|v| v.get() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_before_at_and_after_the_base_come_back_exactly() {
        let b = base();
        let later = b + Duration::from_millis(1);
        let far = b + Duration::from_secs(86_400 * 365 * 10);
        let mut cases = vec![None, Some(b), Some(later), Some(far), Some(Instant::now())];
        if let Some(earlier) = b.checked_sub(Duration::from_nanos(1)) {
            cases.push(Some(earlier));
        }
        if let Some(earlier) = b.checked_sub(Duration::from_secs(3_600)) {
            cases.push(Some(earlier));
        }
        for t in cases {
            assert_eq!(Deadline::new(t).get(), t, "{t:?} around base {b:?}");
        }
        assert_eq!(Deadline::default().get(), None);
    }

    #[test]
    fn stored_ids_come_back_exactly() {
        for id in [
            None,
            Some(0),
            Some(1),
            Some(1 << 63),
            Some((1 << 63) | 12_345),
            Some(u64::MAX - 1),
        ] {
            assert_eq!(StoredId::new(id).get(), id);
        }
    }

    #[test]
    fn both_are_eight_bytes() {
        assert_eq!(std::mem::size_of::<Deadline>(), 8);
        assert_eq!(std::mem::size_of::<StoredId>(), 8);
    }
}
