//! A fault-injecting, in-memory [`Storage`] for tests: it remembers, for
//! every file and directory, what is durable (covered by a completed
//! `sync_data` / `sync_dir`) and what is only "in the page cache", and can
//! simulate a power loss, a process kill, torn writes, failing fsyncs and
//! bit flips.
//!
//! Invariants:
//! - After [`FaultStorage::kill_process`], every byte and entry reads as
//!   before (the page cache outlives the process), and what was unsynced
//!   stays unsynced: a later [`FaultStorage::crash`] still drops it. Only
//!   the handles die, with the process that held them.
//! - After [`FaultStorage::crash`], a file holds exactly its bytes as of its
//!   last successful `sync_data` (plus, with tearing on, a random prefix of
//!   what was written after it, possibly with garbage at its end), and a
//!   directory holds exactly its entries as of its last `sync_dir`.
//! - Handles opened before a crash fail every call afterwards, as a process
//!   that lost power would never issue another call.
//! - A failed `sync_data` makes nothing durable.
//! - With a capacity set ([`FaultStorage::set_capacity_bytes`]), a write
//!   that would take the files' total size beyond it writes the part that
//!   fits (a torn record, as a real `write` that ran out of blocks leaves)
//!   and fails with ENOSPC; shrinking a file always succeeds.
//! - Directories themselves are durable when created or removed (the store
//!   creates them once, with its manifests, whose write fsyncs their
//!   parent; the parent's own sync is not modelled).
//! - With [`FaultStorage::set_reorder_removals`], a removal is durable the
//!   moment it returns, ahead of every unsynced write and directory change
//!   (a journaling file system may commit an unlink before data written
//!   earlier to another file): the worst case for code that deletes a file
//!   because of data it has not synced yet.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::ManualClock;
use crate::storage::{Storage, StorageFile};

struct Node {
    /// What a read sees now.
    volatile: Vec<u8>,
    /// What survives a power loss.
    durable: Vec<u8>,
    /// Lowest offset changed since the last sync: `volatile` and `durable`
    /// agree below it, so a sync copies only the tail (keeps tests fast).
    dirty_from: usize,
    /// Every `drop_cache` call on this file, in order: there is no page
    /// cache to drop here, so tests read what the store asked for.
    cache_drops: Vec<CacheDrop>,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            volatile: Vec::new(),
            durable: Vec::new(),
            dirty_from: usize::MAX,
            cache_drops: Vec::new(),
        }
    }
}

/// One `drop_cache` call as [`FaultStorage::cache_drops`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheDrop {
    pub offset: u64,
    pub len: u64,
    /// Every byte of the range was synced (and written) when the call
    /// came: the only bytes a real page cache lets go of.
    pub clean: bool,
}

#[derive(Default)]
struct Dir {
    volatile: BTreeMap<String, usize>,
    durable: BTreeMap<String, usize>,
}

struct State {
    generation: u64,
    nodes: Vec<Node>,
    dirs: BTreeMap<PathBuf, Dir>,
    rng: StdRng,
    /// Successful `sync_data` calls left before they start failing.
    syncs_until_failure: Option<u64>,
    tear_on_crash: bool,
    sync_data_calls: u64,
    sync_latency: std::time::Duration,
    /// Each `sync_data` also moves this clock forward by the duration.
    sync_clock: Option<(Arc<ManualClock>, std::time::Duration)>,
    /// Between `crash` (or `kill_process`) and `power_on`: every call
    /// fails, as a machine without power (or a killed process) runs no
    /// code.
    down: bool,
    /// Removals become durable at once (see the module invariants).
    reorder_removals: bool,
    /// Successful removals (of names ending in the suffix) left before the
    /// power fails right after one.
    removes_until_crash: Option<(u64, &'static str)>,
    /// The next `sync_data` panics (a bug in the caller's thread).
    panic_on_sync: bool,
    /// The most bytes all files together may hold (a small disk that
    /// another process filled); `None`: unbounded.
    capacity_bytes: Option<u64>,
}

/// The fault-injecting storage. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct FaultStorage {
    state: Arc<Mutex<State>>,
}

struct FaultFile {
    state: Arc<Mutex<State>>,
    node: usize,
    generation: u64,
}

fn power_lost() -> io::Error {
    io::Error::other("simulated power loss: handle from before the crash")
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    Ok((dir, name.to_owned()))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl FaultStorage {
    /// A fresh, empty storage whose random choices (tearing) follow `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                generation: 0,
                nodes: Vec::new(),
                dirs: BTreeMap::new(),
                rng: StdRng::seed_from_u64(seed),
                syncs_until_failure: None,
                tear_on_crash: false,
                sync_data_calls: 0,
                sync_latency: std::time::Duration::ZERO,
                sync_clock: None,
                down: false,
                reorder_removals: false,
                removes_until_crash: None,
                panic_on_sync: false,
                capacity_bytes: None,
            })),
        }
    }

    /// Simulates a power loss: every byte and directory entry not covered by
    /// a completed sync is dropped (or torn, see [`Self::set_tear_on_crash`]),
    /// all open handles die, and every call fails until [`Self::power_on`].
    pub fn crash(&self) {
        Self::crash_locked(&mut self.state.lock());
    }

    fn crash_locked(st: &mut State) {
        st.generation += 1;
        st.down = true;
        let tear = st.tear_on_crash;
        let State {
            nodes, rng, dirs, ..
        } = st;
        for node in nodes.iter_mut() {
            let mut survived = node.durable.clone();
            if tear && node.volatile.len() > survived.len() && node.dirty_from >= survived.len() {
                let extra = &node.volatile[survived.len()..];
                let keep = rng.random_range(0..=extra.len());
                survived.extend_from_slice(&extra[..keep]);
                if keep > 0 && rng.random_bool(0.5) {
                    // The last sector made it only partly: garbage at its end.
                    let garbage = rng.random_range(1..=keep.min(64));
                    let len = survived.len();
                    for b in &mut survived[len - garbage..] {
                        *b = rng.random();
                    }
                }
            }
            node.volatile.clone_from(&survived);
            node.durable = survived;
            node.dirty_from = usize::MAX;
        }
        for dir in dirs.values_mut() {
            dir.volatile = dir.durable.clone();
        }
    }

    /// Simulates `kill -9` of the process using the storage: its open
    /// handles die and every call fails until [`Self::power_on`] (the next
    /// process starting), but nothing is lost and nothing becomes durable:
    /// written-but-unsynced bytes and entries are still read back, and are
    /// still lost by a later [`Self::crash`].
    pub fn kill_process(&self) {
        let mut st = self.state.lock();
        st.generation += 1;
        st.down = true;
    }

    /// Ends the outage begun by [`Self::crash`] or [`Self::kill_process`]:
    /// a new "boot" (or process) may open files.
    pub fn power_on(&self) {
        self.state.lock().down = false;
    }

    /// Whether the power is off (after a crash, before [`Self::power_on`]).
    pub fn is_down(&self) -> bool {
        self.state.lock().down
    }

    /// With `on`, every removal is durable as soon as it returns, ahead of
    /// unsynced data and directory changes made before it, as a journaling
    /// file system may order them.
    pub fn set_reorder_removals(&self, on: bool) {
        self.state.lock().reorder_removals = on;
    }

    /// The power fails right after the `n`-th next successful removal of a
    /// file whose name ends in `suffix` (counting from 1), the moment a
    /// deletion's consequences are at their most exposed. `None` disarms it.
    pub fn crash_after_removes(&self, n: Option<u64>, suffix: &'static str) {
        self.state.lock().removes_until_crash = n.map(|n| (n, suffix));
    }

    /// The next `sync_data` call panics instead of returning: stands for a
    /// bug in the calling thread, to test that its death is contained.
    pub fn panic_on_next_sync(&self) {
        self.state.lock().panic_on_sync = true;
    }

    /// With `on`, a crash keeps a random prefix of each file's unsynced
    /// bytes, sometimes ending in garbage (a torn write).
    pub fn set_tear_on_crash(&self, on: bool) {
        self.state.lock().tear_on_crash = on;
    }

    /// After `n` more successful `sync_data` calls, every later one fails
    /// with EIO (and makes nothing durable). `None` heals the disk.
    pub fn fail_syncs_after(&self, n: Option<u64>) {
        self.state.lock().syncs_until_failure = n;
    }

    /// Limits the bytes all files together may hold: a write beyond it
    /// writes what fits and fails with ENOSPC (`StorageFull`). `None`
    /// gives the space back.
    pub fn set_capacity_bytes(&self, capacity: Option<u64>) {
        self.state.lock().capacity_bytes = capacity;
    }

    /// Bytes all files hold now (what a read sees), for tests that fill
    /// the disk to just above it.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// Makes every `sync_data` take at least `latency` (like a real disk),
    /// so group commit has something to batch behind.
    pub fn set_sync_latency(&self, latency: std::time::Duration) {
        self.state.lock().sync_latency = latency;
    }

    /// Makes every `sync_data` take `latency` on `clock` (simulated time,
    /// read by a writer opened with that clock), on top of any real
    /// latency set with [`Self::set_sync_latency`].
    pub fn set_simulated_sync_latency(
        &self,
        clock: Arc<ManualClock>,
        latency: std::time::Duration,
    ) {
        self.state.lock().sync_clock = Some((clock, latency));
    }

    /// Number of `sync_data` calls so far (successful or not).
    pub fn sync_data_calls(&self) -> u64 {
        self.state.lock().sync_data_calls
    }

    /// Flips one bit of a file, durably: media damage.
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = Self::lookup(&st, path)?;
        let node = &mut st.nodes[id];
        let at = usize::try_from(offset).map_err(io::Error::other)?;
        for bytes in [&mut node.volatile, &mut node.durable] {
            if let Some(b) = bytes.get_mut(at) {
                *b ^= 1 << (bit % 8);
            }
        }
        Ok(())
    }

    /// Every `drop_cache` call made on the file now at `path`, oldest
    /// first (calls through handles of any name it had).
    pub fn cache_drops(&self, path: &Path) -> io::Result<Vec<CacheDrop>> {
        let st = self.state.lock();
        let id = Self::lookup(&st, path)?;
        Ok(st.nodes[id].cache_drops.clone())
    }

    /// Current contents of a file (what a read sees).
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.state.lock();
        let id = Self::lookup(&st, path)?;
        Ok(st.nodes[id].volatile.clone())
    }

    /// Replaces a file's contents durably (to build on-disk images).
    pub fn put_durable(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = Self::lookup(&st, path)?;
        st.nodes[id].volatile = bytes.to_vec();
        st.nodes[id].durable = bytes.to_vec();
        Ok(())
    }

    /// Names in `dir`, sorted.
    pub fn names(&self, dir: &Path) -> Vec<String> {
        let st = self.state.lock();
        let mut names = Self::entries(&st, dir).unwrap_or_default();
        names.sort();
        names
    }

    /// Files and subdirectories of `dir`, as `readdir` would list them.
    fn entries(st: &State, dir: &Path) -> Option<Vec<String>> {
        let d = st.dirs.get(dir)?;
        let mut names: Vec<String> = d.volatile.keys().cloned().collect();
        names.extend(
            st.dirs
                .keys()
                .filter(|p| p.parent() == Some(dir))
                .filter_map(|p| p.file_name()?.to_str().map(str::to_owned)),
        );
        Some(names)
    }

    fn lookup(st: &State, path: &Path) -> io::Result<usize> {
        let (dir, name) = split(path)?;
        st.dirs
            .get(&dir)
            .and_then(|d| d.volatile.get(&name))
            .copied()
            .ok_or_else(|| not_found(path))
    }

    fn handle(&self, node: usize, generation: u64) -> Arc<dyn StorageFile> {
        Arc::new(FaultFile {
            state: Arc::clone(&self.state),
            node,
            generation,
        })
    }
}

impl Storage for FaultStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let mut cur = Some(dir);
        while let Some(d) = cur {
            if d.as_os_str().is_empty() {
                break;
            }
            st.dirs.entry(d.to_path_buf()).or_default();
            cur = d.parent();
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        Self::entries(&st, dir).ok_or_else(|| not_found(dir))
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let (dir, name) = split(path)?;
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let generation = st.generation;
        if !st.dirs.contains_key(&dir) {
            return Err(not_found(&dir));
        }
        let id = st.nodes.len();
        st.nodes.push(Node::default());
        st.dirs.get_mut(&dir).map(|d| d.volatile.insert(name, id));
        Ok(self.handle(id, generation))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let id = Self::lookup(&st, path)?;
        Ok(self.handle(id, st.generation))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let id = st
            .dirs
            .get_mut(&from_dir)
            .and_then(|d| d.volatile.remove(&from_name))
            .ok_or_else(|| not_found(from))?;
        let d = st.dirs.get_mut(&to_dir).ok_or_else(|| not_found(&to_dir))?;
        d.volatile.insert(to_name, id);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let (dir, name) = split(path)?;
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let d = st.dirs.get_mut(&dir).ok_or_else(|| not_found(path))?;
        let id = d.volatile.remove(&name).ok_or_else(|| not_found(path))?;
        if st.reorder_removals {
            // Durable at once; other unsynced entries of `dir` stay unsynced.
            let d = st.dirs.get_mut(&dir).expect("looked up above");
            if d.durable.get(&name) == Some(&id) {
                d.durable.remove(&name);
            }
        }
        match &mut st.removes_until_crash {
            Some((n, suffix)) if name.ends_with(*suffix) => {
                if *n <= 1 {
                    st.removes_until_crash = None;
                    Self::crash_locked(&mut st);
                } else {
                    *n -= 1;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        match Self::entries(&st, dir) {
            None => Err(not_found(dir)),
            Some(names) if !names.is_empty() => Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{} is not empty", dir.display()),
            )),
            // Durable at once, as creation is (see the module invariants).
            Some(_) => {
                st.dirs.remove(dir);
                Ok(())
            }
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.down {
            return Err(power_lost());
        }
        let d = st.dirs.get_mut(dir).ok_or_else(|| not_found(dir))?;
        d.durable = d.volatile.clone();
        Ok(())
    }
}

impl State {
    /// Bytes of the files a directory lists (a removed file's space is
    /// free again, as once its last handle closes).
    fn used_bytes(&self) -> u64 {
        let linked: std::collections::BTreeSet<usize> = self
            .dirs
            .values()
            .flat_map(|d| d.volatile.values().copied())
            .collect();
        linked
            .into_iter()
            .map(|id| self.nodes[id].volatile.len() as u64)
            .sum()
    }
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(28) // ENOSPC: StorageFull
}

impl FaultFile {
    fn with<T>(&self, f: impl FnOnce(&mut State, usize) -> io::Result<T>) -> io::Result<T> {
        let mut st = self.state.lock();
        if st.generation != self.generation || st.down {
            return Err(power_lost());
        }
        f(&mut st, self.node)
    }
}

impl StorageFile for FaultFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|st, id| {
            let data = &st.nodes[id].volatile;
            let start = usize::try_from(offset).map_err(io::Error::other)?;
            let end = start + buf.len();
            if end > data.len() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
            }
            buf.copy_from_slice(&data[start..end]);
            Ok(())
        })
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(|st, id| {
            let start = usize::try_from(offset).map_err(io::Error::other)?;
            // What the other files leave of the capacity for this one.
            let room = st.capacity_bytes.map(|cap| {
                let others = st
                    .used_bytes()
                    .saturating_sub(st.nodes[id].volatile.len() as u64);
                usize::try_from(cap.saturating_sub(others)).unwrap_or(usize::MAX)
            });
            let node = &mut st.nodes[id];
            let wanted_end = start + buf.len();
            let end = room.map_or(wanted_end, |r| wanted_end.min(r.max(node.volatile.len())));
            if end <= start && !buf.is_empty() {
                return Err(no_space());
            }
            node.dirty_from = node.dirty_from.min(start);
            let data = &mut node.volatile;
            if data.len() < end {
                data.resize(end, 0);
            }
            data[start..end].copy_from_slice(&buf[..end - start]);
            if end < wanted_end {
                return Err(no_space());
            }
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let latency = {
            let mut st = self.state.lock();
            assert!(
                !std::mem::take(&mut st.panic_on_sync),
                "simulated bug: panic in sync_data"
            );
            if let Some((clock, simulated)) = &st.sync_clock {
                clock.advance(*simulated);
            }
            st.sync_latency
        };
        if !latency.is_zero() {
            // Outside the lock: other files' I/O proceeds meanwhile.
            std::thread::sleep(latency);
        }
        self.with(|st, id| {
            st.sync_data_calls += 1;
            match &mut st.syncs_until_failure {
                Some(0) => return Err(io::Error::other("simulated EIO from fdatasync")),
                Some(n) => *n -= 1,
                None => {}
            }
            let node = &mut st.nodes[id];
            let keep = node.dirty_from.min(node.durable.len());
            node.durable.truncate(keep);
            node.durable.extend_from_slice(&node.volatile[keep..]);
            node.dirty_from = usize::MAX;
            Ok(())
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with(|st, id| Ok(st.nodes[id].volatile.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|st, id| {
            let len = usize::try_from(len).map_err(io::Error::other)?;
            let node = &mut st.nodes[id];
            node.dirty_from = node.dirty_from.min(len.min(node.volatile.len()));
            node.volatile.resize(len, 0);
            Ok(())
        })
    }

    fn drop_cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.with(|st, id| {
            let node = &mut st.nodes[id];
            let end = offset.saturating_add(len);
            let clean = end <= node.durable.len() as u64
                && end <= node.volatile.len() as u64
                && node.dirty_from as u64 >= end;
            node.cache_drops.push(CacheDrop { offset, len, clean });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the power-loss model relies on: with reordering on, a removal
    /// survives a crash that loses data written (but not synced) before it.
    #[test]
    fn removal_can_reach_the_disk_before_unsynced_data() {
        let dir = Path::new("/d");
        for reorder in [false, true] {
            let fs = FaultStorage::new(1);
            fs.set_reorder_removals(reorder);
            fs.create_dir_all(dir).unwrap();
            let old = fs.create(&dir.join("old")).unwrap();
            old.write_all_at(b"copied away", 0).unwrap();
            old.sync_data().unwrap();
            let new = fs.create(&dir.join("new")).unwrap();
            fs.sync_dir(dir).unwrap();
            new.write_all_at(b"copied away", 0).unwrap(); // not synced
            fs.remove(&dir.join("old")).unwrap();
            fs.crash();
            fs.power_on();
            assert_eq!(fs.contents(&dir.join("new")).unwrap(), b"");
            assert_eq!(
                fs.names(dir).contains(&"old".to_owned()),
                !reorder,
                "reorder = {reorder}"
            );
        }
    }

    /// A process kill keeps the page cache: unsynced bytes read back after
    /// it, and a power loss later still drops them.
    #[test]
    fn process_kill_keeps_unsynced_data_until_a_power_loss() {
        let dir = Path::new("/d");
        let fs = FaultStorage::new(3);
        fs.create_dir_all(dir).unwrap();
        let f = fs.create(&dir.join("f")).unwrap();
        fs.sync_dir(dir).unwrap();
        f.write_all_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b" cached", 6).unwrap();
        fs.kill_process();
        assert!(f.len().is_err(), "the killed process's handle is dead");
        fs.power_on();
        assert_eq!(fs.contents(&dir.join("f")).unwrap(), b"synced cached");
        fs.crash();
        fs.power_on();
        assert_eq!(fs.contents(&dir.join("f")).unwrap(), b"synced");
    }

    #[test]
    fn crash_after_the_nth_matching_removal() {
        let dir = Path::new("/d");
        let fs = FaultStorage::new(2);
        fs.create_dir_all(dir).unwrap();
        for name in ["a.seg", "b.ckpt", "c.seg"] {
            fs.create(&dir.join(name)).unwrap();
        }
        fs.crash_after_removes(Some(2), ".seg");
        fs.remove(&dir.join("a.seg")).unwrap();
        fs.remove(&dir.join("b.ckpt")).unwrap();
        assert!(!fs.is_down());
        fs.remove(&dir.join("c.seg")).unwrap();
        assert!(fs.is_down());
    }
}
