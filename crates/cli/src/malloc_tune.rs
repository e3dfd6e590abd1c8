//! Fixes glibc malloc's mmap threshold before the broker starts, so the
//! large tables the broker grows (the store's message index, a queue's or
//! a delayed exchange's index) go back to the kernel when they are
//! replaced.
//!
//! glibc starts with a 128 KiB threshold and *raises* it (up to 32 MiB)
//! each time an mmapped block is freed. The first hash-table resize of a
//! growing index frees one, so every later table up to 32 MiB comes from
//! the heap instead, and the old tables left behind by each doubling stay
//! resident as free heap. Measured with 1,000,000 pending delayed messages
//! (docs/BENCHMARKS.md, "Pending delayed messages"): +156.6 MiB with the
//! dynamic threshold, +119.6 MiB with a fixed one, the same code otherwise.
//!
//! An operator's own `MALLOC_MMAP_THRESHOLD_` (read by glibc at start-up)
//! wins: then nothing is changed. Other C libraries: nothing is done.

/// The threshold berth fixes: glibc's own starting value.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Fixes the threshold unless the environment sets it. Call before any
/// thread starts (mallopt is not meant to race with allocations).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn fix_mmap_threshold() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return;
    }
    // SAFETY: mallopt only sets allocator parameters; it is called once,
    // from main, before the runtime's threads exist. Setting
    // M_MMAP_THRESHOLD also turns glibc's dynamic adjustment off.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    if ok != 1 {
        // Not fatal: memory use is then higher, as before this existed.
        eprintln!("berth: mallopt(M_MMAP_THRESHOLD) failed; large tables may stay resident after a resize");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn fix_mmap_threshold() {}
