//! Work a batch's completions leave for after the batch.
//!
//! A group's writer runs the completions of a batch one after another. A
//! completion that would do the same work for each request of a batch (a
//! connection writing its publisher confirms to its socket: one write per
//! connection per batch, not one per message) leaves that work here, once,
//! and the writer runs it after the batch's last completion.
//!
//! Invariants:
//! - Work left here always runs, exactly once: after the batch being
//!   completed on this thread, or at once when no batch is (a completion
//!   run by anyone else, such as a request refused before it reached a
//!   writer).
//! - It runs on the thread that completed the batch, in the order it was
//!   left, also when a completion of the batch panicked.

use std::cell::RefCell;

type Deferred = Box<dyn FnOnce()>;

/// The batch being completed on this thread, if `open`.
struct Batch {
    open: bool,
    /// Requests queued for this thread behind the batch it completes.
    waiting: usize,
    /// Kept between batches so that leaving work allocates only its box.
    work: Vec<Deferred>,
}

thread_local! {
    static BATCH: RefCell<Batch> = const {
        RefCell::new(Batch {
            open: false,
            waiting: 0,
            work: Vec::new(),
        })
    };
}

/// Runs `f` once the completions being run on this thread are done, or at
/// once if this thread is not completing a batch.
pub fn after_completions(f: impl FnOnce() + 'static) {
    let f: Deferred = Box::new(f);
    let now = BATCH.with_borrow_mut(|b| {
        if b.open {
            b.work.push(f);
            None
        } else {
            Some(f)
        }
    });
    if let Some(f) = now {
        f();
    }
}

/// How many requests wait for the thread completing the current batch (0
/// outside a batch): work left for after the batch delays them, and with
/// many waiting is better handed to a thread that is free.
pub fn waiting() -> usize {
    BATCH.with_borrow(|b| b.waiting)
}

/// Runs `completions` (a batch's), then the work they left; `waiting`
/// requests are queued for this thread behind the batch. A batch inside
/// another is part of the outer one. A group's writer runs each batch's
/// completions in one; any other thread that completes requests in
/// batches may do the same.
pub fn completing<R>(waiting: usize, completions: impl FnOnce() -> R) -> R {
    let opened = BATCH.with_borrow_mut(|b| {
        let opened = !std::mem::replace(&mut b.open, true);
        if opened {
            b.waiting = waiting;
        }
        opened
    });
    // Not `then_some`: that would make (and drop, running the work) the
    // guard of an inner batch too.
    let _after = if opened { Some(RunLeftWork) } else { None };
    completions()
}

/// Closes the batch and runs its left work when dropped (also while a
/// completion's panic unwinds).
struct RunLeftWork;

impl Drop for RunLeftWork {
    fn drop(&mut self) {
        let mut work = BATCH.with_borrow_mut(|b| {
            b.open = false;
            std::mem::take(&mut b.work)
        });
        // Closed first: work that leaves more work runs it at once.
        for f in work.drain(..) {
            f();
        }
        BATCH.with_borrow_mut(|b| {
            // Read by the left work too (`waiting`).
            b.waiting = 0;
            if b.work.is_empty() {
                b.work = work;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    type Log = Rc<RefCell<Vec<&'static str>>>;

    /// A log, and a function (shared) that appends to it.
    fn log() -> (Log, Rc<dyn Fn(&'static str)>) {
        let log: Log = Rc::default();
        let l = Rc::clone(&log);
        (log, Rc::new(move |s| l.borrow_mut().push(s)))
    }

    #[test]
    fn left_work_runs_once_after_the_batch_in_order() {
        let (log, push) = log();
        completing(0, || {
            for name in ["first", "second"] {
                let p = Rc::clone(&push);
                after_completions(move || p("left"));
                push(name);
                let p = Rc::clone(&push);
                after_completions(move || p(if name == "first" { "a" } else { "b" }));
            }
        });
        assert_eq!(*log.borrow(), ["first", "second", "left", "a", "left", "b"]);
        completing(0, || {});
        assert_eq!(log.borrow().len(), 6, "nothing runs twice");
    }

    #[test]
    fn outside_a_batch_work_runs_at_once() {
        let (log, push) = log();
        after_completions(move || push("now"));
        assert_eq!(*log.borrow(), ["now"]);
    }

    #[test]
    fn a_batch_inside_a_batch_is_part_of_it() {
        let (log, push) = log();
        completing(0, || {
            completing(0, || {
                let p = Rc::clone(&push);
                after_completions(move || p("left"));
            });
            push("inner done");
        });
        assert_eq!(*log.borrow(), ["inner done", "left"]);
    }

    #[test]
    fn work_left_by_left_work_runs_at_once() {
        let (log, push) = log();
        let p = Rc::clone(&push);
        completing(0, move || {
            after_completions(move || {
                let q = Rc::clone(&p);
                after_completions(move || q("nested"));
                p("outer");
            });
        });
        assert_eq!(*log.borrow(), ["nested", "outer"]);
    }

    #[test]
    fn left_work_runs_when_a_completion_panics() {
        let (log, push) = log();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            completing(0, || {
                after_completions(move || push("left"));
                panic!("a completion failed");
            })
        }));
        assert!(caught.is_err());
        assert_eq!(*log.borrow(), ["left"]);
        // The thread is not left inside a batch.
        let (log, push) = self::log();
        after_completions(move || push("now"));
        assert_eq!(*log.borrow(), ["now"]);
    }

    #[test]
    fn a_batch_says_how_many_requests_wait_for_its_thread() {
        assert_eq!(waiting(), 0, "outside a batch");
        completing(7, || {
            assert_eq!(waiting(), 7);
            after_completions(|| assert_eq!(waiting(), 7, "the left work sees it too"));
        });
        completing(0, || assert_eq!(waiting(), 0));
        assert_eq!(waiting(), 0);
    }
}
