//! The event log's writers: one thread per log group appends that group's
//! events to its own files (never one shared file on the hot path),
//! rotating and retiring them by size and age; an optional merge thread
//! combines them into one time-ordered log every `merge_interval_s`.
//!
//! Batching: callers append framed records to the group's pending buffer
//! under a short lock; the group's event writer, woken by the first one,
//! gathers for [`EVENT_GATHER_MS`] (or until half the buffer is full),
//! then takes the whole buffer and writes it with one `write`; whatever
//! arrives meanwhile is the next batch. Event files are not
//! fdatasync'ed per batch (they are a diagnostic record, not a promise to a
//! client): they are synced when a file is sealed and at shutdown, and a
//! crash may tear the tail, which readers skip.
//!
//! Invariants:
//! - Time and sequence are assigned under the group's lock, in the order
//!   records enter the buffer, which is file order: per group, `seq` is
//!   +1 per record and `time_us` never decreases (the clock is clamped).
//! - The pending buffer never exceeds `buffer_bytes_max`: past it, events
//!   are counted as dropped (and logged), never block a publisher.
//! - A file never exceeds `file_bytes_max` (a batch that would overflow
//!   it goes to a new file; a batch is at most `buffer_bytes_max`, which
//!   is smaller).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use crate::file::{
    self, decode_events, encode_event, event_file_name, EventRecord, EventTail,
    EVENT_FILE_HEADER_BYTES, EVENT_FILE_MAGIC, EVENT_HEADER_BYTES, EVENT_PAYLOAD_BYTES_MAX,
    GROUP_EVENT_FILE_PREFIX, MERGED_EVENT_FILE_PREFIX,
};
use crate::EVENT_GATHER_MS;
use berth_store::storage::{OsStorage, Storage, StorageFile};
use berth_store::StoreError;
use berth_store::{group_of, QueueId};

/// Microseconds since the Unix epoch, from the caller's clock (the
/// broker's).
pub type EventClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Where and how the event log writes. Defaults are the server's
/// (`event_log.*` in docs/CONFIG.md).
#[derive(Clone, Debug)]
pub struct EventLogConfig {
    /// One directory per log group, in group order.
    pub group_dirs: Vec<PathBuf>,
    /// Where the merged (combined) files go.
    pub merged_dir: PathBuf,
    /// A file is sealed and a new one started before it would exceed this.
    pub file_bytes_max: u64,
    /// Oldest sealed files are removed while a group's (or the merged
    /// log's) files together exceed this.
    pub retained_bytes_max: u64,
    /// Sealed files whose last write is older than this are removed
    /// (0 = no age limit).
    pub retention_s: u64,
    /// Pending (unwritten) bytes per group; past it events are dropped.
    pub buffer_bytes_max: usize,
    /// Merge every this many seconds into the combined log (0 = never).
    pub merge_interval_s: u64,
}

impl EventLogConfig {
    /// Checks the bounds the writers rely on.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |m: String| Err(StoreError::Config(m));
        let min = (EVENT_FILE_HEADER_BYTES + EVENT_HEADER_BYTES + EVENT_PAYLOAD_BYTES_MAX) as u64;
        if self.file_bytes_max < 2 * min {
            return bad(format!(
                "event_log.file_bytes_max must be at least {} (it is {})",
                2 * min,
                self.file_bytes_max
            ));
        }
        if (self.buffer_bytes_max as u64) > self.file_bytes_max / 2
            || self.buffer_bytes_max < min as usize
        {
            return bad(format!(
                "event_log.buffer_bytes_max must be between {min} and half of event_log.file_bytes_max ({}); it is {}",
                self.file_bytes_max / 2,
                self.buffer_bytes_max
            ));
        }
        if self.retained_bytes_max < self.file_bytes_max {
            return bad(format!(
                "event_log.retained_bytes_max ({}) must be at least event_log.file_bytes_max ({})",
                self.retained_bytes_max, self.file_bytes_max
            ));
        }
        Ok(())
    }
}

/// A group's pending events, shared by appenders and its writer.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    next_seq: u64,
    last_time_us: u64,
    /// Records appended so far (the writer reports how far it wrote).
    appended: u64,
    dropped: u64,
    stop: bool,
}

struct GroupEvents {
    state: Mutex<Pending>,
    wake: Condvar,
    /// Records written to the file so far (`appended` of the last batch).
    written: Mutex<u64>,
    written_cv: Condvar,
}

/// Tells the merge thread to do its last merge and stop.
type StopSignal = Arc<(Mutex<bool>, Condvar)>;

/// The running event log. Dropping it without [`EventLog::close`] leaves
/// the threads to finish on their own.
pub struct EventLog {
    groups: Vec<Arc<GroupEvents>>,
    clock: EventClock,
    buffer_bytes_max: usize,
    writers: Mutex<Vec<JoinHandle<()>>>,
    merger: Mutex<Option<(StopSignal, JoinHandle<()>)>>,
    dropped_total: Arc<AtomicU64>,
}

impl EventLog {
    /// Starts a writer per group (each on a new file, numbered after the
    /// existing ones, its sequence continuing theirs) and, if asked, the
    /// merge thread.
    pub fn open(config: EventLogConfig, clock: EventClock) -> Result<Self, StoreError> {
        config.validate()?;
        let storage: Arc<dyn Storage> = Arc::new(OsStorage);
        let mut groups = Vec::new();
        let mut writers = Vec::new();
        let mut starts = Vec::new();
        let dropped_total = Arc::new(AtomicU64::new(0));
        for (g, dir) in config.group_dirs.iter().enumerate() {
            let g = u32::try_from(g).expect("group count is a u32");
            let (files, last) = FileSet::open(
                Arc::clone(&storage),
                dir.clone(),
                GROUP_EVENT_FILE_PREFIX,
                &config,
            )?;
            starts.push(files.no);
            let ge = Arc::new(GroupEvents {
                state: Mutex::new(Pending {
                    next_seq: last.as_ref().map_or(1, |r| r.seq + 1),
                    last_time_us: last.as_ref().map_or(0, |r| r.time_us),
                    ..Pending::default()
                }),
                wake: Condvar::new(),
                written: Mutex::new(0),
                written_cv: Condvar::new(),
            });
            let me = Arc::clone(&ge);
            let dropped = Arc::clone(&dropped_total);
            let t = std::thread::Builder::new()
                .name(format!("berth-events-{g}"))
                .spawn(move || write_loop(&me, files, g, &dropped))
                .map_err(|e| StoreError::io("spawn event writer", dir, e))?;
            writers.push(t);
            groups.push(ge);
        }
        let log = Self {
            groups,
            clock,
            buffer_bytes_max: config.buffer_bytes_max,
            writers: Mutex::new(writers),
            merger: Mutex::new(None),
            dropped_total,
        };
        if config.merge_interval_s > 0 {
            let (merged, _) = FileSet::open(
                Arc::clone(&storage),
                config.merged_dir.clone(),
                MERGED_EVENT_FILE_PREFIX,
                &config,
            )?;
            let tails = config
                .group_dirs
                .iter()
                .zip(starts)
                .map(|(d, no)| EventTail::from_file(d.clone(), GROUP_EVENT_FILE_PREFIX, no))
                .collect();
            let stop = Arc::new((Mutex::new(false), Condvar::new()));
            let m = Merger {
                storage,
                tails,
                pending: vec![VecDeque::new(); config.group_dirs.len()],
                out: merged,
                groups: log.groups.clone(),
                clock: Arc::clone(&log.clock),
            };
            let interval = Duration::from_secs(config.merge_interval_s);
            let s = Arc::clone(&stop);
            let t = std::thread::Builder::new()
                .name("berth-events-merge".into())
                .spawn(move || m.run(interval, &s))
                .map_err(|e| StoreError::io("spawn event merger", &config.merged_dir, e))?;
            *log.merger.lock() = Some((stop, t));
        }
        Ok(log)
    }

    /// The group that `key`'s events go to: the same as a queue with that
    /// id (the broker passes a durable queue's store id, so its events sit
    /// beside its records).
    pub fn group_of(&self, key: u64) -> u32 {
        group_of(
            QueueId(key),
            u32::try_from(self.groups.len()).expect("a u32"),
        )
    }

    /// Appends one event for `key`'s group, stamped now. Never blocks on
    /// I/O: if the group's writer is `buffer_bytes_max` behind, the event
    /// is dropped and counted. Payloads over [`EVENT_PAYLOAD_BYTES_MAX`]
    /// are cut (the broker's encoding is bounded well below it).
    pub fn append(&self, key: u64, payload: &[u8]) {
        let g = self.group_of(key);
        let ge = &self.groups[g as usize];
        let payload = &payload[..payload.len().min(EVENT_PAYLOAD_BYTES_MAX)];
        let mut st = ge.state.lock();
        if st.buf.len() + EVENT_HEADER_BYTES + payload.len() > self.buffer_bytes_max {
            st.dropped += 1;
            return;
        }
        let t = (self.clock)().max(st.last_time_us);
        st.last_time_us = t;
        let seq = st.next_seq;
        st.next_seq += 1;
        st.appended += 1;
        let was_empty = st.buf.is_empty();
        let half = self.buffer_bytes_max / 2;
        let below_half = st.buf.len() < half;
        encode_event(&mut st.buf, t, g, seq, payload);
        // Wake the writer for the first event (it then gathers for
        // EVENT_GATHER_MS) and again when half the buffer is full.
        let wake = was_empty || (below_half && st.buf.len() >= half);
        drop(st);
        if wake {
            ge.wake.notify_one();
        }
    }

    /// Events dropped so far because a writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.dropped_total.load(Ordering::Relaxed)
            + self
                .groups
                .iter()
                .map(|g| g.state.lock().dropped)
                .sum::<u64>()
    }

    /// Writes what is pending, stops the writers (syncing their files),
    /// then runs a last merge.
    pub fn close(&self) {
        for g in &self.groups {
            g.state.lock().stop = true;
            g.wake.notify_one();
        }
        for t in self.writers.lock().drain(..) {
            if t.join().is_err() {
                tracing::error!("an event writer thread panicked");
            }
        }
        if let Some((stop, t)) = self.merger.lock().take() {
            *stop.0.lock() = true;
            stop.1.notify_one();
            if t.join().is_err() {
                tracing::error!("the event merge thread panicked");
            }
        }
    }
}

fn write_loop(ge: &GroupEvents, mut files: FileSet, group: u32, dropped_total: &AtomicU64) {
    let mut spare = Vec::new();
    let mut last_warn: Option<Instant> = None;
    let gather = Duration::from_millis(EVENT_GATHER_MS);
    loop {
        let (mut batch, appended, dropped) = {
            let mut st = ge.state.lock();
            while st.buf.is_empty() && !st.stop {
                ge.wake.wait(&mut st);
            }
            if st.buf.is_empty() {
                break;
            }
            if !st.stop {
                // Gather: woken early only by a half-full buffer or stop.
                let _gathered_or_woken = ge.wake.wait_for(&mut st, gather);
            }
            let batch = std::mem::replace(&mut st.buf, std::mem::take(&mut spare));
            (batch, st.appended, std::mem::take(&mut st.dropped))
        };
        if dropped > 0 {
            dropped_total.fetch_add(dropped, Ordering::Relaxed);
            if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                last_warn = Some(Instant::now());
                tracing::warn!(group, dropped, "event log writer fell behind; events were dropped (raise event_log.buffer_bytes_max or use faster disks)");
            }
        }
        if let Err(e) = files.append(&batch) {
            tracing::error!(group, error = %e, "cannot write events; this batch is lost");
        }
        batch.clear();
        spare = batch;
        *ge.written.lock() = appended;
        ge.written_cv.notify_all();
    }
    if let Err(e) = files.seal() {
        tracing::error!(group, error = %e, "cannot sync the last event file");
    }
    *ge.written.lock() = u64::MAX;
    ge.written_cv.notify_all();
}

/// One directory's event files: the active one, and the sealed ones kept
/// for retention.
struct FileSet {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    prefix: &'static str,
    no: u64,
    file: Arc<dyn StorageFile>,
    len: u64,
    /// Sealed files, oldest first: number, bytes, when last written.
    sealed: VecDeque<(u64, u64, SystemTime)>,
    file_bytes_max: u64,
    retained_bytes_max: u64,
    retention: Option<Duration>,
}

impl FileSet {
    /// Opens `dir`'s files with `prefix` and starts a new one; returns the
    /// last valid record of the newest existing file, if any (so a
    /// group's sequence continues).
    fn open(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        prefix: &'static str,
        config: &EventLogConfig,
    ) -> Result<(Self, Option<EventRecord>), StoreError> {
        storage
            .create_dir_all(&dir)
            .map_err(|e| StoreError::io("create dir", &dir, e))?;
        let nos = file::list_event_files(storage.as_ref(), &dir, prefix)?;
        let mut sealed = VecDeque::new();
        for &n in &nos {
            let path = dir.join(event_file_name(prefix, n));
            let meta = std::fs::metadata(&path).map_err(|e| StoreError::io("stat", &path, e))?;
            let at = meta.modified().unwrap_or_else(|_| SystemTime::now());
            sealed.push_back((n, meta.len(), at));
        }
        let mut last = None;
        if let Some(&n) = nos.last() {
            let mut tail = EventTail::from_file(dir.clone(), prefix, n);
            let mut recs = Vec::new();
            tail.poll(storage.as_ref(), &mut recs)?;
            last = recs.pop();
        }
        let no = nos.last().map_or(1, |n| n + 1);
        let (file, len) = new_file(storage.as_ref(), &dir, prefix, no)?;
        let mut set = Self {
            storage,
            dir,
            prefix,
            no,
            file,
            len,
            sealed,
            file_bytes_max: config.file_bytes_max,
            retained_bytes_max: config.retained_bytes_max,
            retention: (config.retention_s > 0).then(|| Duration::from_secs(config.retention_s)),
        };
        set.retire();
        Ok((set, last))
    }

    /// Appends whole records, sealing the file first if they would not fit.
    fn append(&mut self, batch: &[u8]) -> Result<(), StoreError> {
        if self.len + batch.len() as u64 > self.file_bytes_max {
            self.seal()?;
            self.sealed
                .push_back((self.no, self.len, SystemTime::now()));
            self.no += 1;
            let (file, len) = new_file(self.storage.as_ref(), &self.dir, self.prefix, self.no)?;
            self.file = file;
            self.len = len;
        }
        let path = || self.dir.join(event_file_name(self.prefix, self.no));
        self.file
            .write_all_at(batch, self.len)
            .map_err(|e| StoreError::io("write", path(), e))?;
        self.len += batch.len() as u64;
        self.retire();
        Ok(())
    }

    fn seal(&self) -> Result<(), StoreError> {
        let path = self.dir.join(event_file_name(self.prefix, self.no));
        self.file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", &path, e))
    }

    /// Removes the oldest sealed files past the size or age bound.
    fn retire(&mut self) {
        let now = SystemTime::now();
        loop {
            let total: u64 = self.len + self.sealed.iter().map(|s| s.1).sum::<u64>();
            let Some(&(n, _, at)) = self.sealed.front() else {
                return;
            };
            let too_old = self
                .retention
                .is_some_and(|r| now.duration_since(at).is_ok_and(|age| age > r));
            if total <= self.retained_bytes_max && !too_old {
                return;
            }
            let path = self.dir.join(event_file_name(self.prefix, n));
            match self.storage.remove(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot remove an old event file");
                    return;
                }
            }
            self.sealed.pop_front();
        }
    }
}

fn new_file(
    storage: &dyn Storage,
    dir: &std::path::Path,
    prefix: &str,
    no: u64,
) -> Result<(Arc<dyn StorageFile>, u64), StoreError> {
    let path = dir.join(event_file_name(prefix, no));
    let file = storage
        .create(&path)
        .map_err(|e| StoreError::io("create", &path, e))?;
    file.write_all_at(&EVENT_FILE_MAGIC, 0)
        .map_err(|e| StoreError::io("write", &path, e))?;
    Ok((file, EVENT_FILE_HEADER_BYTES as u64))
}

/// The periodic merge into the combined log.
struct Merger {
    storage: Arc<dyn Storage>,
    tails: Vec<EventTail>,
    /// Per group: read but not yet merged (newer than the last watermark).
    pending: Vec<VecDeque<EventRecord>>,
    out: FileSet,
    groups: Vec<Arc<GroupEvents>>,
    clock: EventClock,
}

impl Merger {
    fn run(mut self, interval: Duration, stop: &(Mutex<bool>, Condvar)) {
        loop {
            let stopping = {
                let mut s = stop.0.lock();
                if !*s {
                    stop.1.wait_for(&mut s, interval);
                }
                *s
            };
            // Stopping: the writers are done, everything is on disk.
            let watermark = if stopping { u64::MAX } else { self.settle() };
            if let Err(e) = self.merge_upto(watermark) {
                tracing::error!(error = %e, "event merge failed; the combined log lags");
            }
            if stopping {
                if let Err(e) = self.out.seal() {
                    tracing::error!(error = %e, "cannot sync the combined event log");
                }
                return;
            }
        }
    }

    /// A time before which every event is on disk: read the clock, note
    /// each group's append count (an event appended later is stamped with
    /// a later clock reading), and wait (bounded) until the writers have
    /// written that far.
    fn settle(&self) -> u64 {
        let watermark = (self.clock)();
        let marks: Vec<u64> = self
            .groups
            .iter()
            .map(|g| g.state.lock().appended)
            .collect();
        for (g, mark) in self.groups.iter().zip(marks) {
            let mut w = g.written.lock();
            let deadline = Instant::now() + Duration::from_secs(5);
            while *w < mark {
                if g.written_cv.wait_until(&mut w, deadline).timed_out() {
                    tracing::warn!("an event writer is slow; merging what is written");
                    break;
                }
            }
        }
        watermark
    }

    fn merge_upto(&mut self, watermark: u64) -> Result<(), StoreError> {
        let mut streams = Vec::with_capacity(self.tails.len());
        for (tail, pending) in self.tails.iter_mut().zip(&mut self.pending) {
            let mut fresh = Vec::new();
            tail.poll(self.storage.as_ref(), &mut fresh)?;
            pending.extend(fresh);
            let n = pending.iter().take_while(|r| r.time_us < watermark).count();
            streams.push(pending.drain(..n).collect());
        }
        let merged = file::merge_events(streams);
        let mut buf = Vec::new();
        for r in merged {
            if buf.len() + EVENT_HEADER_BYTES + r.payload.len()
                > (self.out.file_bytes_max / 2) as usize
            {
                self.out.append(&buf)?;
                buf.clear();
            }
            encode_event(&mut buf, r.time_us, r.group, r.seq, &r.payload);
        }
        if !buf.is_empty() {
            self.out.append(&buf)?;
        }
        Ok(())
    }
}

/// Decodes a whole event file's bytes (for tests and tools): the records
/// after the magic, and whether it ended cleanly.
pub fn decode_file(bytes: &[u8]) -> (Vec<EventRecord>, bool) {
    let mut out = Vec::new();
    if bytes.len() < EVENT_FILE_HEADER_BYTES || bytes[..EVENT_FILE_HEADER_BYTES] != EVENT_FILE_MAGIC
    {
        return (out, false);
    }
    let (_, stop) = decode_events(&bytes[EVENT_FILE_HEADER_BYTES..], &mut out);
    (out, stop.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::read_all_groups;
    use berth_testdir::TestDir;

    #[test]
    fn concurrent_appends_are_ordered_per_group_and_the_last_merge_holds_them_all() {
        let (_dir, dir) = TestDir::unmade("event-log").and_path();
        let group_dirs: Vec<PathBuf> = (0..3).map(|g| dir.join(format!("g{g}"))).collect();
        let config = EventLogConfig {
            group_dirs: group_dirs.clone(),
            merged_dir: dir.clone(),
            file_bytes_max: 64 * 1024,
            retained_bytes_max: 64 * 1024 * 1024,
            retention_s: 0,
            buffer_bytes_max: 32 * 1024,
            merge_interval_s: 3600,
        };
        // A coarse clock makes many equal times: order must then come
        // from (group, seq).
        let clock: EventClock = Arc::new(|| {
            let t = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            u64::try_from(t.as_millis()).unwrap() * 1000
        });
        let log = Arc::new(EventLog::open(config, clock).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        log.append(t * 7 + i % 5, &i.to_le_bytes());
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        log.close();
        let dropped = log.dropped();
        let (all, damaged) = read_all_groups(&OsStorage, &group_dirs).unwrap();
        assert!(damaged.is_empty());
        assert_eq!(all.len() as u64 + dropped, 8000);
        for w in all.windows(2) {
            assert!(w[0].order_key() < w[1].order_key());
        }
        for g in 0..3 {
            let seqs: Vec<u64> = all.iter().filter(|r| r.group == g).map(|r| r.seq).collect();
            assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "group {g}");
        }
        // The final merge at close wrote every event, in the same order.
        let merged_no = file::list_event_files(&OsStorage, &dir, MERGED_EVENT_FILE_PREFIX).unwrap();
        let mut merged = Vec::new();
        for n in merged_no {
            let bytes =
                std::fs::read(dir.join(event_file_name(MERGED_EVENT_FILE_PREFIX, n))).unwrap();
            merged.extend(decode_file(&bytes).0);
        }
        assert_eq!(merged, all);
    }
}
