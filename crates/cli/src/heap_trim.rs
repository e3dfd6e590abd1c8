//! Gives memory the broker freed back to the kernel (issue 20 goal 6).
//!
//! glibc keeps freed heap memory: only the free space at the very top of a
//! heap is returned on its own; everything freed below a chunk still in
//! use stays resident, and so do the heaps of the other arenas (one per
//! thread that allocated, up to 8 per core). After a deep backlog is
//! drained and its queues deleted that was most of the process: RSS stayed
//! at 1.1 GB (docs/BENCHMARKS.md). `malloc_trim(0)` walks every arena and
//! releases each whole free page (`MADV_DONTNEED`).
//!
//! A thread of its own looks every [`TRIM_CHECK_INTERVAL_MS`] at the
//! *slack*: resident bytes not accounted for by memory in use by malloc
//! (RSS − (`uordblks` + `hblkhd`), from `mallinfo2`). When the slack grew
//! by more than [`TRIM_SLACK_BYTES_MIN`] since the last trim, it trims.
//! When the slack grew by less, but by at least [`IDLE_TRIM_SLACK_BYTES_MIN`],
//! and stayed where it was since the look before (nothing allocating or
//! freeing much: the broker went quiet), it trims too, so what a quiet
//! broker freed last is given back and not kept until the next burst.
//! What a trim cannot release (pages holding a live chunk, the binary, the
//! stacks) is the new floor, so a heap that cannot shrink is not trimmed
//! again and again.
//!
//! Invariants:
//! - It only ever calls `mallinfo2` and `malloc_trim`, which glibc makes
//!   safe to call from any thread at any time (they take the arenas'
//!   locks); it holds no lock of berth's.
//! - Other C libraries: nothing runs.

/// How often the slack is looked at.
pub const TRIM_CHECK_INTERVAL_MS: u64 = 2_000;
/// Slack growth that triggers a trim (a trim walks every arena, so small
/// amounts are left alone).
pub const TRIM_SLACK_BYTES_MIN: u64 = 32 * 1024 * 1024;
/// Slack growth that triggers a trim once the slack holds still.
pub const IDLE_TRIM_SLACK_BYTES_MIN: u64 = 4 * 1024 * 1024;
/// How far the slack may move between two looks and still count as
/// holding still.
pub const IDLE_SLACK_BYTES_JITTER: u64 = 1024 * 1024;

/// When to trim: remembers the slack a trim could not release.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// The slack after the last trim (or at start).
    floor_bytes: u64,
    /// The slack at the look before this one.
    last_bytes: u64,
}

impl Trimmer {
    /// Starts with the slack there is now as the floor.
    pub fn new(slack_bytes: u64) -> Self {
        Self {
            floor_bytes: slack_bytes,
            last_bytes: slack_bytes,
        }
    }

    /// Whether a trim is due with this much slack now (`slack_bytes`
    /// from the look just taken; call [`Trimmer::looked`] after).
    pub fn due(&self, slack_bytes: u64) -> bool {
        let grown = slack_bytes.saturating_sub(self.floor_bytes);
        let still = slack_bytes.abs_diff(self.last_bytes) <= IDLE_SLACK_BYTES_JITTER;
        grown > TRIM_SLACK_BYTES_MIN || (still && grown >= IDLE_TRIM_SLACK_BYTES_MIN)
    }

    /// Remembers the slack of a look, for the next look's "held still".
    pub fn looked(&mut self, slack_bytes: u64) {
        self.last_bytes = slack_bytes;
    }

    /// After a trim (or when the slack shrank by itself): what is left is
    /// the new floor.
    pub fn settle(&mut self, slack_bytes: u64) {
        self.floor_bytes = slack_bytes;
        self.last_bytes = slack_bytes;
    }

    /// One look: trims if due. Returns whether it trimmed.
    pub fn check(&mut self) -> bool {
        let Some(slack) = slack_bytes() else {
            return false;
        };
        if slack < self.floor_bytes {
            // Memory was reused; the floor follows it down.
            self.settle(slack);
            return false;
        }
        if !self.due(slack) {
            self.looked(slack);
            return false;
        }
        trim();
        if let Some(after) = slack_bytes() {
            self.settle(after);
        }
        true
    }
}

/// Starts the trimming thread (glibc only).
pub fn spawn() {
    if slack_bytes().is_none() {
        return;
    }
    let started = std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(|| {
            let mut t = Trimmer::new(slack_bytes().unwrap_or(0));
            loop {
                std::thread::sleep(std::time::Duration::from_millis(TRIM_CHECK_INTERVAL_MS));
                t.check();
            }
        });
    if let Err(e) = started {
        // Not fatal: freed memory then stays resident, as before.
        tracing::warn!(error = %e, "could not start the heap-trim thread");
    }
}

/// Resident bytes of this process (`VmRSS` of `/proc/self/status`).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident bytes not in use by malloc's callers.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn slack_bytes() -> Option<u64> {
    // SAFETY: mallinfo2 takes no pointer and only reads the allocator's
    // statistics under its own locks.
    let m = unsafe { libc::mallinfo2() };
    let in_use = (m.uordblks as u64).saturating_add(m.hblkhd as u64);
    Some(rss_bytes()?.saturating_sub(in_use))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn slack_bytes() -> Option<u64> {
    None
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: malloc_trim takes no pointer; it releases free pages of
    // every arena under that arena's lock.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_the_slack_grew_and_not_again_for_what_it_could_not_release() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        assert!(!t.due(40 * mib), "30 MiB of growth is below the minimum");
        assert!(t.due(50 * mib));
        // The trim left 20 MiB it could not release: that is no reason
        // to trim again.
        t.settle(20 * mib);
        t.looked(30 * mib);
        assert!(!t.due(45 * mib));
        assert!(t.due(60 * mib));
    }

    #[test]
    fn trims_a_smaller_growth_once_the_slack_holds_still() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        // 14 MiB freed while the broker is busy: the slack still moves.
        t.looked(20 * mib);
        assert!(
            !t.due(24 * mib),
            "the slack moved by 4 MiB since the last look"
        );
        t.looked(24 * mib);
        // It held still for a look: the broker went quiet.
        assert!(t.due(24 * mib) && t.due(25 * mib));
        // Held still, but grown by less than the idle minimum: left alone.
        t.settle(20 * mib);
        assert!(!t.due(23 * mib));
        t.looked(23 * mib);
        assert!(!t.due(23 * mib));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn memory_freed_below_live_chunks_leaves_the_process() {
        // On a thread of its own (its own arena), as the broker's
        // connection and writer threads allocate.
        std::thread::spawn(|| {
            let mut t = Trimmer::new(slack_bytes().expect("glibc"));
            // 256 MiB in 1 KiB blocks; one in 16 stays alive, so no free
            // run reaches the top of the heap and glibc keeps it all.
            let mut blocks: Vec<Box<[u8; 1024]>> =
                (0..256 * 1024).map(|_| Box::new([1u8; 1024])).collect();
            let rss_full = rss_bytes().expect("status");
            let mut i = 0;
            blocks.retain(|_| {
                i += 1;
                i % 16 == 0
            });
            blocks.shrink_to_fit();
            let rss_freed = rss_bytes().expect("status");
            assert!(t.check(), "240 MiB freed must make a trim due");
            let rss_trimmed = rss_bytes().expect("status");
            let mib = |b: u64| b / (1024 * 1024);
            assert!(
                rss_trimmed + 150 * 1024 * 1024 < rss_freed,
                "RSS full {} MiB, after the frees {} MiB, after the trim {} MiB: the trim gave back less than 150 MiB",
                mib(rss_full),
                mib(rss_freed),
                mib(rss_trimmed)
            );
            assert!(!t.check(), "nothing more to give back");
            drop(blocks);
        })
        .join()
        .expect("the test thread");
    }
}
