//! The storage seam: every byte the store reads or writes goes through
//! [`Storage`] and [`StorageFile`], so tests can swap the operating system
//! for a fault-injecting layer (`fault::FaultStorage`, built for tests).
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

use bytes::Bytes;

use crate::append_buf::AppendBuf;
use crate::error::StoreError;

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
    /// Opens an existing file for reading only (the offline tools, which
    /// must work on a running broker's files and on read-only backups).
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        self.open(path)
    }
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory (a reshape discarding its staging copy).
    /// Storages that never hold one need not support it.
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("removing directory {} is not supported here", dir.display()),
        ))
    }
    /// Makes the directory's entries durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The handle the group writer appends through, for `file` (just
    /// created or renamed into place at `path`): writes at increasing
    /// offsets, past which the file holds zeros or nothing. The operating
    /// system's storage writes them past the page cache (`O_DIRECT`,
    /// see `direct.rs`) where the file system allows; the default is
    /// `file` itself.
    fn appends(&self, path: &Path, file: Arc<dyn StorageFile>) -> io::Result<Arc<dyn StorageFile>> {
        let _ = path;
        Ok(file)
    }
    /// `file`, a segment on disk when the store opened (at `path`), with
    /// its owned reads ([`StorageFile::read_owned`]) going past the page
    /// cache as a segment appended through [`Storage::appends`] is read:
    /// the operating system's storage opens the path again (or keeps
    /// `file` if it cannot), and an `O_DIRECT` handle at the first such
    /// read, where the file system allows it. The default is `file`
    /// itself.
    fn direct_reads(&self, path: &Path, file: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        let _ = path;
        file
    }
    /// Gives back memory the calling thread's appends keep for the next
    /// one (the writer calls it once its group is idle).
    fn release_idle_memory(&self) {}
}

/// One open file. Positional I/O only: there is no shared cursor.
#[allow(clippy::len_without_is_empty)] // a file's length is an I/O result, not a container's
pub trait StorageFile: Send + Sync {
    /// Fills `buf` from `offset`; `UnexpectedEof` if the file is shorter.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads `len` bytes from `offset` into memory of their own, which the
    /// caller slices without copying; `UnexpectedEof` if the file is
    /// shorter. A file appended past the page cache is read past it too.
    fn read_owned(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        read_into_new(self, offset, len)
    }
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes the bytes of `buf` at `offset`, as [`Self::write_all_at`]
    /// does. A file appended past the page cache writes them from where
    /// they lie when `buf` was placed for `offset` ([`AppendBuf::place`]),
    /// using the room around them, instead of copying them first.
    fn append(&self, buf: &mut AppendBuf, offset: u64) -> io::Result<()> {
        self.write_all_at(buf.bytes(), offset)
    }
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    /// Current size in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Writes `len` bytes from `offset` out to the device and waits for
    /// them (`sync_file_range`), without the file's metadata or a cache
    /// flush: a way to pace a large write, never a durability point.
    /// Storage that cannot does nothing.
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Asks the operating system to drop `len` bytes from `offset` out of
    /// its page cache (`posix_fadvise(DONTNEED)`): advice, which changes
    /// nothing a read returns, only what it costs. Dropped are clean pages
    /// only, so callers give it synced bytes. Storage without a page cache
    /// does nothing.
    fn drop_cache(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// The real thing: `std::fs` with `pread`/`pwrite`/`fdatasync`.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsStorage;

/// An operating system's file, and what of its I/O goes past the page
/// cache.
struct OsFile {
    file: File,
    #[cfg(target_os = "linux")]
    past_cache: PastCache,
}

/// What of a file's I/O goes past the page cache (`direct.rs`).
#[cfg(target_os = "linux")]
enum PastCache {
    /// Nothing.
    Nothing,
    /// Owned reads, through a direct handle opened at the first one
    /// (`None` once it could not be): a segment on disk when the store
    /// opened ([`Storage::direct_reads`]).
    Reads {
        path: std::path::PathBuf,
        reads: std::sync::OnceLock<Option<crate::direct::Reads>>,
    },
    /// Appends and owned reads: the segment the group writer appends to
    /// ([`Storage::appends`]).
    Appends(crate::direct::Appender),
}

impl OsFile {
    fn new(file: File) -> Self {
        Self {
            file,
            #[cfg(target_os = "linux")]
            past_cache: PastCache::Nothing,
        }
    }

    /// The direct handle owned reads go through, if any.
    #[cfg(target_os = "linux")]
    fn reads_past_cache(&self) -> Option<&crate::direct::Reads> {
        match &self.past_cache {
            PastCache::Nothing => None,
            PastCache::Reads { path, reads } => reads
                .get_or_init(|| {
                    crate::direct::open_reads(path).unwrap_or_else(|e| {
                        tracing::warn!(path = %path.display(), error = %e,
                            "cannot open the segment for direct reads: its reads go through \
                             the page cache");
                        None
                    })
                })
                .as_ref(),
            PastCache::Appends(a) => Some(a.reads()),
        }
    }

    /// The direct appends, if the file takes them.
    #[cfg(target_os = "linux")]
    fn appender(&self) -> Option<&crate::direct::Appender> {
        match &self.past_cache {
            PastCache::Appends(a) => Some(a),
            _ => None,
        }
    }
}

/// [`StorageFile::read_owned`] by `read_exact_at` into a new vector.
fn read_into_new(file: &(impl StorageFile + ?Sized), offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(Bytes::from(buf))
}

impl StorageFile for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn read_owned(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        #[cfg(target_os = "linux")]
        if let Some(reads) = self.reads_past_cache() {
            // `None` once the file system refused a direct read.
            if let Some(bytes) = reads.read(offset, len)? {
                return Ok(bytes);
            }
        }
        read_into_new(self, offset, len)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(a) = self.appender() {
            return a.write(&self.file, buf, offset);
        }
        self.file.write_all_at(buf, offset)
    }
    fn append(&self, buf: &mut AppendBuf, offset: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(a) = self.appender() {
            return a.write_placed(&self.file, buf, offset);
        }
        self.file.write_all_at(buf.bytes(), offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(a) = self.appender() {
            a.cut();
        }
        self.file.set_len(len)
    }
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let offset = libc::off64_t::try_from(offset).map_err(io::Error::other)?;
        let len = libc::off64_t::try_from(len).map_err(io::Error::other)?;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: the descriptor is open for as long as `self.file` lives;
        // sync_file_range reads no memory of ours.
        let rc = unsafe { libc::sync_file_range(self.file.as_raw_fd(), offset, len, flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn drop_cache(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
        // SAFETY: the descriptor is open for as long as `self.file` lives;
        // posix_fadvise reads no memory of ours.
        let rc = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        // posix_fadvise returns the error number instead of setting errno.
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
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
        Ok(Arc::new(OsFile::new(file)))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(OsFile::new(file)))
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(OsFile::new(File::open(path)?)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    #[cfg(target_os = "linux")]
    fn appends(&self, path: &Path, file: Arc<dyn StorageFile>) -> io::Result<Arc<dyn StorageFile>> {
        let Some(appends) = crate::direct::open(path)? else {
            return Ok(file);
        };
        Ok(Arc::new(OsFile {
            file: OpenOptions::new().read(true).write(true).open(path)?,
            past_cache: PastCache::Appends(appends),
        }))
    }
    #[cfg(target_os = "linux")]
    fn direct_reads(&self, path: &Path, file: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(reopened) => Arc::new(OsFile {
                file: reopened,
                past_cache: PastCache::Reads {
                    path: path.to_path_buf(),
                    reads: std::sync::OnceLock::new(),
                },
            }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e,
                    "cannot reopen the segment for direct reads: its reads go through the \
                     page cache");
                file
            }
        }
    }
    #[cfg(target_os = "linux")]
    fn release_idle_memory(&self) {
        crate::direct::release_staging();
    }
}

/// Writes `bytes` as `dir/name`, atomically and durably: into `dir/tmp_name`
/// (created afresh), fdatasync, rename over `name`, fsync of `dir`. After a
/// crash at any point, `name` holds either its previous contents (or is
/// absent) or all of `bytes`; a leftover `tmp_name` is the caller's to
/// remove. The one way the store writes whole files (manifest,
/// checkpoints).
pub fn write_atomically(
    storage: &dyn Storage,
    dir: &Path,
    tmp_name: &str,
    name: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let tmp = dir.join(tmp_name);
    let dst = dir.join(name);
    let f = storage
        .create(&tmp)
        .map_err(|e| StoreError::io("create", &tmp, e))?;
    f.write_all_at(bytes, 0)
        .map_err(|e| StoreError::io("write", &tmp, e))?;
    f.sync_data()
        .map_err(|e| StoreError::io("fdatasync", &tmp, e))?;
    storage
        .rename(&tmp, &dst)
        .map_err(|e| StoreError::io("rename", &tmp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| StoreError::io("fsync dir", dir, e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fault::FaultStorage;

    #[test]
    fn atomic_write_survives_power_loss_whole_and_a_failed_sync_changes_nothing() {
        let fs = FaultStorage::new(1);
        fs.set_tear_on_crash(true);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        write_atomically(&fs, dir, "f.tmp", "f", b"first").unwrap();
        fs.crash();
        fs.power_on();
        assert_eq!(fs.contents(&dir.join("f")).unwrap(), b"first");
        assert_eq!(fs.names(dir), vec!["f".to_owned()]);

        fs.fail_syncs_after(Some(0));
        let e = write_atomically(&fs, dir, "f.tmp", "f", b"second").unwrap_err();
        assert!(e.to_string().contains("fdatasync"), "{e}");
        fs.fail_syncs_after(None);
        fs.crash();
        fs.power_on();
        assert_eq!(fs.contents(&dir.join("f")).unwrap(), b"first");

        write_atomically(&fs, dir, "f.tmp", "f", b"third").unwrap();
        fs.crash();
        fs.power_on();
        assert_eq!(fs.contents(&dir.join("f")).unwrap(), b"third");
    }

    /// Pages of `path` in the page cache (`mincore` of a mapping), or
    /// `None` where the file system keeps no cache to drop (tmpfs).
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    pub(crate) fn pages_cached(path: &Path) -> Option<usize> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = std::ffi::CString::new(path.parent()?.as_os_str().as_bytes()).ok()?;
        // SAFETY: statfs writes only into `st`, a zeroed value of its type.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(dir.as_ptr(), &raw mut st) } != 0 || st.f_type == libc::TMPFS_MAGIC
        {
            return None;
        }
        let f = File::open(path).ok()?;
        let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
        // SAFETY: a private read-only mapping of `len` bytes of an open
        // file, unmapped below; mincore writes one byte per page into
        // `vec`, which holds that many.
        unsafe {
            let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).ok()?;
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            );
            if map == libc::MAP_FAILED {
                return None;
            }
            let mut vec = vec![0u8; len.div_ceil(page)];
            let rc = libc::mincore(map, len, vec.as_mut_ptr());
            libc::munmap(map, len);
            (rc == 0).then(|| vec.iter().filter(|b| *b & 1 == 1).count())
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn drop_cache_takes_synced_pages_out_of_the_page_cache() {
        let (_dir, dir) = berth_testdir::TestDir::new("drop-cache").and_path();
        let path = dir.join("0000000001.seg");
        let f = OsStorage.create(&path).unwrap();
        let bytes = vec![7u8; 4 << 20];
        f.write_all_at(&bytes, 0).unwrap();
        f.sync_data().unwrap();
        let Some(before) = pages_cached(&path) else {
            eprintln!(
                "{} keeps no page cache to drop (tmpfs): skipped",
                dir.display()
            );
            return;
        };
        assert!(before > 0, "a file just written is not in the page cache");
        f.drop_cache(0, bytes.len() as u64).unwrap();
        assert_eq!(pages_cached(&path), Some(0), "{before} pages before");
        // Advice only: the bytes read back the same.
        let mut back = vec![0u8; bytes.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == bytes);
    }

    #[test]
    fn appends_do_not_fill_the_page_cache() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-cache").and_path();
        let path = dir.join("0000000001.seg");
        let file = OsStorage.create(&path).unwrap();
        let f = OsStorage.appends(&path, file).unwrap();
        for i in 0..64u64 {
            f.write_all_at(&[9u8; 64 * 1024], i * 64 * 1024).unwrap();
        }
        f.sync_data().unwrap();
        let Some(cached) = pages_cached(&path) else {
            return;
        };
        // 4 MiB appended: 1,024 pages through the page cache.
        assert!(cached <= 1, "{cached} pages of the appends are cached");
    }

    /// A store on the operating system's files: `n` confirmed publishes
    /// of 4 KiB, the active segment's pages left in the page cache, and
    /// the messages recovered after a reopen.
    fn publish_and_reopen(direct_appends: bool, n: u64) -> (Option<usize>, usize) {
        use crate::{MsgId, QueueId, Store, StoreConfig, Ticket};
        let (_dir, dir) = berth_testdir::TestDir::new("direct-store").and_path();
        let mut cfg = StoreConfig::new(&dir);
        cfg.log_groups = 1;
        cfg.segment_prepare = false;
        cfg.direct_appends = direct_appends;
        let (store, _) = Store::open_with(cfg.clone(), Arc::new(OsStorage)).unwrap();
        for _ in 0..n {
            let m: MsgId = store.next_msg_id();
            let body = bytes::Bytes::from(vec![u8::try_from(m.0 % 251).unwrap(); 4096]);
            let (done, ticket) = Ticket::new();
            store.publish(m, &[QueueId(1)], body, Some(done));
            ticket.wait().unwrap();
        }
        let cached = pages_cached(&dir.join("group-0000").join("0000000001.seg"));
        drop(store);
        let (_store, rec) = Store::open_with(cfg, Arc::new(OsStorage)).unwrap();
        (cached, rec.queues.get(&QueueId(1)).map_or(0, Vec::len))
    }

    /// Publishes `n` messages of 4 KiB to one queue of a store on real
    /// files (with `reopen`: reopens the store and drops the segment from
    /// the page cache, which recovery read it through), reads them all
    /// back as a queue's read-ahead does, and returns the segment's pages
    /// then in the page cache.
    fn publish_and_read_back(direct_appends: bool, reopen: bool, n: u64) -> Option<usize> {
        use crate::{MsgId, QueueId, Store, StoreConfig, Ticket};
        let (_dir, dir) = berth_testdir::TestDir::new("direct-reads").and_path();
        let mut cfg = StoreConfig::new(&dir);
        cfg.log_groups = 1;
        cfg.segment_prepare = false;
        cfg.direct_appends = direct_appends;
        let (mut store, _) = Store::open_with(cfg.clone(), Arc::new(OsStorage)).unwrap();
        let body = |m: MsgId| vec![u8::try_from(m.0 % 251).unwrap(); 4096];
        let mut ids = Vec::new();
        for _ in 0..n {
            let m: MsgId = store.next_msg_id();
            let (done, ticket) = Ticket::new();
            store.publish(m, &[QueueId(1)], Bytes::from(body(m)), Some(done));
            ticket.wait().unwrap();
            ids.push(m);
        }
        let segment = dir.join("group-0000").join("0000000001.seg");
        if reopen {
            drop(store);
            store = Store::open_with(cfg, Arc::new(OsStorage)).unwrap().0;
            let f = OsStorage.open(&segment).unwrap();
            f.drop_cache(0, f.len().unwrap()).unwrap();
            assert_eq!(pages_cached(&segment), Some(0));
        }
        // In runs of 64, as a queue's read-ahead asks, and one at a time.
        for run in ids.chunks(64) {
            for (m, read) in run.iter().zip(store.read_many(QueueId(1), run)) {
                let payload = read.unwrap();
                assert!(payload.ends_with(&body(*m)), "message {}", m.0);
            }
        }
        for m in ids.iter().step_by(97) {
            assert!(store.read(QueueId(1), *m).unwrap().ends_with(&body(*m)));
        }
        pages_cached(&segment)
    }

    /// Reads of 1,000 × 4 KiB records leave at most `cached_max` pages in
    /// the cache by default (through the cache they leave them all), and
    /// more than 1,000 with `direct_appends = false`.
    fn reads_leave_the_page_cache_alone(reopen: bool, cached_max: usize) {
        let Some(cached) = publish_and_read_back(true, reopen, 1000) else {
            return;
        };
        assert!(
            cached <= cached_max,
            "{cached} pages of the store's reads are cached"
        );
        let cached = publish_and_read_back(false, reopen, 1000).unwrap();
        assert!(
            cached > 1000,
            "direct_appends = false reads through the cache"
        );
    }

    #[test]
    fn a_store_reads_what_it_appended_past_the_page_cache_past_it_too() {
        reads_leave_the_page_cache_alone(false, 2);
    }

    #[test]
    fn a_reopened_store_reads_the_segments_it_found_past_the_page_cache() {
        reads_leave_the_page_cache_alone(true, 0);
    }

    #[test]
    fn a_store_appends_past_the_page_cache_unless_told_not_to() {
        let (cached, recovered) = publish_and_reopen(true, 1000);
        assert_eq!(recovered, 1000);
        let Some(cached) = cached else { return };
        // 1,000 × 4 KiB records: more than 1,000 pages through the cache.
        assert!(
            cached <= 2,
            "{cached} pages of the store's appends are cached"
        );
        let (cached, recovered) = publish_and_reopen(false, 1000);
        assert_eq!(recovered, 1000);
        assert!(
            cached.unwrap() > 1000,
            "direct_appends = false appends through the cache"
        );
    }
}
