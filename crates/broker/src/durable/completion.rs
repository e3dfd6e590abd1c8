//! Completions: what runs once a journal write is durable or failed, and
//! how one completion is shared by several writes or one write's result
//! reaches several waiters.
//!
//! Invariants:
//! - Every completion runs exactly once, with `Ok` only if every write it
//!   stands for is durable.

use std::sync::Arc;

use parking_lot::Mutex;

use super::JournalError;

/// Called once a journal write is durable (per the store's sync mode), or
/// failed. Runs on the journal's completion thread (a store group's
/// writer): keep it short, and never call back into the journal from it.
pub type Done = Box<dyn FnOnce(Result<(), JournalError>) + Send + 'static>;

/// Runs `done`, if there is one, with `result`: how a journal reports a
/// write it finished (or refused) at once.
pub fn complete(done: Option<Done>, result: Result<(), JournalError>) {
    if let Some(d) = done {
        d(result);
    }
}

/// One completion that runs each of `dones` with the same result (`None`
/// if there are none).
pub fn all_of(dones: Vec<Done>) -> Option<Done> {
    if dones.is_empty() {
        return None;
    }
    Some(Box::new(move |r: Result<(), JournalError>| {
        for d in dones {
            d(r.clone());
        }
    }))
}

/// Splits `done` into `n` completions: it runs once all of them have run,
/// with the first error any of them got.
pub fn split_done(done: Done, n: usize) -> Vec<Done> {
    assert!(n > 0, "a completion splits into at least one part");
    if n == 1 {
        // Nothing to count down: the completion is its own only part.
        return vec![done];
    }
    struct Countdown {
        left: usize,
        result: Result<(), JournalError>,
        done: Option<Done>,
    }
    let shared = Arc::new(Mutex::new(Countdown {
        left: n,
        result: Ok(()),
        done: Some(done),
    }));
    (0..n)
        .map(|_| {
            let shared = Arc::clone(&shared);
            Box::new(move |r: Result<(), JournalError>| {
                let fire = {
                    let mut c = shared.lock();
                    if c.result.is_ok() {
                        c.result = r;
                    }
                    c.left -= 1;
                    (c.left == 0).then(|| (c.done.take(), c.result.clone()))
                };
                if let Some((Some(d), r)) = fire {
                    d(r);
                }
            }) as Done
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_completion_runs_once_after_every_part_with_the_first_error() {
        let got: Arc<Mutex<Vec<Result<(), JournalError>>>> = Arc::default();
        let g = Arc::clone(&got);
        let mut parts = split_done(Box::new(move |r| g.lock().push(r)), 3).into_iter();
        parts.next().unwrap()(Ok(()));
        parts.next().unwrap()(Err(JournalError::new("disk full")));
        assert!(got.lock().is_empty(), "waits for the last part");
        parts.next().unwrap()(Ok(()));
        let got = got.lock();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().to_string(), "disk full");
    }
}
