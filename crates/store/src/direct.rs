//! Appends past the page cache: the group writer's active segment, opened
//! a second time with `O_DIRECT`, so that a batch goes from one reused
//! buffer of ours to the device instead of being copied into freshly
//! allocated page-cache pages (on a VM with free-page reporting each such
//! page also costs the host a fault) and written back from there by the
//! fdatasync.
//!
//! Invariants:
//! - A direct write covers whole aligned blocks. One that starts inside a
//!   block writes that block's earlier bytes again exactly as they are on
//!   disk: the last append's (kept here), or read back when the write
//!   does not continue it (the first write through this handle, or after
//!   a cut or a failed write). Bytes already on disk are rewritten with
//!   their own values, so a torn write of that block leaves them intact.
//! - The bytes after an append, up to the end of its block, are written
//!   as zeros. That is the contract of [`Storage::appends`]: past what is
//!   appended the file holds zeros (a prepared segment) or nothing (a
//!   growing one). A growing file's size may then end on a block boundary
//!   past the last append, in zeros, until the writer cuts it at its
//!   records (`set_len`), as it does when it seals the segment.
//! - Reads, size, cuts, fdatasync and cache advice go through the
//!   ordinary handle on the same file; the kernel keeps the page cache
//!   coherent with direct writes.
//! - fdatasync is still what makes an append durable: a direct write
//!   leaves the device's volatile cache and a grown file's size to it.
//! - A file system that refuses a direct write's alignment (`EINVAL`)
//!   gets this append and every later one through the ordinary handle.
//!
//! [`Storage::appends`]: crate::storage::Storage::appends

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::storage::StorageFile;

/// The alignment of a direct write's offset, length and memory: a page,
/// which covers devices of 512-byte and 4 KiB logical blocks.
const BLOCK: usize = 4096;

/// Opens `path` for direct appends beside its ordinary handle `file`.
/// `None` where the file system refuses `O_DIRECT` (tmpfs, some network
/// file systems): the caller appends through `file`.
pub(crate) fn open(path: &Path, file: Arc<dyn StorageFile>) -> io::Result<Option<DirectAppends>> {
    open_aligned(path, file, BLOCK)
}

fn open_aligned(
    path: &Path,
    file: Arc<dyn StorageFile>,
    block: usize,
) -> io::Result<Option<DirectAppends>> {
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(direct) => Ok(Some(DirectAppends {
            file,
            path: path.to_path_buf(),
            block,
            tail: Mutex::new(Tail {
                direct: Some(direct),
                end: None,
                bytes: Vec::new(),
            }),
        })),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) struct DirectAppends {
    /// The ordinary handle: reads, size, cuts, fdatasync.
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    block: usize,
    tail: Mutex<Tail>,
}

struct Tail {
    /// The `O_DIRECT` handle; `None` once the file system refused one.
    direct: Option<File>,
    /// Where the last append ended; `None` when unknown (nothing appended
    /// through this handle yet, a failed write, or a cut since).
    end: Option<u64>,
    /// The bytes of the last append's partial block.
    bytes: Vec<u8>,
}

thread_local! {
    /// Staging memory of the thread that appends (a group's writer): it
    /// grows to a batch, is reused for every segment the thread writes,
    /// and is given back by [`release_staging`] once the thread is idle.
    static STAGING: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The first `block`-aligned index of `mem`, after making room there for
/// `len` bytes.
fn staged(mem: &mut Vec<u8>, block: usize, len: usize) -> usize {
    if mem.len() < mem.as_ptr().align_offset(block) + len {
        *mem = vec![0u8; len + block];
    }
    mem.as_ptr().align_offset(block)
}

impl DirectAppends {
    /// Writes `buf` at `offset` as whole blocks from `direct`.
    fn append(&self, t: &mut Tail, buf: &[u8], offset: u64) -> io::Result<()> {
        let block = self.block as u64;
        let block_at = offset - offset % block;
        let head = usize::try_from(offset - block_at).expect("less than a block");
        let total = head + buf.len();
        let padded = total.div_ceil(self.block) * self.block;
        let direct = t.direct.as_ref().expect("checked by the caller");
        STAGING.with_borrow_mut(|mem| {
            let start = staged(mem, self.block, padded);
            if t.end == Some(offset) {
                mem[start..start + head].copy_from_slice(&t.bytes[..head]);
            } else if head > 0 {
                self.file
                    .read_exact_at(&mut mem[start..start + head], block_at)?;
            }
            mem[start + head..start + total].copy_from_slice(buf);
            mem[start + total..start + padded].fill(0);
            direct.write_all_at(&mem[start..start + padded], block_at)?;
            let end = offset + buf.len() as u64;
            let end_block = end - end % block;
            let keep = usize::try_from(end - end_block).expect("less than a block");
            let from = start + usize::try_from(end_block - block_at).expect("in the staged run");
            t.bytes.clear();
            t.bytes.extend_from_slice(&mem[from..from + keep]);
            t.end = Some(end);
            Ok(())
        })
    }
}

impl StorageFile for DirectAppends {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut t = self.tail.lock();
        if t.direct.is_none() {
            return self.file.write_all_at(buf, offset);
        }
        match self.append(&mut t, buf, offset) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "the file system refused a direct write: this segment's appends go \
                     through the page cache");
                *t = Tail {
                    direct: None,
                    end: None,
                    bytes: Vec::new(),
                };
                self.file.write_all_at(buf, offset)
            }
            Err(e) => {
                t.end = None;
                Err(e)
            }
        }
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut t = self.tail.lock();
        t.end = None;
        t.bytes = Vec::new();
        self.file.set_len(len)
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.file.write_back(offset, len)
    }
    fn drop_cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.file.drop_cache(offset, len)
    }
}

/// Gives back the calling thread's staging memory (see [`STAGING`]).
pub(crate) fn release_staging() {
    STAGING.with_borrow_mut(|mem| *mem = Vec::new());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{OsStorage, Storage};
    use proptest::prelude::*;

    /// A direct appender on a new file in `dir`, or `None` (the test is
    /// skipped) where the file system refuses `O_DIRECT`.
    fn appender(dir: &Path, block: usize) -> Option<(PathBuf, DirectAppends)> {
        let path = dir.join("0000000001.seg");
        let file = OsStorage.create(&path).unwrap();
        match open_aligned(&path, file, block).unwrap() {
            Some(d) => Some((path, d)),
            None => {
                eprintln!("{} refuses O_DIRECT (tmpfs): skipped", dir.display());
                None
            }
        }
    }

    fn contents(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    #[test]
    fn appends_leave_the_bytes_written_and_zeros_to_the_end_of_their_block() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-appends").and_path();
        let Some((path, f)) = appender(&dir, BLOCK) else {
            return;
        };
        let mut model = Vec::new();
        for (i, len) in [100usize, 5000, 1, 4095, 8192, 3].into_iter().enumerate() {
            let bytes = vec![u8::try_from(i + 1).unwrap(); len];
            f.write_all_at(&bytes, model.len() as u64).unwrap();
            model.extend_from_slice(&bytes);
            let on_disk = contents(&path);
            assert_eq!(on_disk.len(), model.len().div_ceil(BLOCK) * BLOCK);
            assert!(on_disk[..model.len()] == model[..], "after append {i}");
            assert!(on_disk[model.len()..].iter().all(|b| *b == 0));
            let mut back = vec![0u8; model.len()];
            f.read_exact_at(&mut back, 0).unwrap();
            assert!(back == model, "read through the handle after append {i}");
        }
        f.sync_data().unwrap();
        f.set_len(model.len() as u64).unwrap();
        assert!(contents(&path) == model);
    }

    #[test]
    fn an_append_after_a_cut_reads_the_head_of_its_block_back() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-cut").and_path();
        let Some((path, f)) = appender(&dir, BLOCK) else {
            return;
        };
        f.write_all_at(&[1u8; 6000], 0).unwrap();
        f.set_len(5000).unwrap();
        // What the tail held (bytes 5000..6000) is cut; what is appended
        // next continues at 5000, the head of its block read from disk.
        release_staging();
        f.write_all_at(&[2u8; 10], 5000).unwrap();
        let on_disk = contents(&path);
        assert!(on_disk[..5000].iter().all(|b| *b == 1));
        assert!(on_disk[5000..5010].iter().all(|b| *b == 2));
        assert!(on_disk[5010..].iter().all(|b| *b == 0));
    }

    #[test]
    fn idle_memory_is_given_back_and_the_next_append_continues() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-idle").and_path();
        let Some((path, f)) = appender(&dir, BLOCK) else {
            return;
        };
        f.write_all_at(&[3u8; 1 << 20], 0).unwrap();
        f.write_all_at(&[4u8; 300], 1 << 20).unwrap();
        assert!(STAGING.with_borrow(Vec::len) > 1 << 20);
        release_staging();
        assert_eq!(STAGING.with_borrow(Vec::len), 0);
        f.write_all_at(&[5u8; 300], (1 << 20) + 300).unwrap();
        let on_disk = contents(&path);
        let at = 1 << 20;
        assert!(on_disk[..at].iter().all(|b| *b == 3));
        assert!(on_disk[at..at + 300].iter().all(|b| *b == 4));
        assert!(on_disk[at + 300..at + 600].iter().all(|b| *b == 5));
    }

    #[test]
    fn a_refused_alignment_falls_back_to_the_page_cache_and_loses_nothing() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-refused").and_path();
        // Blocks of 2 bytes: no device takes such a direct write.
        let Some((path, f)) = appender(&dir, 2) else {
            return;
        };
        f.write_all_at(b"hello", 0).unwrap();
        assert!(
            f.tail.lock().direct.is_none(),
            "the direct write was refused"
        );
        f.write_all_at(b" world", 5).unwrap();
        assert_eq!(contents(&path), b"hello world");
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
        let Some(cached) = crate::storage::tests::pages_cached(&path) else {
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
        let cached =
            crate::storage::tests::pages_cached(&dir.join("group-0000").join("0000000001.seg"));
        drop(store);
        let (_store, rec) = Store::open_with(cfg, Arc::new(OsStorage)).unwrap();
        (cached, rec.queues.get(&QueueId(1)).map_or(0, Vec::len))
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Any run of appends, cuts and idle releases leaves the file as
        /// the same run leaves a plain one, up to the zeros of the last
        /// block.
        #[test]
        fn appends_match_plain_writes(
            steps in proptest::collection::vec((0usize..20_000, 0u8..10), 1..24),
        ) {
            let (_dir, dir) = berth_testdir::TestDir::new("direct-prop").and_path();
            let Some((path, f)) = appender(&dir, BLOCK) else {
                return Ok(());
            };
            let mut model: Vec<u8> = Vec::new();
            for (i, (len, what)) in steps.into_iter().enumerate() {
                match what {
                    0 => {
                        let cut = model.len() / 2;
                        model.truncate(cut);
                        f.set_len(cut as u64).unwrap();
                    }
                    1 => release_staging(),
                    _ => {
                        let bytes = vec![u8::try_from(i % 250 + 1).unwrap(); len];
                        f.write_all_at(&bytes, model.len() as u64).unwrap();
                        model.extend_from_slice(&bytes);
                    }
                }
                let on_disk = contents(&path);
                prop_assert!(on_disk.len() >= model.len());
                prop_assert!(on_disk[..model.len()] == model[..], "step {}", i);
                prop_assert!(on_disk[model.len()..].iter().all(|b| *b == 0));
            }
        }
    }
}
