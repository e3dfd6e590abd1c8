//! Appends past the page cache: the group writer's active segment, opened
//! a second time with `O_DIRECT`, so that a batch goes from the writer's
//! reused buffer (where it was encoded, placed for its offset:
//! `append_buf.rs`) to the device instead of being copied into freshly
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
//! - A batch placed for its offset is written from where it lies, the
//!   room around it filled with the block's earlier bytes and zeros; any
//!   other is copied into the thread's staging memory first. Both write
//!   the same blocks.
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

use crate::append_buf::{AppendBuf, BLOCK};

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
    /// Staging memory of the thread that appends (a group's writer), for
    /// batches not placed for their offset: it grows to a batch, is reused
    /// for every segment the thread writes, and is given back by
    /// [`release_staging`] once the thread is idle.
    static STAGING: RefCell<AppendBuf> = RefCell::new(AppendBuf::new());
}

/// Gives back the calling thread's staging memory (see [`STAGING`]).
pub(crate) fn release_staging() {
    STAGING.with_borrow_mut(|stage| *stage = AppendBuf::new());
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

/// What an append writes: bytes anywhere, or a buffer that may have
/// placed them for the write (`append_buf.rs`).
enum Batch<'a> {
    Bytes(&'a [u8]),
    Placed(&'a mut AppendBuf),
}

impl Batch<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Batch::Bytes(b) => b,
            Batch::Placed(buf) => buf.bytes(),
        }
    }
}

impl Appender {
    /// Writes all of `buf` at `offset`; `file` is the ordinary handle,
    /// which a block's head is read back from and which takes the write
    /// when the file system refuses a direct one.
    pub(crate) fn write(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_batch(file, Batch::Bytes(buf), offset)
    }

    /// Writes the bytes of `buf` at `offset` as [`Appender::write`] does,
    /// from where they lie if `buf` placed them for `offset`, and through
    /// the thread's staging memory if not.
    pub(crate) fn write_placed(
        &self,
        file: &File,
        buf: &mut AppendBuf,
        offset: u64,
    ) -> io::Result<()> {
        self.write_batch(file, Batch::Placed(buf), offset)
    }

    fn write_batch(&self, file: &File, mut batch: Batch<'_>, offset: u64) -> io::Result<()> {
        let mut t = self.tail.lock();
        if t.refused {
            return file.write_all_at(batch.bytes(), offset);
        }
        match self.append(&mut t, file, &mut batch, offset) {
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
                file.write_all_at(batch.bytes(), offset)
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

    /// Writes the batch at `offset` as whole blocks from the direct
    /// handle: from where it lies if placed, else from the thread's
    /// staging memory, placed for `offset` and the batch copied into it.
    fn append(
        &self,
        t: &mut Tail,
        file: &File,
        batch: &mut Batch<'_>,
        offset: u64,
    ) -> io::Result<()> {
        let block = self.reads.block;
        let len = batch.bytes().len();
        let mut write = |run: &mut [u8], head| self.write_run(t, file, run, head, len, offset);
        let bytes = match batch {
            Batch::Placed(buf) => match buf.with_blocks(offset, block, &mut write) {
                Some(written) => return written,
                None => buf.bytes(),
            },
            Batch::Bytes(bytes) => bytes,
        };
        STAGING.with_borrow_mut(|stage| {
            stage.clear();
            stage.place_with_room(offset, len);
            stage.extend_from_slice(bytes);
            stage
                .with_blocks(offset, block, &mut write)
                .unwrap_or_else(|| {
                    Err(io::Error::other(format!(
                        "staging memory could not be aligned to blocks of {block} bytes"
                    )))
                })
        })
    }

    /// Writes `run`, whole aligned blocks holding `len` bytes for `offset`
    /// from `head` on and zeros after them, once its first `head` bytes
    /// are filled with the block's earlier bytes; keeps the last block's
    /// bytes for the next append.
    fn write_run(
        &self,
        t: &mut Tail,
        file: &File,
        run: &mut [u8],
        head: usize,
        len: usize,
        offset: u64,
    ) -> io::Result<()> {
        let block = self.reads.block as u64;
        let block_at = offset - head as u64;
        if t.end == Some(offset) {
            run[..head].copy_from_slice(&t.bytes[..head]);
        } else if head > 0 {
            file.read_exact_at(&mut run[..head], block_at)?;
        }
        self.reads.direct.write_all_at(run, block_at)?;
        let end = offset + len as u64;
        let end_block = end - end % block;
        let keep = usize::try_from(end - end_block).expect("less than a block");
        let from = usize::try_from(end_block - block_at).expect("in the run");
        t.bytes.clear();
        t.bytes.extend_from_slice(&run[from..from + keep]);
        t.end = Some(end);
        Ok(())
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
    let mut mem: Vec<u8> = Vec::with_capacity(padded + block);
    let at = mem.as_ptr().align_offset(block);
    // Only the bytes before the aligned run are filled here: the device
    // writes the run, so zeroing it first would be a wasted pass.
    mem.resize(at, 0);
    while mem.len() - at < want {
        let got = mem.len() - at;
        match read_into_spare(file, &mut mem, padded - got, start + got as u64) {
            Ok(0) => return Err(short()),
            // A direct read stops short only at the end of the file, and
            // the next one could not start on a block.
            Ok(n) if got + n < want && !(got + n).is_multiple_of(block) => return Err(short()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Bytes::from(mem).slice(at + head..at + want))
}

/// Reads up to `max` bytes at `offset` into `mem`'s spare capacity (at
/// least `max` bytes of it), and lengthens `mem` by as many as were read.
#[allow(unsafe_code)]
fn read_into_spare(file: &File, mem: &mut Vec<u8>, max: usize, offset: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let spare = &mut mem.spare_capacity_mut()[..max];
    let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
    // SAFETY: `spare` is `max` bytes of memory we own and nothing else
    // refers to; pread writes at most that many into it, and the
    // descriptor is open for as long as `file` lives.
    let n = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), max, offset) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: pread initialised the first `n` (≤ `max`) spare bytes.
    unsafe { mem.set_len(mem.len() + n) };
    Ok(n)
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
    fn a_placed_batch_is_written_from_where_it_lies() {
        let (_dir, dir) = berth_testdir::TestDir::new("direct-placed").and_path();
        let Some((path, file, f)) = appender(&dir, BLOCK) else {
            return;
        };
        let mut buf = AppendBuf::new();
        let mut model = Vec::new();
        // Appends `bytes` placed for `placed_for`, at the end of `model`.
        let mut append = |model: &mut Vec<u8>, bytes: &[u8], placed_for: u64| {
            buf.clear();
            buf.place(placed_for);
            buf.extend_from_slice(bytes);
            f.write_placed(&file, &mut buf, model.len() as u64).unwrap();
            assert!(buf.bytes() == bytes, "the bytes are left as they were");
            model.extend_from_slice(bytes);
            let on_disk = contents(&path);
            assert_eq!(on_disk.len(), model.len().div_ceil(BLOCK) * BLOCK);
            assert!(on_disk[..model.len()] == model[..]);
            assert!(on_disk[model.len()..].iter().all(|b| *b == 0));
        };
        // The first batch sizes the room, as a writer's first batches do.
        append(&mut model, &[9u8; 8192], 0);
        release_staging();
        for (i, len) in [100usize, 5000, 1, 4095, 8192, 3].into_iter().enumerate() {
            let at = model.len() as u64;
            append(&mut model, &vec![u8::try_from(i + 1).unwrap(); len], at);
            assert_eq!(
                STAGING.with_borrow(AppendBuf::capacity),
                0,
                "append {i} was copied into staging memory"
            );
        }
        // Placed for another offset: copied first, and written all the same.
        let at = model.len() as u64;
        append(&mut model, b"misplaced", at + 1);
        assert!(STAGING.with_borrow(AppendBuf::capacity) > 0);
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
        assert!(STAGING.with_borrow(AppendBuf::capacity) > 1 << 20);
        release_staging();
        assert_eq!(STAGING.with_borrow(AppendBuf::capacity), 0);
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
        /// Any run of appends (of bytes, of placed batches and of
        /// misplaced ones), cuts and idle releases leaves the file as the
        /// same run leaves a plain one, up to the zeros of the last block.
        #[test]
        fn appends_match_plain_writes(
            steps in proptest::collection::vec((0usize..20_000, 0u8..10), 1..24),
        ) {
            let (_dir, dir) = berth_testdir::TestDir::new("direct-prop").and_path();
            let Some((path, file, f)) = appender(&dir, BLOCK) else {
                return Ok(());
            };
            let mut model: Vec<u8> = Vec::new();
            // The writer's buffer, placed for the offset its batch goes to
            // (or, step kind 2, for another one).
            let mut buf = AppendBuf::new();
            for (i, (len, what)) in steps.into_iter().enumerate() {
                match what {
                    0 => {
                        let cut = model.len() / 2;
                        model.truncate(cut);
                        f.cut();
                        file.set_len(cut as u64).unwrap();
                    }
                    1 => release_staging(),
                    2..=5 => {
                        let at = model.len() as u64;
                        buf.clear();
                        buf.place(if what == 2 { at + 1 } else { at });
                        buf.extend_from_slice(&vec![u8::try_from(i % 250 + 1).unwrap(); len]);
                        f.write_placed(&file, &mut buf, at).unwrap();
                        model.extend_from_slice(buf.bytes());
                    }
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
