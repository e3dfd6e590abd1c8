//! The files that hold a node's Raft state, and the one thread that writes
//! them.
//!
//! Interim layout (docs/FORMAT.md, "Cluster directory"): until a log group's
//! segments become its Raft log, a node keeps its Raft log in its own files
//! in `<data_dir>/cluster/`:
//!
//! - `raft.<base>.log`: the log's segments ([`crate::log_segments`]), one
//!   frame per entry, appended in index order;
//! - `raft.vote`, `raft.purged`: one frame each, replaced
//!   whole (write `*.tmp`, fdatasync, rename, fsync the directory);
//! - `raft.synced`: 8 bytes, `u64 LE`, the log offset up to which the log had
//!   been fdatasynced (so acknowledged) — written after each fdatasync of
//!   the log, itself not synced, and lowered (then synced) before the log
//!   is ever shortened. A log found shorter than it lost acknowledged
//!   entries even if it ends cleanly on a frame boundary.
//!
//! A frame is `u32 LE payload length | u32 LE crc32c(payload) | payload`.
//!
//! Invariants:
//! - A job's completion is called only after its bytes were fdatasynced
//!   (and, for a replaced file, after the rename was made durable).
//! - Jobs complete in the order they were sent.
//! - After one I/O error every later job fails with that error: a failed
//!   fdatasync leaves the page cache in an unknown state, so nothing written
//!   after it may be reported durable.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::ClusterError;
use crate::limits::LOG_SEGMENT_BYTES;
pub use crate::log_segments::ENTRY_HEAD_BYTES;
use crate::log_segments::{Opened, Segments};
use crate::sync_gate::SyncGate;

pub use crate::log_frame::{
    append_frame, encode_frame, scan, Scan, Tail, FRAME_HEADER_BYTES, LOG_FILE,
};

pub const VOTE_FILE: &str = "raft.vote";
pub const PURGED_FILE: &str = "raft.purged";
pub const SYNCED_FILE: &str = "raft.synced";

/// What a node's cluster directory held at start.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Each entry's payload with the log offset of its frame; frames are
    /// contiguous, so a frame's length is the next one's offset (or
    /// `log_end`) less its own. Only a payload's first [`ENTRY_HEAD_BYTES`]
    /// where [`open_keeping`] kept the entry on disk.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// Where the next frame of `raft.log` goes.
    pub log_end: u64,
    /// Where recovery found a damaged frame and cut the log, or where a
    /// log shorter than `raft.synced` ends: entries this node acknowledged
    /// may be gone, so it must catch up before it votes.
    pub damaged_at: Option<u64>,
    pub vote: Option<Vec<u8>>,
    pub purged: Option<Vec<u8>>,
}

/// A job's completion: `Ok` only once its bytes are durable.
pub type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

enum Job {
    Append {
        at: u64,
        frames: Vec<u8>,
        done: Done,
    },
    Truncate {
        len: u64,
        done: Done,
    },
    Replace {
        name: &'static str,
        frame: Vec<u8>,
        done: Done,
    },
    DropHead {
        from: u64,
        done: Done,
    },
}

/// The sending side of the writer thread. Cloned by the log and the state
/// machine; the thread ends when the last clone is dropped.
#[derive(Clone)]
pub struct Writer {
    jobs: mpsc::Sender<Job>,
    /// When the fdatasync now running started (`None`: none running).
    sync_since: Arc<Mutex<Option<Instant>>>,
}

impl Writer {
    /// How long the fdatasync now running has taken so far; `None` when
    /// the disk is idle. A leader watches this to step down from a wedged
    /// disk.
    #[must_use]
    pub fn sync_running_for(&self) -> Option<Duration> {
        self.sync_since.lock().map(|t| t.elapsed())
    }

    /// Writes `frames` at log offset `at` (the log's end), then fdatasyncs.
    pub fn append(&self, at: u64, frames: Vec<u8>, done: Done) {
        self.send(Job::Append { at, frames, done });
    }

    /// Cuts the log to `len` bytes, then fdatasyncs.
    pub fn truncate(&self, len: u64, done: Done) {
        self.send(Job::Truncate { len, done });
    }

    /// Lets go of the log's segments that hold nothing at or after log
    /// offset `from` (purged entries; the reaper thread deletes them):
    /// nothing is copied and no offset changes.
    pub fn drop_head(&self, from: u64, done: Done) {
        self.send(Job::DropHead { from, done });
    }

    /// Replaces the single-frame file `name` by a frame of `payload`.
    pub fn replace(&self, name: &'static str, payload: &[u8], done: Done) {
        self.send(Job::Replace {
            name,
            frame: encode_frame(payload),
            done,
        });
    }

    fn send(&self, job: Job) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            let done = match job {
                Job::Append { done, .. }
                | Job::Truncate { done, .. }
                | Job::Replace { done, .. }
                | Job::DropHead { done, .. } => done,
            };
            done(Err(io::Error::other("the Raft log writer has stopped")));
        }
    }
}

/// Opens (creating if needed) the cluster directory, reads what it holds,
/// cuts a torn tail off the Raft log, and starts the writer thread.
pub fn open(dir: &Path, gate: SyncGate) -> Result<(Loaded, Writer), ClusterError> {
    open_with(dir, gate, LOG_SEGMENT_BYTES)
}

/// [`open`] with segments of `segment_bytes` (tests make them small).
pub fn open_with(
    dir: &Path,
    gate: SyncGate,
    segment_bytes: u64,
) -> Result<(Loaded, Writer), ClusterError> {
    open_keeping(dir, gate, segment_bytes, u64::MAX)
}

/// [`open_with`], loading whole only the entries in the last
/// `resident_bytes` of the log; of older ones [`Loaded::entries`] holds
/// the first [`ENTRY_HEAD_BYTES`] of the payload (its log id), so that a
/// start reads the log without holding it all in memory.
pub fn open_keeping(
    dir: &Path,
    gate: SyncGate,
    segment_bytes: u64,
    resident_bytes: u64,
) -> Result<(Loaded, Writer), ClusterError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ClusterError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let Opened {
        segments,
        entries,
        mut damaged_at,
    } = Segments::open_keeping(dir, segment_bytes, resident_bytes)?;
    let log_end = segments.end();
    let synced_path = dir.join(SYNCED_FILE);
    let synced = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&synced_path)
        .map_err(io_err(&synced_path))?;
    let acknowledged = read_mark(&synced, &synced_path);
    if damaged_at.is_none() && acknowledged > log_end {
        // The log ends cleanly but short of what was fdatasynced: a disk
        // that lost synced writes, or a file cut by hand.
        tracing::error!(dir = %dir.display(), log_end, acknowledged,
            "the Raft log is shorter than what this node had fdatasynced and acknowledged: \
             entries it acknowledged are gone; rejoining on probation: no vote until caught up with a leader");
        damaged_at = Some(log_end);
    }
    let loaded = Loaded {
        entries,
        log_end,
        damaged_at,
        vote: read_single(&dir.join(VOTE_FILE))?,
        purged: read_single(&dir.join(PURGED_FILE))?,
    };
    let (tx, rx) = mpsc::channel();
    let sync_since = Arc::new(Mutex::new(None));
    let thread = WriterThread {
        sync_since: sync_since.clone(),
        dir: dir.to_path_buf(),
        segments,
        synced,
        gate,
        failed: None,
    };
    thread::Builder::new()
        .name("raft-log".into())
        .spawn(move || thread.run(&rx))
        .map_err(io_err(dir))?;
    Ok((
        loaded,
        Writer {
            jobs: tx,
            sync_since,
        },
    ))
}

/// The value of `raft.synced`; 0 when it is new, or unreadable (then said:
/// the mark only ever adds a check, so a lost one costs nothing but that).
fn read_mark(file: &File, path: &Path) -> u64 {
    let mut bytes = [0u8; 8];
    match file.read_exact_at(&mut bytes, 0) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(e)
            if e.kind() == io::ErrorKind::UnexpectedEof
                && file.metadata().is_ok_and(|m| m.len() == 0) =>
        {
            0
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable mark of synced Raft log bytes");
            0
        }
    }
}

/// A file replaced whole holds exactly one valid frame, or does not exist.
fn read_single(path: &Path) -> Result<Option<Vec<u8>>, ClusterError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ClusterError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let scan = scan(&bytes);
    match (scan.frames.as_slice(), scan.tail) {
        ([(_, payload)], Tail::Clean) => Ok(Some(payload.to_vec())),
        _ => Err(ClusterError::Undecodable {
            path: path.to_path_buf(),
            detail: format!(
                "expected one whole frame, found {} and {:?}",
                scan.frames.len(),
                scan.tail
            ),
        }),
    }
}

struct WriterThread {
    sync_since: Arc<Mutex<Option<Instant>>>,
    dir: PathBuf,
    segments: Segments,
    /// `raft.synced` (see the module's comment).
    synced: File,
    gate: SyncGate,
    /// The first I/O error; every later job fails with it.
    failed: Option<(io::ErrorKind, String)>,
}

impl WriterThread {
    fn run(mut self, jobs: &mpsc::Receiver<Job>) {
        let mut next = jobs.recv().ok();
        while let Some(job) = next.take() {
            match job {
                Job::Append { at, frames, done } => {
                    // Gather every append already queued behind this one:
                    // one fdatasync covers them all.
                    let mut dones = vec![done];
                    let mut end = at + frames.len() as u64;
                    let mut result = self.write_at(at, &frames);
                    loop {
                        match jobs.try_recv() {
                            Ok(Job::Append { at, frames, done }) => {
                                if result.is_ok() {
                                    result = self.write_at(at, &frames);
                                }
                                end = end.max(at + frames.len() as u64);
                                dones.push(done);
                            }
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let result = result
                        .and_then(|()| self.sync_log())
                        .and_then(|()| self.mark_synced(end, false));
                    for done in dones {
                        done(self.copy(&result));
                    }
                }
                Job::Truncate { len, done } => {
                    let result = self
                        .check()
                        .and_then(|()| self.mark_synced(len, true))
                        .and_then(|()| self.segments.cut(len))
                        .and_then(|()| self.sync_log());
                    let result = self.remember(result);
                    done(result);
                }
                Job::Replace { name, frame, done } => {
                    let result = self.check().and_then(|()| self.replace(name, &frame));
                    let result = self.remember(result);
                    done(result);
                }
                Job::DropHead { from, done } => {
                    let result = self.check().map(|()| self.segments.drop_before(from));
                    let result = self.remember(result);
                    done(result);
                }
            }
            if next.is_none() {
                next = jobs.recv().ok();
            }
        }
    }

    fn write_at(&mut self, at: u64, frames: &[u8]) -> io::Result<()> {
        self.check()?;
        let result = self.segments.write(at, frames);
        self.remember(result)
    }

    /// fdatasyncs what the appends since the last one wrote: the segment
    /// appended to and any segment a roll left behind them.
    fn sync_log(&mut self) -> io::Result<()> {
        self.check()?;
        let mut result = Ok(());
        for full in self.segments.take_rolled() {
            result = result.and_then(|()| self.sync(&full));
        }
        let result = result.and_then(|()| self.sync(self.segments.current()));
        self.remember(result)
    }

    /// Records that `raft.log` holds `len` synced bytes. Made durable only
    /// when `durable` (before the log is shortened: a mark left above a
    /// shortened log would put a healthy node on probation); after an
    /// append's fdatasync a lost mark only means a weaker check.
    fn mark_synced(&mut self, len: u64, durable: bool) -> io::Result<()> {
        let mut result = self.synced.write_all_at(&len.to_le_bytes(), 0);
        if durable {
            result = result.and_then(|()| self.sync(&self.synced));
        }
        self.remember(result)
    }

    fn replace(&self, name: &str, frame: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut file = File::create(&tmp)?;
        file.write_all(frame)?;
        self.sync(&file)?;
        fs::rename(&tmp, self.dir.join(name))?;
        File::open(&self.dir)?.sync_all()
    }

    /// fdatasync, with the time it runs visible to [`Writer::sync_running_for`].
    fn sync(&self, file: &File) -> io::Result<()> {
        *self.sync_since.lock() = Some(Instant::now());
        self.gate.pass();
        let result = file.sync_data();
        *self.sync_since.lock() = None;
        result
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some((kind, msg)) => Err(io::Error::new(
                *kind,
                format!("the Raft log failed earlier: {msg}"),
            )),
        }
    }

    fn remember(&mut self, result: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &result {
            if self.failed.is_none() {
                tracing::error!(dir = %self.dir.display(), error = %e, "Raft log I/O failed; this node stops writing");
                self.failed = Some((e.kind(), e.to_string()));
            }
        }
        result
    }

    fn copy(&self, result: &io::Result<()>) -> io::Result<()> {
        match result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_testdir::TestDir;

    fn seg0(dir: &Path) -> PathBuf {
        dir.join(crate::log_segments::segment_name(0))
    }

    fn frames(payloads: &[&[u8]]) -> Vec<u8> {
        payloads.iter().flat_map(|p| encode_frame(p)).collect()
    }

    #[test]
    fn a_frame_written_in_place_is_the_frame_encode_makes() {
        let payloads: [&[u8]; 3] = [b"", b"alpha", &[7; 70_000]];
        let mut out = Vec::new();
        for p in payloads {
            append_frame(&mut out, |o| {
                o.extend_from_slice(p);
                Ok::<(), ()>(())
            })
            .unwrap();
        }
        assert_eq!(out, frames(&payloads));
        // A payload that fails to encode leaves the earlier frames whole.
        let err = append_frame(&mut out, |o| {
            o.extend_from_slice(b"half");
            Err("cannot encode")
        });
        assert_eq!(err, Err("cannot encode"));
        assert_eq!(out, frames(&payloads));
    }

    #[test]
    fn every_row_of_the_decision_table() {
        let two = frames(&[b"one", b"two"]);
        let first_len = (FRAME_HEADER_BYTES + 3) as u64;
        // Clean.
        let s = scan(&two);
        assert_eq!(s.tail, Tail::Clean);
        assert_eq!(s.frames.len(), 2);
        // Fewer bytes than a header.
        let s = scan(&two[..FRAME_HEADER_BYTES + 3 + 5]);
        assert_eq!(s.tail, Tail::Torn { at: first_len });
        // Payload incomplete.
        let s = scan(&two[..two.len() - 1]);
        assert_eq!(s.tail, Tail::Torn { at: first_len });
        assert_eq!(s.frames.len(), 1);
        // Checksum mismatch in a complete frame.
        let mut flipped = two.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        assert_eq!(scan(&flipped).tail, Tail::Damaged { at: first_len });
        // A length past the frame limit.
        let mut huge = two;
        huge[first_len as usize..first_len as usize + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(scan(&huge).tail, Tail::Damaged { at: first_len });
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_damaged_frame_is_set_aside_and_cut() {
        let dir = TestDir::new("cluster-logfile");
        let good = frames(&[b"alpha", b"beta"]);
        let mut torn = good.clone();
        torn.extend_from_slice(&encode_frame(b"gamma")[..6]);
        fs::write(dir.join(LOG_FILE), &torn).unwrap();
        let (loaded, w) = open(&dir, SyncGate::default()).unwrap();
        drop(w);
        assert_eq!(loaded.entries.len(), 2);
        assert_eq!(loaded.log_end, good.len() as u64);
        assert_eq!(
            loaded.damaged_at, None,
            "a torn tail was never acknowledged: no probation"
        );
        assert_eq!(fs::metadata(seg0(&dir)).unwrap().len(), good.len() as u64);

        let second = (FRAME_HEADER_BYTES + 5) as u64;
        let mut damaged = good.clone();
        damaged[second as usize + FRAME_HEADER_BYTES] ^= 1;
        fs::write(seg0(&dir), &damaged).unwrap();
        let (loaded, _w) = open(&dir, SyncGate::default()).unwrap();
        assert_eq!(loaded.damaged_at, Some(second));
        assert_eq!(loaded.entries.len(), 1);
        assert_eq!(fs::metadata(seg0(&dir)).unwrap().len(), second);
        let aside = fs::read(dir.join(format!("{LOG_FILE}.damaged-{second}"))).unwrap();
        assert_eq!(
            aside,
            damaged[second as usize..],
            "the damaged bytes are kept for inspection"
        );
    }

    #[test]
    fn an_entry_holding_the_largest_message_is_a_frame_not_damage() {
        // One message of the largest size a store record holds (129 MiB,
        // above the old 64 MiB frame limit) is one command, one entry.
        let payload = vec![7u8; 129 * 1024 * 1024 + 4096];
        let bytes = encode_frame(&payload);
        let scan = scan(&bytes);
        assert_eq!(scan.tail, Tail::Clean);
        assert_eq!(scan.frames.len(), 1);
    }

    /// Appends `frames` through a writer and waits for the fdatasync.
    fn append_synced(writer: &Writer, at: u64, frames: Vec<u8>) {
        let (tx, rx) = mpsc::channel();
        writer.append(at, frames, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv().unwrap().unwrap();
    }

    /// Appends gathered into one batch may fill a segment and start the
    /// next; the one fdatasync of the batch then covered only the new
    /// segment, and the old one's last frames were reported durable
    /// unsynced (seen failing: 1 fdatasync for the batch, not 2).
    #[test]
    fn a_batch_that_rolls_to_a_new_segment_fdatasyncs_both() {
        let dir = TestDir::unmade("cluster-roll-sync");
        let gate = SyncGate::default();
        let (_, w) = open_with(&dir, gate.clone(), 100).unwrap();
        let first = frames(&[&[1; 32]]);
        let at = first.len() as u64;
        // The writer is held in the first append's fdatasync while the
        // next two are queued behind it: they are one batch.
        gate.close();
        let (tx, rx) = mpsc::channel();
        let done = |tx: &mpsc::Sender<io::Result<()>>| -> Done {
            let tx = tx.clone();
            Box::new(move |r| tx.send(r).unwrap())
        };
        w.append(0, first, done(&tx));
        let fills = frames(&[&[2; 70]]);
        let next = at + fills.len() as u64;
        std::thread::sleep(Duration::from_millis(50));
        w.append(at, fills, done(&tx));
        w.append(next, frames(&[&[3; 8]]), done(&tx));
        std::thread::sleep(Duration::from_millis(50));
        let before = gate.passed();
        gate.open();
        for _ in 0..3 {
            rx.recv().unwrap().unwrap();
        }
        assert_eq!(
            gate.passed() - before,
            2,
            "the batch that left segment 0 full and wrote segment {next} fdatasyncs both"
        );
        assert!(dir.join(crate::log_segments::segment_name(next)).exists());
    }

    #[test]
    fn a_log_shorter_than_what_was_synced_is_found_even_on_a_frame_boundary() {
        let dir = TestDir::unmade("cluster-synced");
        let (_, w) = open(&dir, SyncGate::default()).unwrap();
        let good = frames(&[b"alpha", b"beta", b"gamma"]);
        append_synced(&w, 0, good.clone());
        drop(w);
        let (loaded, w) = open(&dir, SyncGate::default()).unwrap();
        drop(w);
        assert_eq!(loaded.damaged_at, None, "an intact log is not on probation");

        // Lose the last frame: the log still ends on a frame boundary.
        let two = 2 * FRAME_HEADER_BYTES as u64 + 9;
        fs::write(seg0(&dir), &good[..two as usize]).unwrap();
        let (loaded, w) = open(&dir, SyncGate::default()).unwrap();
        assert_eq!(loaded.entries.len(), 2);
        assert_eq!(
            loaded.damaged_at,
            Some(two),
            "acknowledged bytes are gone: the node must catch up before it votes"
        );

        // A truncation by Raft lowers the mark first: no probation after it.
        let (tx, rx) = mpsc::channel();
        w.truncate(
            FRAME_HEADER_BYTES as u64 + 5,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        rx.recv().unwrap().unwrap();
        drop(w);
        let (loaded, _w) = open(&dir, SyncGate::default()).unwrap();
        assert_eq!(loaded.entries.len(), 1);
        assert_eq!(loaded.damaged_at, None, "a log Raft truncated is whole");
    }

    /// The purge of a log's head used to copy every kept byte into a new
    /// file while appends waited (with 1,000 kept entries of ~600 KB, over
    /// two seconds: long enough for the followers to elect another
    /// leader). Now it deletes whole segments and touches nothing kept.
    #[test]
    fn dropping_the_head_deletes_whole_segments_and_copies_nothing() {
        use std::os::unix::fs::MetadataExt;
        let dir = TestDir::unmade("cluster-drop");
        let (_, w) = open_with(&dir, SyncGate::default(), 1024).unwrap();
        let mut at = 0;
        let mut offsets = Vec::new();
        for i in 0..40u8 {
            let f = encode_frame(&[i; 200]);
            offsets.push(at);
            append_synced(&w, at, f.clone());
            at += f.len() as u64;
        }
        let inodes = |dir: &Path| -> Vec<u64> {
            fs::read_dir(dir)
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("raft."))
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                // The reaper may delete a segment between the listing and
                // this look: a file gone by now is not one kept.
                .filter_map(|e| e.metadata().ok().map(|m| m.ino()))
                .collect()
        };
        let before = inodes(&dir);
        let (tx, rx) = mpsc::channel();
        w.drop_head(offsets[30], Box::new(move |r| tx.send(r).unwrap()));
        rx.recv().unwrap().unwrap();
        // The reaper thread deletes them.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut after = inodes(&dir);
        while after.len() * 2 >= before.len() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
            after = inodes(&dir);
        }
        assert!(
            after.iter().all(|i| before.contains(i)),
            "the purge wrote a new file: inodes {before:?} became {after:?}"
        );
        assert!(
            after.len() < before.len() / 2,
            "segments behind the purge point were kept: {after:?}"
        );
        drop(w);
        let (loaded, _w) = open_with(&dir, SyncGate::default(), 1024).unwrap();
        assert_eq!(loaded.damaged_at, None);
        let firsts: Vec<u8> = loaded.entries.iter().map(|(_, p)| p[0]).collect();
        assert!(
            firsts.ends_with(&(30..40).collect::<Vec<u8>>()),
            "{firsts:?}"
        );
        assert_eq!(loaded.entries.last().unwrap().0, offsets[39]);
    }

    #[test]
    fn completions_wait_for_the_gate_and_keep_their_order() {
        let dir = TestDir::unmade("cluster-gate");
        let gate = SyncGate::default();
        let (_, writer) = open(&dir, gate.clone()).unwrap();
        let (tx, rx) = mpsc::channel();
        gate.close();
        let mut at = 0;
        for i in 0..3u8 {
            let f = encode_frame(&[i; 10]);
            let tx = tx.clone();
            writer.append(
                at,
                f.clone(),
                Box::new(move |r| tx.send((i, r.is_ok())).unwrap()),
            );
            at += f.len() as u64;
        }
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "reported durable before fdatasync"
        );
        gate.open();
        let got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, vec![(0, true), (1, true), (2, true)]);
        drop(writer);
        let (loaded, _w) = open(&dir, SyncGate::default()).unwrap();
        assert_eq!(loaded.entries.len(), 3);
    }
}
