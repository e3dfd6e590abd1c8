//! The CPUs this process may run on, pinning a thread to one, and a
//! thread's own CPU clock: the machine limits are timed with their threads
//! placed on purpose, not where the scheduler happens to put them, and
//! priced in the CPU they cost.

/// The CPUs this process may run on, in order.
#[allow(unsafe_code)]
pub fn allowed() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    let max = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    // SAFETY: `c` is below CPU_SETSIZE, the set's size.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
#[allow(unsafe_code)]
pub fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= usize::try_from(libc::CPU_SETSIZE).unwrap_or(0) {
        return Err(format!("CPU {cpu} is past the largest CPU set"));
    }
    // SAFETY: `cpu` is below CPU_SETSIZE, the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "could not pin a thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// CPU seconds the calling thread has used (its own clock: /proc's ticks
/// are too coarse for a probe of a fifth of a second).
#[allow(unsafe_code)]
pub fn thread_cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill; the clock id
    // is a constant every Linux has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(
        rc, 0,
        "CLOCK_THREAD_CPUTIME_ID is always available on Linux"
    );
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
