//! Fixes glibc malloc's mmap and trim thresholds before the broker
//! starts, so the large tables the broker grows (the store's message
//! index, a queue's or a delayed exchange's index) go back to the kernel
//! when they are replaced, while the buffers it reuses all the time (a
//! gathered batch, a Raft entry, an append to a follower) stay in the
//! heap.
//!
//! glibc starts with a 128 KiB mmap threshold and *raises* it (up to
//! 32 MiB) each time an mmapped block is freed, with the trim threshold
//! at twice that. The first hash-table resize of a growing index frees
//! one, so every later table up to 32 MiB came from the heap, and the old
//! tables left behind by each doubling stayed resident as free heap.
//! Measured with 1,000,000 pending delayed messages (docs/BENCHMARKS.md,
//! "Pending delayed messages"): +156.6 MiB with the dynamic threshold,
//! +119.6 MiB with a fixed one, the same code otherwise.
//!
//! The fixed threshold must not be glibc's starting 128 KiB, though: then
//! every buffer above it is a fresh mmap, faulted in page by page and
//! unmapped when dropped, and with a 128 KiB trim threshold the heap's
//! top is given back and faulted in again at every swing. A cluster
//! member handles megabyte batches hundreds of times a second: at
//! 128 KiB it took 3-4x the page faults per message and ~60% more CPU per
//! message than with glibc's dynamic threshold (docs/BENCHMARKS.md, "The
//! regression, found"). So: a threshold at the largest Raft entry the
//! leader gathers (`ENTRY_BYTES_MAX`, 8 MiB; an append to a follower is
//! about 4 MiB), and the trim threshold at twice it, as glibc's own
//! adjustment would set. Measured with 1,000,000 pending delayed
//! messages: +97 MiB at 128 KiB, +103 MiB at 8 MiB, +119 MiB at 16 MiB;
//! the cluster's page faults are the same at 8 and 16 MiB.
//!
//! The number of arenas is fixed too, at one per four cores (at least
//! one). glibc gives each thread that allocates an arena of its own, up to
//! eight per core, and `malloc_trim` cannot give back the free top of any
//! arena but the first: with the trim threshold at 16 MiB each of them
//! kept up to 16 MiB that no trim releases. After a 2 GB backlog was
//! drained and its queues deleted, ~100 MiB stayed resident that way
//! (free in malloc's books, 8 MiB in use; docs/BENCHMARKS.md, "Memory
//! given back"). Fewer arenas means more threads share an arena's lock
//! for blocks too large for their thread cache: on two cores no
//! difference was measured for a single node (fanin and pagesize, same
//! run), but a cluster member, whose Raft threads and connection threads
//! all pass megabyte entries around, lost 15-25% of its confirmed msg/s
//! (persist-2k-5q, two A/B pairs). So a cluster member keeps glibc's
//! number of arenas.
//!
//! An operator's own `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or
//! `MALLOC_ARENA_MAX` (read by glibc at start-up) wins for that setting.
//! Other C libraries: nothing is done.

/// The mmap threshold berth fixes: above every buffer the broker reuses
/// at a high rate, below the index tables that must go back when replaced.
pub const MMAP_THRESHOLD_BYTES: i32 = 8 * 1024 * 1024;

/// The trim threshold berth fixes: twice the mmap threshold (glibc's own
/// rule when it adjusts them), so the heap's top is not given back and
/// faulted in again at every swing of a batch.
pub const TRIM_THRESHOLD_BYTES: i32 = 2 * MMAP_THRESHOLD_BYTES;

/// Cores per malloc arena.
pub const CORES_PER_ARENA: usize = 4;

/// The arenas berth lets glibc make on a machine with `cores` cores.
pub fn arenas_for(cores: usize) -> i32 {
    i32::try_from((cores / CORES_PER_ARENA).max(1)).unwrap_or(i32::MAX)
}

/// Fixes the thresholds, and the number of arenas unless this is a
/// cluster member, where the environment does not set them. Call before
/// any thread starts (mallopt is not meant to race with allocations).
pub fn fix_malloc_settings(cluster_member: bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    fix_for((!cluster_member).then_some(cores));
}

/// `cores`: the arenas are fixed for that many cores; `None`: glibc's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn fix_for(cores: Option<usize>) {
    let arenas = cores.map(arenas_for);
    for (env, param, value, name) in [
        (
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD_BYTES,
            "M_MMAP_THRESHOLD",
        ),
        (
            "MALLOC_TRIM_THRESHOLD_",
            libc::M_TRIM_THRESHOLD,
            TRIM_THRESHOLD_BYTES,
            "M_TRIM_THRESHOLD",
        ),
        (
            "MALLOC_ARENA_MAX",
            libc::M_ARENA_MAX,
            arenas.unwrap_or(0),
            "M_ARENA_MAX",
        ),
    ] {
        if std::env::var_os(env).is_some() || (param == libc::M_ARENA_MAX && arenas.is_none()) {
            continue;
        }
        // SAFETY: mallopt only sets allocator parameters; it is called
        // once, from main, before the runtime's threads exist. Setting
        // either threshold also turns glibc's dynamic adjustment off.
        let ok = unsafe { libc::mallopt(param, value) };
        if ok != 1 {
            // Not fatal: memory use or page faults are then higher.
            eprintln!("berth: mallopt({name}, {value}) failed; glibc's defaults stay");
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn fix_for(_cores: Option<usize>) {}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    //! Each check runs in a child process (this test binary run again
    //! with one test and `BERTH_MALLOC_CHILD` set), so the thresholds are
    //! fixed before anything else allocates, as in `berth serve`, and no
    //! other test's allocations touch the counts.
    //!
    //! The number of arenas is the exception: it is given to the child in
    //! `MALLOC_ARENA_MAX`, which glibc reads before any thread exists.
    //! libtest runs even a lone test on a thread of its own, and that
    //! thread has allocated (and so been given an arena of its own) before
    //! the test body can call `fix_for`; the worker threads a test starts
    //! then share two arenas where `berth serve`, which fixes the settings
    //! in `main` before any thread starts, has one.
    use std::process::Command;

    const CHILD: &str = "BERTH_MALLOC_CHILD";

    /// The cores the children tune for: this VM's two, whatever runs the
    /// tests, so what they check does not depend on the machine.
    const CORES: usize = 2;

    /// Runs `test` of this module in a fresh process; true when it runs
    /// here as that child (the caller then does the real work).
    fn in_child(test: &str) -> bool {
        if std::env::var_os(CHILD).is_some() {
            super::fix_for(Some(CORES));
            return true;
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                &format!("malloc_tune::tests::{test}"),
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env_remove("MALLOC_MMAP_THRESHOLD_")
            .env_remove("MALLOC_TRIM_THRESHOLD_")
            .env("MALLOC_ARENA_MAX", super::arenas_for(CORES).to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child {test} failed:\n{text}");
        assert!(text.contains("1 passed"), "child ran no test:\n{text}");
        false
    }

    #[allow(unsafe_code)]
    fn minor_faults() -> i64 {
        // SAFETY: getrusage writes one rusage into the zeroed struct.
        unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut u), 0);
            u.ru_minflt
        }
    }

    /// The arenas glibc has made so far (`malloc_info` lists each heap).
    #[allow(unsafe_code)]
    fn arenas() -> usize {
        let mut buf: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        // SAFETY: open_memstream writes a malloc'd buffer and its length
        // into `buf` and `len` when the stream is closed; malloc_info
        // writes to the stream; the buffer is NUL-terminated, read once
        // and freed.
        unsafe {
            let f = libc::open_memstream(&mut buf, &mut len);
            assert!(!f.is_null(), "open_memstream failed");
            assert_eq!(libc::malloc_info(0, f), 0, "malloc_info failed");
            assert_eq!(libc::fclose(f), 0, "fclose of the memstream failed");
            let xml = std::ffi::CStr::from_ptr(buf).to_string_lossy().into_owned();
            libc::free(buf.cast());
            xml.matches("<heap nr=").count()
        }
    }

    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// A batch-sized buffer, filled and dropped over and over (what a
    /// cluster member does hundreds of times a second), is faulted in
    /// once, not at every use.
    #[test]
    fn a_reused_batch_buffer_is_not_faulted_in_again() {
        if !in_child("a_reused_batch_buffer_is_not_faulted_in_again") {
            return;
        }
        const BUF: usize = 4 * 1024 * 1024;
        const ROUNDS: i64 = 200;
        let pages_per_buffer = (BUF / 4096) as i64;
        let before = minor_faults();
        for round in 0..ROUNDS {
            let mut v = vec![0u8; BUF];
            v.iter_mut().step_by(4096).for_each(|b| *b = round as u8);
            std::hint::black_box(&v);
        }
        let faults = minor_faults() - before;
        assert!(
            faults < 10 * pages_per_buffer,
            "{faults} page faults for {ROUNDS} uses of one {BUF}-byte buffer \
             ({pages_per_buffer} pages): each use maps fresh memory"
        );
    }

    /// A large table, once dropped, goes back to the kernel (the reason
    /// the threshold is fixed at all).
    #[test]
    fn a_dropped_large_table_is_given_back() {
        if !in_child("a_dropped_large_table_is_given_back") {
            return;
        }
        const TABLE: usize = 64 * 1024 * 1024;
        let mut t = vec![0u8; TABLE];
        t.iter_mut().step_by(4096).for_each(|b| *b = 1);
        std::hint::black_box(&t);
        let with = resident_bytes();
        drop(t);
        let without = resident_bytes();
        assert!(
            with - without >= (TABLE as u64) * 9 / 10,
            "RSS fell by {} bytes when a {TABLE}-byte table was dropped",
            with.saturating_sub(without)
        );
    }

    /// What many threads allocated and freed goes back to the kernel at a
    /// trim (the heap-trim thread's `malloc_trim`), not only what the
    /// first arena held.
    #[test]
    #[allow(unsafe_code)]
    fn memory_freed_on_many_threads_goes_back_at_a_trim() {
        if !in_child("memory_freed_on_many_threads_goes_back_at_a_trim") {
            return;
        }
        const THREADS: usize = 8;
        const PER_THREAD: usize = 8 * 1024 * 1024;
        const BLOCK: usize = 2048;
        let before = resident_bytes();
        // All at once, so glibc hands each thread an arena of its own if
        // it may.
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    start.wait();
                    let blocks: Vec<Vec<u8>> =
                        (0..PER_THREAD / BLOCK).map(|_| vec![1u8; BLOCK]).collect();
                    std::hint::black_box(&blocks);
                    start.wait();
                    drop(blocks);
                });
            }
        });
        assert_eq!(
            arenas(),
            super::arenas_for(CORES) as usize,
            "the threads were given more arenas than berth allows on {CORES} cores"
        );
        // SAFETY: malloc_trim takes no pointer.
        unsafe { libc::malloc_trim(0) };
        let after = resident_bytes();
        let mib = |b: u64| b / (1024 * 1024);
        assert!(
            after < before + 16 * 1024 * 1024,
            "RSS {} MiB before, {} MiB after {THREADS} threads allocated and freed {} MiB each and \
             malloc_trim ran: the free tops of their arenas stayed resident",
            mib(before),
            mib(after),
            PER_THREAD / (1024 * 1024)
        );
    }
}
