//! The machine's price of a sleep: one thread waking another that sleeps
//! (a futex, as a broker's threads hand work and completions to each
//! other), then sleeping itself until woken back.
//!
//! Two placements are timed, each with both threads pinned, because the
//! scheduler's own choice flips between them from one run to the next (an
//! unpinned probe measured 3 µs wall in one run and 33 µs in the next):
//! - *within* one CPU: the woken thread runs once the waker sleeps;
//! - *across* two CPUs: the woken thread's CPU is idle, and on a VM whose
//!   idle vCPUs halt, waking it is a wake-up of that vCPU by the host.
//!
//! For each: the wall time of a hand-off (the median of [`SAMPLES`] round
//! trips, halved) and the CPU both threads spent per hand-off (their
//! thread CPU clocks over all of them). A message whose path sleeps and
//! wakes k times costs between k hand-offs within and k across of CPU,
//! whatever the work between them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use crate::cpus;
use crate::stats::percentile_sorted;
use crate::BenchError;

/// Hand-off round trips timed per placement.
pub const SAMPLES: usize = 2000;

/// What one hand-off costs, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Handoff {
    /// Wall time (median).
    pub wall_s: f64,
    /// CPU time of both threads.
    pub cpu_s: f64,
}

/// A hand-off within one CPU, and across two where the process may use two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Handoffs {
    pub within: Handoff,
    pub across: Option<Handoff>,
}

/// Times both placements on the CPUs this process may use.
pub fn measure() -> Result<Handoffs, BenchError> {
    let cpus = cpus::allowed();
    let first = *cpus
        .first()
        .ok_or_else(|| BenchError::Task("no CPU this process may run on".into()))?;
    let within = timed(first, first)?;
    let across = match cpus.get(1) {
        Some(&second) => Some(timed(first, second)?),
        None => None,
    };
    Ok(Handoffs { within, across })
}

/// Two threads, pinned to `cpu_a` and `cpu_b`, waking each other in turn.
fn timed(cpu_a: usize, cpu_b: usize) -> Result<Handoff, BenchError> {
    let start = |name: &str| {
        std::thread::Builder::new()
            .name(name.into())
            .stack_size(64 * 1024)
    };
    let spawn_error = |e| BenchError::Io {
        context: "start a hand-off thread".into(),
        source: e,
    };
    // Whose turn it is: true for b's.
    let b_turn = Arc::new(AtomicBool::new(false));
    let (a_tx, a_rx) = mpsc::channel::<std::thread::Thread>();
    let b = {
        let b_turn = Arc::clone(&b_turn);
        start("handoff-b")
            .spawn(move || -> Result<f64, String> {
                cpus::pin(cpu_b)?;
                let a = a_rx.recv().map_err(|_| "thread a did not start")?;
                let cpu0 = cpus::thread_cpu_s();
                for _ in 0..SAMPLES {
                    while !b_turn.load(Ordering::Acquire) {
                        std::thread::park();
                    }
                    b_turn.store(false, Ordering::Release);
                    a.unpark();
                }
                Ok(cpus::thread_cpu_s() - cpu0)
            })
            .map_err(spawn_error)?
    };
    let b_thread = b.thread().clone();
    let a = start("handoff-a")
        .spawn(move || -> Result<(Vec<f64>, f64), String> {
            cpus::pin(cpu_a)?;
            a_tx.send(std::thread::current())
                .map_err(|_| "thread b is gone")?;
            let cpu0 = cpus::thread_cpu_s();
            let mut took = Vec::with_capacity(SAMPLES);
            for _ in 0..SAMPLES {
                let t0 = Instant::now();
                b_turn.store(true, Ordering::Release);
                b_thread.unpark();
                while b_turn.load(Ordering::Acquire) {
                    std::thread::park();
                }
                // A round trip is two hand-offs.
                took.push(t0.elapsed().as_secs_f64() / 2.0);
            }
            Ok((took, cpus::thread_cpu_s() - cpu0))
        })
        .map_err(spawn_error)?;
    let panicked = |_| BenchError::Task("a hand-off thread panicked".into());
    let a = a.join().map_err(panicked)?;
    let b = b.join().map_err(panicked)?;
    let ((mut took, a_cpu), b_cpu) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return Err(BenchError::Task(format!(
                "hand-off between CPUs {cpu_a} and {cpu_b}: {e}"
            )))
        }
    };
    took.sort_by(f64::total_cmp);
    let handoffs = (2 * SAMPLES) as f64;
    Ok(Handoff {
        wall_s: percentile_sorted(&took, 0.5),
        cpu_s: (a_cpu + b_cpu) / handoffs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_placements_are_timed_on_the_cpus_allowed() {
        let cpus = cpus::allowed();
        assert!(!cpus.is_empty(), "this process runs somewhere");
        let h = measure().expect("measure");
        assert!(h.within.wall_s > 0.0 && h.within.cpu_s > 0.0, "{h:?}");
        assert_eq!(h.across.is_some(), cpus.len() > 1, "{h:?} on {cpus:?}");
        if let Some(across) = h.across {
            assert!(across.wall_s > 0.0 && across.cpu_s > 0.0, "{h:?}");
        }
    }
}
