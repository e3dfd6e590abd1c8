//! Appends past the page cache: the group writer's active segment, opened
//! a second time with `O_DIRECT`, so that a batch goes from one reused
//! buffer of ours to the device instead of being copied into freshly
//! allocated page-cache pages (on a VM with free-page reporting each such
//! page also costs the host a fault) and written back from there by the
//! fdatasync. Messages read back from such a segment (a queue's paged-out
//! backlog) come past the page cache too, read by the device straight
//! into memory that becomes their bodies: what was appended this way is
//! not in the cache, and reading it through the cache would allocate the
//! pages the appends avoided, then copy out of them.
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
//! - Size, cuts, fdatasync, cache advice and every read but
//!   [`Reads::read`] go through the ordinary handle on the same file
//!   (`storage.rs` pairs the two); the kernel keeps the page cache
//!   coherent with direct writes and reads.
//! - A direct read covers whole aligned blocks and returns only the bytes
//!   asked for, which were appended (and indexed) before anyone asked:
//!   the block an append is rewriting holds them with the same values
//!   before and after, so a read that races the write gets them either
//!   way.
//! - fdatasync is still what makes an append durable: a direct write
//!   leaves the device's volatile cache and a grown file's size to it.
//! - A file system that refuses a direct write's alignment (`EINVAL`)
//!   gets this append and every later one through the ordinary handle;
//!   one that refuses a direct read's, this read and every later one.
//!
//! [`Storage::appends`]: crate::storage::Storage::appends

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

/// The alignment of a direct write's offset, length and memory: a page,
/// which covers devices of 512-byte and 4 KiB logical blocks.
const BLOCK: usize = 4096;

/// Opens `path` for direct appends. `None` where the file system refuses
/// `O_DIRECT` (tmpfs, some network file systems): the caller appends
/// through its ordinary handle.
pub(crate) fn open(path: &Path) -> io::Result<Option<Appender>> {
    open_aligned(path, BLOCK)
}

fn open_aligned(path: &Path, block: usize) -> io::Result<Option<Appender>> {
    Ok(open_direct(path, block, true)?.map(|reads| Appender {
        reads,
        tail: Mutex::new(Tail {
            refused: false,
            end: None,
            bytes: Vec::new(),
        }),
    }))
}

/// Opens `path` for direct reads only (a segment on disk when the store
/// opened); `None` where the file system refuses `O_DIRECT`.
pub(crate) fn open_reads(path: &Path) -> io::Result<Option<Reads>> {
    open_direct(path, BLOCK, false)
}

fn open_direct(path: &Path, block: usize, write: bool) -> io::Result<Option<Reads>> {
    match OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(direct) => Ok(Some(Reads {
            path: path.to_path_buf(),
            block,
            direct,
            refused: AtomicBool::new(false),
        })),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The `O_DIRECT` handle of one file, and direct reads through it.
pub(crate) struct Reads {
    path: PathBuf,
    block: usize,
    direct: File,
    /// Set once the file system refused a direct read.
    refused: AtomicBool,
}

/// Direct appends to one file, and direct reads of it, beside its
/// ordinary handle.
pub(crate) struct Appender {
    reads: Reads,
    tail: Mutex<Tail>,
}

struct Tail {
    /// Set once the file system refused a direct write.
    refused: bool,
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

/// Gives back the calling thread's staging memory (see [`STAGING`]).
pub(crate) fn release_staging() {
    STAGING.with_borrow_mut(|mem| *mem = Vec::new());
}

impl Reads {
    /// Reads `len` bytes at `offset` past the page cache, into memory of
    /// their own: the result is a view of that memory, not a copy.
    /// `UnexpectedEof` if the file ends first. `None` once the file system
    /// refused a direct read: the caller reads through the ordinary handle.
    pub(crate) fn read(&self, offset: u64, len: usize) -> io::Result<Option<Bytes>> {
        if self.refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match read_aligned(&self.direct, self.block, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "the file system refused a direct read: this segment's reads go \
                     through the page cache");
                self.refused.store(true, Ordering::Relaxed);
                Ok(None)
            }
            r => r.map(Some),
        }
    }
}

impl Appender {
    /// Writes all of `buf` at `offset`; `file` is the ordinary handle,
    /// which a block's head is read back from and which takes the write
    /// when the file system refuses a direct one.
    pub(crate) fn write(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut t = self.tail.lock();
        if t.refused {
            return file.write_all_at(buf, offset);
        }
        match self.append(&mut t, file, buf, offset) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %self.reads.path.display(), error = %e,
                    "the file system refused a direct write: this segment's appends go \
                     through the page cache");
                *t = Tail {
                    refused: true,
                    end: None,
                    bytes: Vec::new(),
                };
                file.write_all_at(buf, offset)
            }
            Err(e) => {
                t.end = None;
                Err(e)
            }
        }
    }

    /// The direct handle's reads: see [`Reads::read`].
    pub(crate) fn reads(&self) -> &Reads {
        &self.reads
    }

    /// Forgets the last append's block: the file is about to be cut.
    pub(crate) fn cut(&self) {
        let mut t = self.tail.lock();
        t.end = None;
        t.bytes = Vec::new();
    }

    /// Writes `buf` at `offset` as whole blocks from the direct handle.
    fn append(&self, t: &mut Tail, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        let block_len = self.reads.block;
        let block = block_len as u64;
        let block_at = offset - offset % block;
        let head = usize::try_from(offset - block_at).expect("less than a block");
        let total = head + buf.len();
        let padded = total.div_ceil(block_len) * block_len;
        let direct = &self.reads.direct;
        STAGING.with_borrow_mut(|mem| {
            let start = staged(mem, block_len, padded);
            if t.end == Some(offset) {
                mem[start..start + head].copy_from_slice(&t.bytes[..head]);
            } else if head > 0 {
                file.read_exact_at(&mut mem[start..start + head], block_at)?;
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

/// Reads the whole `block`-aligned blocks around `len` bytes at `offset`
/// from a direct handle into aligned memory, and returns those bytes.
fn read_aligned(file: &File, block: usize, offset: u64, len: usize) -> io::Result<Bytes> {
    let short = || io::Error::new(io::ErrorKind::UnexpectedEof, "short read");
    let start = offset - offset % block as u64;
    let head = usize::try_from(offset - start).expect("less than a block");
    let want = head + len;
    let padded = want.div_ceil(block) * block;
    let mut mem = vec![0u8; padded + block];
    let at = mem.as_ptr().align_offset(block);
    let mut got = 0;
    while got < want {
        match file.read_at(&mut mem[at + got..at + padded], start + got as u64) {
            Ok(0) => return Err(short()),
            // A direct read stops short only at the end of the file, and
            // the next one could not start on a block.
            Ok(n) if got + n < want && (got + n) % block != 0 => return Err(short()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Bytes::from(mem).slice(at + head..at + want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A new file in `dir`: its path, its ordinary handle and a direct
    /// appender, or `None` (the test is skipped) where the file system
    /// refuses `O_DIRECT`.
    fn appender(dir: &Path, block: usize) -> Option<(PathBuf, File, Appender)> {
        let path = dir.join("0000000001.seg");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        match open_aligned(&path, block).unwrap() {
            Some(d) => Some((path, file, d)),
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
        let Some((path, file, f)) = appender(&dir, BLOCK) else {
            return;
        };
        let mut model = Vec::new();
        for (i, len) in [100usize, 5000, 1, 4095, 8192, 3].into_iter().enumerate() {
            let bytes = vec![u8::try_from(i + 1).unwrap(); len];
            f.write(&file, &bytes, model.len() as u64).unwrap();
            model.extend_from_slice(&bytes);
            let on_disk = contents(&path);
            assert_eq!(on_disk.len(), model.len().div_ceil(BLOCK) * BLOCK);
            assert!(on_disk[..model.len()] == model[..], "after append {i}");
            assert!(on_disk[model.len()..].iter().all(|b| *b == 0));
            let mut back = vec![0u8; model.len()];
            file.read_exact_at(&mut back, 0).unwrap();
            assert!(
                back == model,
                "read through the ordinary handle after append {i}"
            );
        }
        file.sync_data().unwrap();
        f.cut();
        file.set_len(model.len() as u64).unwrap();
        assert!(contents(&path) == model);
    }

    #[test]
    fn an_append_after_a_cut_reads_the_head_of_its_block_back() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-cut").and_path();
        let Some((path, file, f)) = appender(&dir, BLOCK) else {
            return;
        };
        f.write(&file, &[1u8; 6000], 0).unwrap();
        f.cut();
        file.set_len(5000).unwrap();
        // What the tail held (bytes 5000..6000) is cut; what is appended
        // next continues at 5000, the head of its block read from disk.
        release_staging();
        f.write(&file, &[2u8; 10], 5000).unwrap();
        let on_disk = contents(&path);
        assert!(on_disk[..5000].iter().all(|b| *b == 1));
        assert!(on_disk[5000..5010].iter().all(|b| *b == 2));
        assert!(on_disk[5010..].iter().all(|b| *b == 0));
    }

    #[test]
    fn idle_memory_is_given_back_and_the_next_append_continues() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-idle").and_path();
        let Some((path, file, f)) = appender(&dir, BLOCK) else {
            return;
        };
        f.write(&file, &[3u8; 1 << 20], 0).unwrap();
        f.write(&file, &[4u8; 300], 1 << 20).unwrap();
        assert!(STAGING.with_borrow(Vec::len) > 1 << 20);
        release_staging();
        assert_eq!(STAGING.with_borrow(Vec::len), 0);
        f.write(&file, &[5u8; 300], (1 << 20) + 300).unwrap();
        let on_disk = contents(&path);
        let at = 1 << 20;
        assert!(on_disk[..at].iter().all(|b| *b == 3));
        assert!(on_disk[at..at + 300].iter().all(|b| *b == 4));
        assert!(on_disk[at + 300..at + 600].iter().all(|b| *b == 5));
    }

    #[test]
    fn reads_return_the_bytes_appended_wherever_they_start_and_end() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-reads").and_path();
        let Some((_path, file, f)) = appender(&dir, BLOCK) else {
            return;
        };
        let model: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        f.write(&file, &model[..7000], 0).unwrap();
        f.write(&file, &model[7000..], 7000).unwrap();
        for (from, len) in [
            (0, 1),
            (0, 4096),
            (1, 4095),
            (4095, 2),
            (5000, 9000),
            (0, 20_000),
            (19_999, 1),
        ] {
            let read = f
                .reads()
                .read(from as u64, len)
                .unwrap()
                .expect("a direct read");
            assert!(read[..] == model[from..from + len], "{len} bytes at {from}");
        }
        // The file as the writer leaves it when it seals the segment: cut at
        // its records, not at a block.
        file.sync_data().unwrap();
        f.cut();
        file.set_len(19_000).unwrap();
        let read = f
            .reads()
            .read(15_000, 4000)
            .unwrap()
            .expect("a direct read");
        assert!(
            read[..] == model[15_000..19_000],
            "up to the end of the file"
        );
        for (from, len) in [(15_000, 4001), (19_000, 1), (30_000, 10)] {
            let e = f.reads().read(from, len).unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::UnexpectedEof,
                "{len} bytes at {from}"
            );
        }
    }

    #[test]
    fn a_refused_read_alignment_leaves_reads_to_the_ordinary_handle() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-read-refused").and_path();
        // Blocks of 2 bytes: no device takes such a direct read.
        let Some((_path, file, f)) = appender(&dir, 2) else {
            return;
        };
        file.write_all_at(b"hello world", 0).unwrap();
        assert!(
            f.reads().read(1, 4).unwrap().is_none(),
            "the direct read was refused"
        );
        assert!(f.reads.refused.load(Ordering::Relaxed));
        assert!(
            f.reads().read(0, 5).unwrap().is_none(),
            "and is not tried again"
        );
    }

    #[test]
    fn a_refused_alignment_falls_back_to_the_page_cache_and_loses_nothing() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-refused").and_path();
        // Blocks of 2 bytes: no device takes such a direct write.
        let Some((path, file, f)) = appender(&dir, 2) else {
            return;
        };
        f.write(&file, b"hello", 0).unwrap();
        assert!(f.tail.lock().refused, "the direct write was refused");
        f.write(&file, b" world", 5).unwrap();
        assert_eq!(contents(&path), b"hello world");
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
            let Some((path, file, f)) = appender(&dir, BLOCK) else {
                return Ok(());
            };
            let mut model: Vec<u8> = Vec::new();
            for (i, (len, what)) in steps.into_iter().enumerate() {
                match what {
                    0 => {
                        let cut = model.len() / 2;
                        model.truncate(cut);
                        f.cut();
                        file.set_len(cut as u64).unwrap();
                    }
                    1 => release_staging(),
                    _ => {
                        let bytes = vec![u8::try_from(i % 250 + 1).unwrap(); len];
                        f.write(&file, &bytes, model.len() as u64).unwrap();
                        model.extend_from_slice(&bytes);
                    }
                }
                let on_disk = contents(&path);
                prop_assert!(on_disk.len() >= model.len());
                prop_assert!(on_disk[..model.len()] == model[..], "step {}", i);
                prop_assert!(on_disk[model.len()..].iter().all(|b| *b == 0));
                // A direct read of the second half of what is appended.
                let from = model.len() / 2;
                let read = f.reads().read(from as u64, model.len() - from).unwrap();
                prop_assert!(read.expect("a direct read")[..] == model[from..], "step {}", i);
            }
        }
    }
}
