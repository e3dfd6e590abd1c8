//! A storage for tests that watch or change how files are used: every
//! call goes to an inner storage, and the files it opens pass their reads,
//! sizes and appends through a test's [`FileHooks`] (count the bytes read,
//! slow the reads down, report a stale size, see whether appends were
//! placed). A test writes the one hook it needs instead of a delegating
//! `Storage` and `StorageFile` of its own.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::append_buf::{AppendBuf, BLOCK};
use crate::storage::{Storage, StorageFile};

/// What a test does to the files of a [`Hooked`] storage. Each method
/// defaults to leaving the file alone.
pub trait FileHooks: Send + Sync + 'static {
    /// Called before each read of `len` bytes from the file at `path`.
    fn before_read(&self, path: &Path, len: usize) {
        let _ = (path, len);
    }
    /// The size reported for the file at `path`, whose size is `len`.
    fn len(&self, path: &Path, len: u64) -> u64 {
        let _ = path;
        len
    }
    /// Called before each [`StorageFile::append`] to the file at `path`,
    /// with whether its buffer was placed for the offset it goes to
    /// ([`AppendBuf::place`]).
    fn before_append(&self, path: &Path, placed: bool) {
        let _ = (path, placed);
    }
}

/// `inner`, with the files it creates and opens hooked by `hooks`.
pub struct Hooked<S, H> {
    pub inner: S,
    pub hooks: Arc<H>,
}

impl<S, H: FileHooks> Hooked<S, H> {
    fn hook(&self, path: &Path, inner: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        Arc::new(HookedFile {
            inner,
            path: path.to_path_buf(),
            hooks: Arc::clone(&self.hooks),
        })
    }
}

struct HookedFile<H> {
    inner: Arc<dyn StorageFile>,
    path: PathBuf,
    hooks: Arc<H>,
}

impl<H: FileHooks> StorageFile for HookedFile<H> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.hooks.before_read(&self.path, buf.len());
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn append(&self, buf: &mut AppendBuf, offset: u64) -> io::Result<()> {
        self.hooks
            .before_append(&self.path, buf.is_placed_for(offset, BLOCK));
        self.inner.append(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.hooks.len(&self.path, self.inner.len()?))
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_back(offset, len)
    }
    fn drop_cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.drop_cache(offset, len)
    }
}

impl<S: Storage, H: FileHooks> Storage for Hooked<S, H> {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.hook(path, self.inner.create(path)?))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.hook(path, self.inner.open(path)?))
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.hook(path, self.inner.open_read(path)?))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.remove_dir(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}
