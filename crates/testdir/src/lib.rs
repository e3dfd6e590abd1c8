//! A directory of one test's own under the system's temp dir, removed
//! when its guard drops: when the test ends, passed or failed (a panic
//! drops the guard as it unwinds), so test runs leave nothing in `/tmp`.
//!
//! To look at what a failed test left, run it with
//! `BERTH_KEEP_TEST_DIRS=1`: the directory of a test that fails (a guard
//! dropped while its thread panics) is then kept and its path printed.
//! A test that passes removes its directory either way.
//!
//! Invariants:
//! - No two guards name the same directory, within a process (a counter)
//!   or across processes (the pid); a directory left by an earlier
//!   process with the same pid is removed first.
//! - Once the guard is dropped the directory is gone, unless a failed
//!   test's was kept on request; a removal that fails is reported on
//!   stderr (a test must not fail for it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Set to `1` to keep the directories of failed tests.
pub const KEEP_ENV: &str = "BERTH_KEEP_TEST_DIRS";

/// A test's own directory, removed on drop (see the crate's doc).
#[derive(Debug)]
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// Creates an empty directory `berth-{name}-{pid}-{n}`.
    pub fn new(name: &str) -> TestDir {
        let dir = TestDir::unmade(name);
        std::fs::create_dir_all(&dir.path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.path.display()));
        dir
    }

    /// As [`TestDir::new`], but the directory is not made: for code that
    /// must find no directory there (a store creates its own). Whatever
    /// is made at the path is removed on drop all the same.
    pub fn unmade(name: &str) -> TestDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("berth-{name}-{}-{n}", std::process::id()));
        remove(&path);
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The guard and a copy of its path, for code that wants a `PathBuf`:
    /// `let (_dir, path) = TestDir::new("x").and_path();` (the guard must
    /// live as long as the path is used).
    pub fn and_path(self) -> (TestDir, PathBuf) {
        let path = self.path.clone();
        (self, path)
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() && keep_requested() {
            eprintln!(
                "{KEEP_ENV}: kept the failed test's directory {}",
                self.path.display()
            );
            return;
        }
        remove(&self.path);
    }
}

fn keep_requested() -> bool {
    std::env::var(KEEP_ENV).is_ok_and(|v| v == "1")
}

/// Removes `path` and everything below it; a path that is not there is
/// no error, any other failure is printed.
fn remove(path: &Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("could not remove {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_dir_is_gone_with_what_it_held() {
        let d = TestDir::new("testdir-drop");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/f"), b"x").unwrap();
        let path = d.to_path_buf();
        drop(d);
        assert!(!path.exists(), "{} is left", path.display());
    }

    #[test]
    fn a_dir_is_removed_when_its_test_panics() {
        let path = std::thread::spawn(|| {
            let d = TestDir::new("testdir-panic");
            let path = d.to_path_buf();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _d = d;
                panic!("a failing test");
            }))
            .expect_err("it panicked");
            path
        })
        .join()
        .unwrap();
        if !keep_requested() {
            assert!(!path.exists(), "{} is left", path.display());
        }
    }

    #[test]
    fn two_dirs_of_one_name_differ_and_unmade_is_not_made() {
        let (a, b) = (TestDir::new("testdir-two"), TestDir::unmade("testdir-two"));
        assert_ne!(a.path(), b.path());
        assert!(a.is_dir());
        assert!(!b.exists());
    }
}
