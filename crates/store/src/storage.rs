//! The storage seam: every byte the store reads or writes goes through
//! [`Storage`] and [`StorageFile`], so tests can swap the operating system
//! for a fault-injecting layer ([`crate::fault::FaultStorage`]).
//!
//! Invariants:
//! - The trait is the whole of the store's file I/O: no other module calls
//!   `std::fs`. (Grep for `std::fs` finds only [`OsStorage`].)
//! - `sync_data` returns only after the file's written bytes (and the size
//!   needed to read them) are on stable storage, or returns the error.
//! - `sync_dir` makes creations, renames and removals in that directory
//!   durable; the store calls it after each of them it relies on.
//! - A handle stays readable after its file was removed or renamed (POSIX
//!   semantics), so a reader holding a segment handle never races deletion.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Directory-level operations.
pub trait Storage: Send + Sync + 'static {
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the entries of `dir` (files only matter to the store).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `path` (truncating an existing file) for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// One open file. Positional I/O only: there is no shared cursor.
#[allow(clippy::len_without_is_empty)] // a file's length is an I/O result, not a container's
pub trait StorageFile: Send + Sync {
    /// Fills `buf` from `offset`; `UnexpectedEof` if the file is shorter.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    /// Current size in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// The real thing: `std::fs` with `pread`/`pwrite`/`fdatasync`.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsStorage;

struct OsFile(File);

impl StorageFile for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Storage for OsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(OsFile(file)))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(OsFile(file)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
