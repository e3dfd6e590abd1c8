//! `raft.log` as a run of segment files, so that purging the head of the
//! log deletes whole files instead of copying what is kept.
//!
//! A segment is named by the log offset of its first byte,
//! `raft.<base, 20 digits>.log`; offsets are the log's own (they never
//! change when a segment is deleted). The segment with the highest base is
//! the one appended to; once it holds `segment_bytes`, the next append
//! opens a new one. A frame never spans two segments. A node's log written
//! before segments (one `raft.log`, offsets from 0) is renamed to the
//! segment of base 0 at open.
//!
//! Invariants:
//! - Segments are contiguous: each base is the previous segment's base plus
//!   its length. A gap, or a bad frame in a segment before the last, is
//!   damage (those segments were fdatasynced before the next one began).
//! - The segment appended to is never deleted, so the log's end is always
//!   known from a file name and a length.
//! - A segment's file name is durable (directory fsynced) before any append
//!   in it is acknowledged, and a deletion is durable before it is reported.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use crate::error::ClusterError;
use crate::log_frame::{scan, Tail, FRAME_HEADER_BYTES, LOG_FILE};

/// Bytes of a payload enough to decode a Raft entry's log id (its first
/// field: three varints of at most 10 bytes).
pub const ENTRY_HEAD_BYTES: usize = 32;

const PREFIX: &str = "raft.";
const SUFFIX: &str = ".log";
const BASE_DIGITS: usize = 20;

/// The file name of the segment whose first byte is log offset `base`.
#[must_use]
pub fn segment_name(base: u64) -> String {
    format!("{PREFIX}{base:0BASE_DIGITS$}{SUFFIX}")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.len() != BASE_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Every segment file of `dir`, in log order.
pub fn segment_paths(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(bases(dir)?
        .into_iter()
        .map(|b| dir.join(segment_name(b)))
        .collect())
}

pub(crate) fn bases(dir: &Path) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        if let Some(base) = entry?.file_name().to_str().and_then(parse_name) {
            found.push(base);
        }
    }
    found.sort_unstable();
    Ok(found)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What the segments held at open.
pub struct Opened {
    pub segments: Segments,
    /// Each frame's payload with its log offset.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// Where a damaged frame (or a gap) cut the log; `None` if it was whole
    /// (a torn tail of the last segment is cut without being damage).
    pub damaged_at: Option<u64>,
}

/// The segments of one log, as the writer thread holds them.
pub struct Segments {
    dir: PathBuf,
    /// `(base, length)` of every segment, in log order; never empty.
    spans: Vec<(u64, u64)>,
    /// The last segment, open for writing.
    current: File,
    /// Segments left full since the last fdatasync (see `take_rolled`).
    rolled: Vec<File>,
    segment_bytes: u64,
    /// Purged segments go to a thread of their own to be deleted.
    reaper: Reaper,
}

impl Segments {
    /// Reads every segment of `dir` (creating the first if there is none),
    /// cuts a torn tail off the last one, and sets aside anything from a
    /// damaged frame on, into `raft.log.damaged-<offset>`.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<Opened, ClusterError> {
        Self::open_keeping(dir, segment_bytes, u64::MAX)
    }

    /// [`Self::open`], copying whole only the payloads of frames that end
    /// in the last `resident_bytes` of the log; of older frames only the
    /// first [`ENTRY_HEAD_BYTES`] (a Raft entry's log id comes first).
    pub fn open_keeping(
        dir: &Path,
        segment_bytes: u64,
        resident_bytes: u64,
    ) -> Result<Opened, ClusterError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ClusterError::Io { path, source }
        };
        let mut found = bases(dir).map_err(io_err(dir))?;
        let legacy = dir.join(LOG_FILE);
        if legacy.exists() {
            if !found.is_empty() {
                return Err(ClusterError::Undecodable {
                    path: legacy,
                    detail: "both a single-file Raft log and log segments exist; \
                             move raft.log away if the segments are the newer log"
                        .into(),
                });
            }
            fs::rename(&legacy, dir.join(segment_name(0))).map_err(io_err(&legacy))?;
            found.push(0);
        }
        // Left by a rewrite of the single-file log that did not finish.
        let _ = fs::remove_file(dir.join(format!("{LOG_FILE}.tmp")));
        if found.is_empty() {
            let first = dir.join(segment_name(0));
            File::create(&first).map_err(io_err(&first))?;
            found.push(0);
        }
        // Where the kept tail starts, by the files' sizes (a cut tail only
        // keeps a little more whole).
        let mut total = 0;
        for &base in &found {
            let path = dir.join(segment_name(base));
            total = base + fs::metadata(&path).map_err(io_err(&path))?.len();
        }
        let whole_from = total.saturating_sub(resident_bytes);
        let mut entries = Vec::new();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        let mut damaged_at = None;
        for (i, &base) in found.iter().enumerate() {
            let path = dir.join(segment_name(base));
            if let Some(&(b, l)) = spans.last() {
                if b + l != base {
                    // A missing or foreign piece: keep what follows aside.
                    set_aside(dir, b + l, &[], &found[i..]).map_err(io_err(dir))?;
                    damaged_at = Some(b + l);
                    break;
                }
            }
            let bytes = fs::read(&path).map_err(io_err(&path))?;
            let scan = scan(&bytes);
            entries.extend(scan.frames.iter().map(|(at, p)| {
                let end = base + at + (FRAME_HEADER_BYTES + p.len()) as u64;
                let kept = if end > whole_from {
                    p.to_vec()
                } else {
                    p[..p.len().min(ENTRY_HEAD_BYTES)].to_vec()
                };
                (base + at, kept)
            }));
            let last = i + 1 == found.len();
            let cut = match scan.tail {
                Tail::Clean => None,
                Tail::Torn { at } if last => {
                    tracing::warn!(path = %path.display(), at, cut = bytes.len() as u64 - at,
                        "cutting a torn tail (an append that never completed its fdatasync) off the Raft log");
                    Some(at)
                }
                Tail::Torn { at } | Tail::Damaged { at } => {
                    // Entries from here on may have been acknowledged: keep
                    // their bytes for inspection, cut them off, and let the
                    // node catch up on probation (it neither votes nor
                    // stands for election until it holds everything a
                    // leader has committed).
                    let from = usize::try_from(at).expect("offset within a read file");
                    set_aside(dir, base + at, &bytes[from..], &found[i + 1..])
                        .map_err(io_err(dir))?;
                    tracing::error!(path = %path.display(), at = base + at,
                        "the Raft log is damaged (a bad frame, or a torn one before its last segment); \
                         cutting it there and rejoining on probation: no vote until caught up with a leader");
                    damaged_at = Some(base + at);
                    Some(at)
                }
            };
            let len = cut.unwrap_or(bytes.len() as u64);
            if cut.is_some() {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                file.set_len(len)
                    .and_then(|()| file.sync_data())
                    .map_err(io_err(&path))?;
            }
            spans.push((base, len));
            if damaged_at.is_some() {
                break;
            }
        }
        sync_dir(dir).map_err(io_err(dir))?;
        let (base, _) = *spans.last().expect("at least one segment");
        let path = dir.join(segment_name(base));
        let current = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(Opened {
            segments: Segments {
                dir: dir.to_path_buf(),
                spans,
                current,
                segment_bytes,
                rolled: Vec::new(),
                reaper: Reaper::start(dir).map_err(io_err(dir))?,
            },
            entries,
            damaged_at,
        })
    }

    /// The log offset after its last byte.
    #[must_use]
    pub fn end(&self) -> u64 {
        let (base, len) = self.spans[self.spans.len() - 1];
        base + len
    }

    /// The segment appended to (for its fdatasync).
    #[must_use]
    pub fn current(&self) -> &File {
        &self.current
    }

    /// Segments this batch of appends filled and left, whose last writes
    /// are not yet durable: the caller fdatasyncs them with
    /// [`Self::current`] (a batch that rolls writes to both).
    pub fn take_rolled(&mut self) -> Vec<File> {
        std::mem::take(&mut self.rolled)
    }

    /// Writes `frames` at log offset `at`, which must be the log's end;
    /// starts a new segment first when the current one is full.
    pub fn write(&mut self, at: u64, frames: &[u8]) -> io::Result<()> {
        let end = self.end();
        if at != end {
            return Err(io::Error::other(format!(
                "an append at log offset {at}, but the log ends at {end}"
            )));
        }
        let (_, len) = self.spans[self.spans.len() - 1];
        if len >= self.segment_bytes {
            let path = self.dir.join(segment_name(at));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            sync_dir(&self.dir)?;
            self.spans.push((at, 0));
            let full = std::mem::replace(&mut self.current, file);
            self.rolled.push(full);
        }
        let last = self.spans.len() - 1;
        let (base, _) = self.spans[last];
        self.current.write_all_at(frames, at - base)?;
        self.spans[last].1 += frames.len() as u64;
        Ok(())
    }

    /// Cuts the log to `len` bytes: segments starting after it are deleted
    /// and the one holding it is shortened (not synced: the caller syncs
    /// [`Self::current`]).
    pub fn cut(&mut self, len: u64) -> io::Result<()> {
        if len < self.spans[0].0 {
            return Err(io::Error::other(format!(
                "a cut of the Raft log to {len} bytes, before its first kept byte {}",
                self.spans[0].0
            )));
        }
        let mut deleted = false;
        while self.spans.len() > 1 && self.spans[self.spans.len() - 1].0 > len {
            let (base, _) = self.spans.pop().expect("more than one span");
            fs::remove_file(self.dir.join(segment_name(base)))?;
            deleted = true;
        }
        let last = self.spans.len() - 1;
        let (base, _) = self.spans[last];
        if deleted {
            self.current = OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.dir.join(segment_name(base)))?;
        }
        self.current.set_len(len - base)?;
        self.spans[last].1 = len - base;
        if deleted {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Lets go of every segment that ends at or before log offset `from`
    /// (all of it purged), except the one appended to. The files are
    /// deleted by the reaper thread, oldest first: unlinking a 32 MiB file
    /// frees its cached pages, which took this thread (and every append
    /// queued behind it) milliseconds. A crash before they are gone leaves
    /// them for the next open, which reads and skips their purged entries.
    pub fn drop_before(&mut self, from: u64) {
        let mut purged = Vec::new();
        while self.spans.len() > 1 && self.spans[0].0 + self.spans[0].1 <= from {
            let (base, _) = self.spans.remove(0);
            purged.push(self.dir.join(segment_name(base)));
        }
        if !purged.is_empty() {
            self.reaper.delete(purged);
        }
    }
}

/// The thread that deletes purged segments, in the order they were purged,
/// so that what is left is always contiguous.
struct Reaper {
    jobs: mpsc::Sender<Vec<PathBuf>>,
}

impl Reaper {
    fn start(dir: &Path) -> io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Vec<PathBuf>>();
        let dir = dir.to_path_buf();
        thread::Builder::new()
            .name("raft-log-reaper".into())
            .spawn(move || {
                for paths in rx {
                    let result = paths
                        .iter()
                        .try_for_each(fs::remove_file)
                        .and_then(|()| sync_dir(&dir));
                    if let Err(e) = result {
                        // Only disk space is at stake: the next open skips
                        // the purged entries of any segment left behind.
                        tracing::warn!(dir = %dir.display(), error = %e,
                            "could not delete purged Raft log segments; they are deleted at the next start");
                        return;
                    }
                }
            })?;
        Ok(Self { jobs })
    }

    fn delete(&self, paths: Vec<PathBuf>) {
        let _ = self.jobs.send(paths); // a stopped reaper said why
    }
}

/// Writes `head` and then every segment of `later` (by base) into
/// `raft.log.damaged-<at>`, fdatasyncs it, and deletes those segments.
fn set_aside(dir: &Path, at: u64, head: &[u8], later: &[u64]) -> io::Result<()> {
    let aside = dir.join(format!("{LOG_FILE}.damaged-{at}"));
    let mut file = File::create(&aside)?;
    file.write_all(head)?;
    for base in later {
        file.write_all(&fs::read(dir.join(segment_name(*base)))?)?;
    }
    file.sync_data()?;
    for base in later {
        fs::remove_file(dir.join(segment_name(*base)))?;
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_frame::encode_frame;
    use berth_testdir::TestDir;

    fn temp_dir(name: &str) -> TestDir {
        TestDir::new(&format!("segments-{name}"))
    }

    fn append(s: &mut Segments, payload: &[u8]) -> u64 {
        let at = s.end();
        s.write(at, &encode_frame(payload)).unwrap();
        at
    }

    /// A start used to copy every payload of the log into memory.
    #[test]
    fn a_start_keeping_the_tail_copies_only_heads_of_older_frames() {
        let dir = temp_dir("keeping");
        let mut s = Segments::open(&dir, 1_000).unwrap().segments;
        for i in 0..10u8 {
            append(&mut s, &[i; 200]);
        }
        drop(s);
        // The last 500 bytes of 2,080: the three frames (208 bytes each)
        // that end in them whole.
        let opened = Segments::open_keeping(&dir, 1_000, 500).unwrap();
        let lens: Vec<usize> = opened.entries.iter().map(|(_, p)| p.len()).collect();
        let mut wanted = vec![ENTRY_HEAD_BYTES; 7];
        wanted.extend([200, 200, 200]);
        assert_eq!(lens, wanted);
        assert!(opened
            .entries
            .iter()
            .enumerate()
            .all(|(i, (_, p))| p[0] == i as u8));
    }

    #[test]
    fn names_sort_in_log_order_and_parse_back() {
        assert_eq!(segment_name(42), "raft.00000000000000000042.log");
        assert_eq!(parse_name(&segment_name(u64::MAX)), Some(u64::MAX));
        for bad in ["raft.log", "raft.42.log", "raft.0000000000000000004x.log"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_full_segment_rolls_and_reopening_reads_every_frame_at_its_offset() {
        let dir = temp_dir("roll");
        let mut s = Segments::open(&dir, 100).unwrap().segments;
        let offsets: Vec<u64> = (0..10u8).map(|i| append(&mut s, &[i; 40])).collect();
        drop(s);
        assert!(
            segment_paths(&dir).unwrap().len() > 2,
            "40-byte frames roll 100-byte segments"
        );
        let opened = Segments::open(&dir, 100).unwrap();
        assert_eq!(opened.damaged_at, None);
        let got: Vec<(u64, u8)> = opened.entries.iter().map(|(o, p)| (*o, p[0])).collect();
        let want: Vec<(u64, u8)> = offsets.into_iter().zip(0..10u8).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_cut_across_segments_deletes_later_ones_and_appends_go_on_from_it() {
        let dir = temp_dir("cut");
        let mut s = Segments::open(&dir, 100).unwrap().segments;
        let offsets: Vec<u64> = (0..10u8).map(|i| append(&mut s, &[i; 40])).collect();
        s.cut(offsets[3]).unwrap();
        assert_eq!(s.end(), offsets[3]);
        append(&mut s, &[99; 40]);
        drop(s);
        let opened = Segments::open(&dir, 100).unwrap();
        let firsts: Vec<u8> = opened.entries.iter().map(|(_, p)| p[0]).collect();
        assert_eq!(firsts, vec![0, 1, 2, 99]);
    }

    #[test]
    fn a_bad_frame_before_the_last_segment_is_damage_and_what_follows_is_set_aside() {
        let dir = temp_dir("damage");
        let mut s = Segments::open(&dir, 100).unwrap().segments;
        let offsets: Vec<u64> = (0..10u8).map(|i| append(&mut s, &[i; 40])).collect();
        drop(s);
        let first = segment_paths(&dir).unwrap()[0].clone();
        let mut bytes = fs::read(&first).unwrap();
        bytes[offsets[1] as usize + 20] ^= 1;
        fs::write(&first, bytes).unwrap();
        let opened = Segments::open(&dir, 100).unwrap();
        assert_eq!(opened.damaged_at, Some(offsets[1]));
        assert_eq!(opened.entries.len(), 1);
        assert_eq!(opened.segments.end(), offsets[1]);
        assert_eq!(segment_paths(&dir).unwrap().len(), 1);
        assert!(dir
            .join(format!("{LOG_FILE}.damaged-{}", offsets[1]))
            .exists());
    }

    #[test]
    fn a_missing_segment_is_a_gap_and_damage() {
        let dir = temp_dir("gap");
        let mut s = Segments::open(&dir, 100).unwrap().segments;
        for i in 0..10u8 {
            append(&mut s, &[i; 40]);
        }
        drop(s);
        let paths = segment_paths(&dir).unwrap();
        fs::remove_file(&paths[1]).unwrap();
        let opened = Segments::open(&dir, 100).unwrap();
        let first_len = fs::metadata(&paths[0]).unwrap().len();
        assert_eq!(opened.damaged_at, Some(first_len));
        assert_eq!(opened.segments.end(), first_len);
    }

    #[test]
    fn a_single_file_log_is_taken_as_the_first_segment() {
        let dir = temp_dir("legacy");
        let frames: Vec<u8> = [b"alpha".as_slice(), b"beta"]
            .iter()
            .flat_map(|p| encode_frame(p))
            .collect();
        fs::write(dir.join(LOG_FILE), &frames).unwrap();
        let opened = Segments::open(&dir, 100).unwrap();
        assert_eq!(opened.entries.len(), 2);
        assert_eq!(opened.segments.end(), frames.len() as u64);
        assert!(!dir.join(LOG_FILE).exists());
        assert!(dir.join(segment_name(0)).exists());
    }
}
