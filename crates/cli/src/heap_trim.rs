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
//! (RSS − (`uordblks` + `hblkhd`), from `mallinfo2`). It gives back only
//! memory that stayed free for a whole window of [`TRIM_WINDOW_LOOKS`]
//! looks (10 s): the lowest slack of the window, less what the last trim
//! could not release. When that grew by more than
//! [`TRIM_SLACK_BYTES_MIN`], it trims. When it grew by less, but by at
//! least [`IDLE_TRIM_SLACK_BYTES_MIN`], and the slack held still over the
//! window (nothing allocating or freeing much: the broker went quiet), it
//! trims too, so what a quiet broker freed last is given back and not
//! kept until the next burst. What a trim cannot release (pages holding
//! a live chunk, the binary, the stacks) is the new floor, so a heap that
//! cannot shrink is not trimmed again and again.
//!
//! Why a window: memory that a fill takes back within seconds (a queue
//! that fills and drains in cycles, a bench's runs) would otherwise be
//! given back after each drain and faulted in again, page by page, by the
//! next fill: in `berth bench pagesize` (2 KB and 16 KB bodies) that was
//! 60% of the broker's page faults and 14-20% of its CPU per message at
//! the median (docs/BENCHMARKS.md, "Freed memory kept for a window").
//! jemalloc decays its dirty pages over the same 10 s.
//!
//! Invariants:
//! - It only ever calls `mallinfo2` and `malloc_trim`, which glibc makes
//!   safe to call from any thread at any time (they take the arenas'
//!   locks); it holds no lock of berth's.
//! - Other C libraries: nothing runs.

use std::collections::VecDeque;

/// How often the slack is looked at.
pub const TRIM_CHECK_INTERVAL_MS: u64 = 2_000;
/// Slack growth that triggers a trim (a trim walks every arena, so small
/// amounts are left alone).
pub const TRIM_SLACK_BYTES_MIN: u64 = 32 * 1024 * 1024;
/// Slack growth that triggers a trim once the slack holds still.
pub const IDLE_TRIM_SLACK_BYTES_MIN: u64 = 4 * 1024 * 1024;
/// How far the slack may move over a window and still count as holding
/// still.
pub const IDLE_SLACK_BYTES_JITTER: u64 = 1024 * 1024;
/// Looks (the one being taken included) over which memory must stay free
/// before it is given back: 10 s at [`TRIM_CHECK_INTERVAL_MS`], so a
/// drained backlog is given back within ~12 s (issue 20 goal 6 asks for
/// 30 s), and memory reused sooner is kept.
pub const TRIM_WINDOW_LOOKS: usize = 5;

/// When to trim: remembers the slack a trim could not release, and the
/// slack of the window's earlier looks.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// The slack after the last trim (or at start).
    floor_bytes: u64,
    /// The slack of the looks since the floor was set, oldest first; at
    /// most the window's looks before the one being taken.
    earlier: VecDeque<u64>,
}

impl Trimmer {
    /// Starts with the slack there is now as the floor.
    pub fn new(slack_bytes: u64) -> Self {
        Self {
            floor_bytes: slack_bytes,
            earlier: VecDeque::with_capacity(TRIM_WINDOW_LOOKS),
        }
    }

    /// Whether a trim is due with this much slack now (`slack_bytes`
    /// from the look just taken; call [`Trimmer::looked`] after): only
    /// for memory that every look of a whole window saw free.
    pub fn due(&self, slack_bytes: u64) -> bool {
        if self.earlier.len() + 1 < TRIM_WINDOW_LOOKS {
            return false;
        }
        let window = || self.earlier.iter().copied().chain([slack_bytes]);
        let lowest = window().min().unwrap_or(slack_bytes);
        let highest = window().max().unwrap_or(slack_bytes);
        let unused = lowest.saturating_sub(self.floor_bytes);
        let still = highest - lowest <= IDLE_SLACK_BYTES_JITTER;
        unused > TRIM_SLACK_BYTES_MIN || (still && unused >= IDLE_TRIM_SLACK_BYTES_MIN)
    }

    /// Remembers the slack of a look, for the window of the next ones.
    pub fn looked(&mut self, slack_bytes: u64) {
        if self.earlier.len() + 1 >= TRIM_WINDOW_LOOKS {
            self.earlier.pop_front();
        }
        self.earlier.push_back(slack_bytes);
    }

    /// After a trim (or when the slack shrank by itself): what is left is
    /// the new floor, and the next trim waits for a whole window above it.
    pub fn settle(&mut self, slack_bytes: u64) {
        self.floor_bytes = slack_bytes;
        self.earlier.clear();
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
    fn memory_a_fill_reuses_within_the_window_is_not_given_back() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        // Fill and drain cycles (a bench's runs, a queue that fills and
        // empties): 200 MiB freed, taken again by the next fill a look
        // later. Giving it back would only have the fill fault it in
        // again, page by page.
        // Cycles enough that the window is full for most of its looks.
        for cycle in 0..2 * TRIM_WINDOW_LOOKS {
            assert!(!t.due(210 * mib), "cycle {cycle}: freed a look ago");
            t.looked(210 * mib);
            assert!(!t.due(12 * mib), "cycle {cycle}: reused");
            t.looked(12 * mib);
        }
    }

    /// Looks `slack` for all but the last look of a window, asserting
    /// that none of them is due.
    fn look_all_but_one(t: &mut Trimmer, slack: &[u64]) {
        assert_eq!(slack.len(), TRIM_WINDOW_LOOKS - 1);
        for (i, s) in slack.iter().enumerate() {
            assert!(!t.due(*s), "look {i} of the window ({s} bytes) is not due");
            t.looked(*s);
        }
    }

    #[test]
    fn memory_unused_for_a_whole_window_is_given_back_and_not_before() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        look_all_but_one(&mut t, &[210 * mib; TRIM_WINDOW_LOOKS - 1]);
        assert!(t.due(210 * mib), "200 MiB unused for a whole window");
        // One look of the window saw the memory in use: not given back.
        let mut t = Trimmer::new(10 * mib);
        look_all_but_one(&mut t, &[210 * mib, 210 * mib, 30 * mib, 210 * mib]);
        assert!(!t.due(210 * mib), "only 20 MiB stayed unused");
    }

    #[test]
    fn trims_once_the_slack_grew_and_not_again_for_what_it_could_not_release() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        look_all_but_one(&mut t, &[40 * mib, 50 * mib, 45 * mib, 60 * mib]);
        assert!(!t.due(50 * mib), "30 MiB of growth is below the minimum");
        t.looked(50 * mib);
        assert!(
            t.due(50 * mib),
            "the window's lowest is 45 MiB, 35 above the floor"
        );
        // The trim left 20 MiB it could not release: that is no reason
        // to trim again.
        t.settle(20 * mib);
        look_all_but_one(&mut t, &[30 * mib, 45 * mib, 40 * mib, 35 * mib]);
        assert!(!t.due(45 * mib));
        t.looked(45 * mib);
        look_all_but_one(&mut t, &[60 * mib, 70 * mib, 65 * mib, 60 * mib]);
        assert!(t.due(60 * mib), "40 MiB above the floor for a whole window");
    }

    #[test]
    fn trims_a_smaller_growth_once_the_slack_held_still_for_a_window() {
        let mib = 1024 * 1024;
        let mut t = Trimmer::new(10 * mib);
        // 14 MiB freed while the broker is busy: the slack still moves.
        look_all_but_one(&mut t, &[20 * mib, 24 * mib, 20 * mib, 24 * mib]);
        assert!(!t.due(24 * mib), "the slack moved by 4 MiB in the window");
        t.looked(24 * mib);
        // From now on it holds still: due once the whole window saw only
        // that (the broker went quiet), not while a look of it still moved.
        for look in 0..2 {
            assert!(
                !t.due(24 * mib),
                "look {look}: 20 MiB is still in the window"
            );
            t.looked(24 * mib);
        }
        assert!(t.due(24 * mib) && t.due(25 * mib));
        // Held still, but grown by less than the idle minimum: left alone.
        t.settle(20 * mib);
        look_all_but_one(&mut t, &[23 * mib; TRIM_WINDOW_LOOKS - 1]);
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
            for look in 1..TRIM_WINDOW_LOOKS {
                assert!(!t.check(), "look {look}: freed less than a window ago");
            }
            assert!(t.check(), "240 MiB freed for a whole window must make a trim due");
            let rss_trimmed = rss_bytes().expect("status");
            let mib = |b: u64| b / (1024 * 1024);
            assert!(
                rss_trimmed + 150 * 1024 * 1024 < rss_freed,
                "RSS full {} MiB, after the frees {} MiB, after the trim {} MiB: the trim gave back less than 150 MiB",
                mib(rss_full),
                mib(rss_freed),
                mib(rss_trimmed)
            );
            for _ in 0..2 * TRIM_WINDOW_LOOKS {
                assert!(!t.check(), "nothing more to give back");
            }
            drop(blocks);
        })
        .join()
        .expect("the test thread");
    }
}
