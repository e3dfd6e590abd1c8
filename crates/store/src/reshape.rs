//! Reshape: rewrites an existing store for another number of log groups or
//! another set of data directories (queue placement depends on both, so
//! neither can change in place).
//!
//! The steps, and what a crash after each leaves:
//!
//! | step | on disk afterwards | a crash here leaves |
//! |---|---|---|
//! | 1. plan, free-space check | nothing written | the old store |
//! | 2. copy into `DIR/reshape-staging/` of every new directory, verify it | old store untouched, a staging copy | the old store; the next start deletes the staging copy |
//! | 3. write `RESHAPE` (phase 1) in the first new directory: the commit point | | the new store; the next start finishes steps 4–5 |
//! | 4. move the old `MANIFEST` and `group-*` of each old directory into `DIR/reshape-old-<unix_s>/`; `RESHAPE` phase 2 | | the new store (step 4 is redone, then 5) |
//! | 5. move the staging `MANIFEST` and `group-*` up into each new directory; delete staging dirs, then `RESHAPE` | the new store, the old one kept aside | the new store (step 5 is redone) |
//!
//! Invariants:
//! - Nothing of the old store is modified before `RESHAPE` exists, and
//!   `RESHAPE` is written only after the staging copy was reopened,
//!   compared with the old store message by message and every record read
//!   back against its checksum.
//! - Every step after the commit point is idempotent (it moves what is
//!   still to be moved), so a crash during it is finished by the next start.
//! - The old store is never deleted by berth: it stays in
//!   `reshape-old-<unix_s>` for the operator to remove.
//! - The copy keeps the store id, every message id (so per-queue order)
//!   and the message id high-water mark; it gets a new record salt (a
//!   version-1 store, salt 0, thereby its first), its records being
//!   written afresh under it.

mod copy;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::manifest::{self, Manifest, MANIFEST_NAME};
use crate::segment;
use crate::storage::{self, Storage};

pub use copy::{copy_and_verify, CopyReport};

/// The staging directory a reshape writes the new store into, inside
/// each new data directory.
pub const STAGING_DIR: &str = "reshape-staging";
/// The commit record of a reshape, in the first new data directory.
pub const COMMIT_NAME: &str = "RESHAPE";
/// Prefix of the directory the old store is moved into (`reshape-old-<unix_s>`).
pub const OLD_DIR_PREFIX: &str = "reshape-old-";
/// Free space asked per new group beyond the old store's size: its first
/// checkpoints and the manifests.
pub const GROUP_MARGIN_BYTES: u64 = 1024 * 1024;

const COMMIT_MAGIC: &str = "berth-reshape 1";

/// What a reshape would do: from the store on disk to the configured shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshapePlan {
    pub store_id: u64,
    /// The old store's record salt (the copy gets a new one).
    pub record_salt: u32,
    /// The store's directories, in manifest order.
    pub old_dirs: Vec<PathBuf>,
    pub old_groups: u32,
    /// The configured directories, in order.
    pub new_dirs: Vec<PathBuf>,
    pub new_groups: u32,
    /// Bytes of every file of the old store's groups: an upper bound of
    /// what the copy (live records only) takes.
    pub old_store_bytes: u64,
}

impl ReshapePlan {
    /// Free bytes each filesystem holding a new directory must have.
    pub fn bytes_needed(&self) -> u64 {
        self.old_store_bytes + u64::from(self.new_groups) * GROUP_MARGIN_BYTES
    }

    /// One paragraph: what would change, what would happen, the disk needed.
    pub fn describe(&self) -> String {
        let dirs = |d: &[PathBuf]| {
            d.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = String::new();
        if self.old_groups != self.new_groups {
            let _ = write!(
                s,
                "store.log_groups {} on disk, {} configured; ",
                self.old_groups, self.new_groups
            );
        }
        if self.old_dirs != self.new_dirs {
            let _ = write!(
                s,
                "data directories [{}] on disk, [{}] configured; ",
                dirs(&self.old_dirs),
                dirs(&self.new_dirs)
            );
        }
        let _ = write!(
            s,
            "a reshape copies every live message and definition into a new store of {} group(s) \
             (in {STAGING_DIR}/ of each data directory), verifies it, then switches to it and \
             keeps the old store in {OLD_DIR_PREFIX}<unix_s>/ of its directories until you delete it; \
             it needs up to {} bytes free on each filesystem of the data directories \
             (the old store is {} bytes)",
            self.new_groups,
            self.bytes_needed(),
            self.old_store_bytes
        );
        s
    }
}

/// Compares the store on disk with the configured shape. `None`: there is
/// no store yet, or it already has this shape. `wanted_groups` is `None`
/// when the operator did not set a group count (an existing store keeps
/// its own).
pub fn plan(
    storage: &dyn Storage,
    data_dirs: &[PathBuf],
    wanted_groups: Option<u32>,
) -> Result<Option<ReshapePlan>, StoreError> {
    let mut found: Vec<(usize, Manifest)> = Vec::new();
    for (i, dir) in data_dirs.iter().enumerate() {
        if let Some(m) = read_manifest(storage, dir)? {
            found.push((i, m));
        }
    }
    let Some(&(_, first)) = found.first() else {
        return Ok(None);
    };
    let mut old_dirs: Vec<Option<PathBuf>> = vec![None; first.dir_count as usize];
    for (i, m) in &found {
        let dir = &data_dirs[*i];
        if m.store_id != first.store_id || m.dir_count != first.dir_count {
            return Err(StoreError::Reshape(format!(
                "{} holds another store's manifest (store {:016x}, directory {} of {}) than {} \
                 (store {:016x}); a data directory belongs to one store: remove it from the configuration",
                dir.display(),
                m.store_id,
                m.dir_index,
                m.dir_count,
                data_dirs[found[0].0].display(),
                first.store_id
            )));
        }
        match old_dirs.get_mut(m.dir_index as usize) {
            Some(slot @ None) => *slot = Some(dir.clone()),
            _ => {
                return Err(StoreError::Reshape(format!(
                    "{} claims to be directory {} of {} of store {:016x}, which another configured \
                     directory claims too or which does not exist; it was copied by hand: remove the copy",
                    dir.display(),
                    m.dir_index,
                    m.dir_count,
                    m.store_id
                )))
            }
        }
    }
    let old_dirs: Vec<PathBuf> = old_dirs
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            d.ok_or_else(|| {
                StoreError::Reshape(format!(
                    "data directory {i} of the {} of store {:016x} is not among the configured ones \
                     ({}); configure every directory of the store, in any order (berth store scan \
                     --data-dir DIR shows which directory is which); moving a store off a directory \
                     is not implemented",
                    first.dir_count,
                    first.store_id,
                    data_dirs
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let new_groups = wanted_groups.unwrap_or(first.group_count);
    if old_dirs == data_dirs && new_groups == first.group_count {
        return Ok(None);
    }
    for dir in data_dirs {
        if dir.to_str().is_none_or(|s| s.contains('\n')) {
            return Err(StoreError::Reshape(format!(
                "data directory {} is not valid UTF-8 without newlines, which a reshape's commit record needs; rename it",
                dir.display()
            )));
        }
        if old_dirs.contains(dir) {
            continue;
        }
        let names = storage.list(dir).unwrap_or_default();
        if let Some(n) = names
            .iter()
            .find(|n| *n == MANIFEST_NAME || n.starts_with("group-"))
        {
            return Err(StoreError::Reshape(format!(
                "new data directory {} already holds {n}; give a reshape empty new directories",
                dir.display()
            )));
        }
    }
    let mut old_store_bytes = 0u64;
    for g in 0..first.group_count {
        let gdir = old_dirs[g as usize % old_dirs.len()].join(format!("group-{g:04}"));
        let names = storage
            .list(&gdir)
            .map_err(|e| StoreError::io("list", &gdir, e))?;
        for n in names
            .iter()
            .filter(|n| *n != segment::PREPARED_SEGMENT_NAME)
        {
            let path = gdir.join(n);
            let f = storage
                .open_read(&path)
                .map_err(|e| StoreError::io("open", &path, e))?;
            old_store_bytes += f.len().map_err(|e| StoreError::io("stat", &path, e))?;
        }
    }
    Ok(Some(ReshapePlan {
        store_id: first.store_id,
        record_salt: first.record_salt,
        old_dirs,
        old_groups: first.group_count,
        new_dirs: data_dirs.to_vec(),
        new_groups,
        old_store_bytes,
    }))
}

fn read_manifest(storage: &dyn Storage, dir: &Path) -> Result<Option<Manifest>, StoreError> {
    match storage.list(dir) {
        Ok(names) if names.iter().any(|n| n == MANIFEST_NAME) => {
            let path = dir.join(MANIFEST_NAME);
            let bytes = manifest::read_all(storage, &path)?;
            Manifest::decode(&bytes, &path).map(Some)
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("list", dir, e)),
    }
}

/// Refuses the plan unless every filesystem holding a new directory has
/// [`ReshapePlan::bytes_needed`] free. Writes nothing. `free_bytes` is the
/// seam: the server passes `statvfs`, tests pass what they want.
pub fn check_free_space(
    plan: &ReshapePlan,
    free_bytes: &dyn Fn(&Path) -> io::Result<u64>,
) -> Result<(), StoreError> {
    let mut seen = BTreeSet::new();
    for dir in &plan.new_dirs {
        // A new directory may not exist yet: its nearest existing ancestor
        // is on the filesystem it will be created in.
        let at = dir
            .ancestors()
            .find(|a| a.exists())
            .unwrap_or(Path::new("/"));
        let dev = std::fs::metadata(at)
            .map_err(|e| StoreError::io("stat", at, e))?
            .dev();
        if !seen.insert(dev) {
            continue;
        }
        let free = free_bytes(at).map_err(|e| StoreError::io("statvfs", at, e))?;
        if free < plan.bytes_needed() {
            return Err(StoreError::Reshape(format!(
                "reshape refused before writing anything: the filesystem of {} has {free} bytes free, \
                 the reshape needs up to {} (the old store is {} bytes, plus {GROUP_MARGIN_BYTES} per new group); \
                 free some space, compact the store first (berth store compact), or add a data directory on another disk",
                dir.display(),
                plan.bytes_needed(),
                plan.old_store_bytes
            )));
        }
    }
    Ok(())
}

/// The commit record: which directories to switch, and how far it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// 1: the old store is still in place; 2: it is moved aside.
    pub phase: u32,
    pub old_aside: String,
    pub old_dirs: Vec<PathBuf>,
    pub new_dirs: Vec<PathBuf>,
}

impl Commit {
    fn encode(&self) -> Vec<u8> {
        let mut s = format!(
            "{COMMIT_MAGIC}\nphase {}\nold_aside {}\n",
            self.phase, self.old_aside
        );
        for d in &self.old_dirs {
            let _ = writeln!(s, "old_dir {}", d.display());
        }
        for d in &self.new_dirs {
            let _ = writeln!(s, "new_dir {}", d.display());
        }
        let crc = crc32c::crc32c(s.as_bytes());
        let _ = writeln!(s, "end {crc:08x}");
        s.into_bytes()
    }

    fn decode(bytes: &[u8], path: &Path) -> Result<Commit, StoreError> {
        let bad = |reason: &str| {
            StoreError::Reshape(format!(
            "the reshape commit record {} is damaged ({reason}); the new store's copy is complete in the \
             staging directories: restore from a backup or finish by hand (docs/OPERATIONS.md, Reshaping a store)",
            path.display()
        ))
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let body_end = text.rfind("end ").ok_or_else(|| bad("no end line"))?;
        let crc = u32::from_str_radix(text[body_end + 4..].trim(), 16)
            .map_err(|_| bad("bad checksum line"))?;
        if crc != crc32c::crc32c(&bytes[..body_end]) {
            return Err(bad("checksum mismatch"));
        }
        let mut lines = text[..body_end].lines();
        if lines.next() != Some(COMMIT_MAGIC) {
            return Err(bad("unknown magic"));
        }
        let mut c = Commit {
            phase: 0,
            old_aside: String::new(),
            old_dirs: Vec::new(),
            new_dirs: Vec::new(),
        };
        for line in lines {
            let (k, v) = line
                .split_once(' ')
                .ok_or_else(|| bad("line without value"))?;
            match k {
                "phase" => c.phase = v.parse().map_err(|_| bad("bad phase"))?,
                "old_aside" => c.old_aside = v.to_owned(),
                "old_dir" => c.old_dirs.push(PathBuf::from(v)),
                "new_dir" => c.new_dirs.push(PathBuf::from(v)),
                _ => return Err(bad("unknown key")),
            }
        }
        if !(1..=2).contains(&c.phase)
            || c.new_dirs.is_empty()
            || !c.old_aside.starts_with(OLD_DIR_PREFIX)
        {
            return Err(bad("incomplete"));
        }
        Ok(c)
    }
}

fn is_store_entry(name: &str) -> bool {
    name == MANIFEST_NAME || name.starts_with("group-")
}

fn write_commit(storage: &dyn Storage, c: &Commit) -> Result<(), StoreError> {
    storage::write_atomically(
        storage,
        &c.new_dirs[0],
        &format!("{COMMIT_NAME}.tmp"),
        COMMIT_NAME,
        &c.encode(),
    )
}

/// Moves the store entries of `from` into `to` (created if needed): what
/// is left to move, so a rerun after a crash finishes the job.
fn move_entries(storage: &dyn Storage, from: &Path, to: &Path) -> Result<(), StoreError> {
    let names = match storage.list(from) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("list", from, e)),
    };
    storage
        .create_dir_all(to)
        .map_err(|e| StoreError::io("create dir", to, e))?;
    for n in names.iter().filter(|n| is_store_entry(n)) {
        let (src, dst) = (from.join(n), to.join(n));
        storage
            .rename(&src, &dst)
            .map_err(|e| StoreError::io("rename", &src, e))?;
    }
    storage
        .sync_dir(to)
        .map_err(|e| StoreError::io("fsync dir", to, e))?;
    storage
        .sync_dir(from)
        .map_err(|e| StoreError::io("fsync dir", from, e))
}

/// Deletes a staging directory (`MANIFEST`, `group-*` holding files).
fn remove_staging(storage: &dyn Storage, staging: &Path) -> Result<(), StoreError> {
    let names = match storage.list(staging) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("list", staging, e)),
    };
    for n in names {
        let path = staging.join(&n);
        if n.starts_with("group-") {
            let files = storage
                .list(&path)
                .map_err(|e| StoreError::io("list", &path, e))?;
            for f in files {
                let fp = path.join(f);
                storage
                    .remove(&fp)
                    .map_err(|e| StoreError::io("remove", &fp, e))?;
            }
            storage
                .remove_dir(&path)
                .map_err(|e| StoreError::io("remove dir", &path, e))?;
        } else {
            storage
                .remove(&path)
                .map_err(|e| StoreError::io("remove", &path, e))?;
        }
    }
    storage
        .remove_dir(staging)
        .map_err(|e| StoreError::io("remove dir", staging, e))?;
    if let Some(parent) = staging.parent() {
        storage
            .sync_dir(parent)
            .map_err(|e| StoreError::io("fsync dir", parent, e))?;
    }
    Ok(())
}

/// Steps 4 and 5 from the commit record's phase on.
fn roll_forward(storage: &dyn Storage, mut c: Commit) -> Result<(), StoreError> {
    if c.phase == 1 {
        for d in &c.old_dirs {
            move_entries(storage, d, &d.join(&c.old_aside))?;
        }
        c.phase = 2;
        write_commit(storage, &c)?;
    }
    for d in &c.new_dirs {
        move_entries(storage, &d.join(STAGING_DIR), d)?;
    }
    for d in &c.new_dirs {
        remove_staging(storage, &d.join(STAGING_DIR))?;
    }
    let path = c.new_dirs[0].join(COMMIT_NAME);
    storage
        .remove(&path)
        .map_err(|e| StoreError::io("remove", &path, e))?;
    storage
        .sync_dir(&c.new_dirs[0])
        .map_err(|e| StoreError::io("fsync dir", &c.new_dirs[0], e))
}

/// What [`finish_interrupted`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupted {
    /// No reshape was under way.
    None,
    /// A reshape had committed: it was finished; the new store is in use.
    Finished { old_kept: Vec<PathBuf> },
    /// A reshape had not committed: its staging copies were deleted; the
    /// old store is in use.
    Discarded { staging: Vec<PathBuf> },
}

/// Run at every start before the store opens: finishes a committed reshape
/// a crash interrupted, or deletes the copy of one that had not committed.
pub fn finish_interrupted(
    storage: &dyn Storage,
    data_dirs: &[PathBuf],
) -> Result<Interrupted, StoreError> {
    for d in data_dirs {
        let names = match storage.list(d) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StoreError::io("list", d, e)),
        };
        if names.iter().any(|n| n == COMMIT_NAME) {
            let path = d.join(COMMIT_NAME);
            let c = Commit::decode(&manifest::read_all(storage, &path)?, &path)?;
            let old_kept = c.old_dirs.iter().map(|o| o.join(&c.old_aside)).collect();
            roll_forward(storage, c)?;
            return Ok(Interrupted::Finished { old_kept });
        }
    }
    let mut staging = Vec::new();
    for d in data_dirs {
        let s = d.join(STAGING_DIR);
        if storage.list(&s).is_ok() {
            remove_staging(storage, &s)?;
            staging.push(s);
        }
    }
    Ok(if staging.is_empty() {
        Interrupted::None
    } else {
        Interrupted::Discarded { staging }
    })
}

/// Commits a verified staging copy and switches to it (steps 3–5).
/// Returns where the old store was kept.
fn commit(
    storage: &dyn Storage,
    plan: &ReshapePlan,
    now_unix_s: u64,
) -> Result<Vec<PathBuf>, StoreError> {
    // Two reshapes in one second keep both old stores.
    let mut old_aside = format!("{OLD_DIR_PREFIX}{now_unix_s}");
    let mut n = 1;
    while plan.old_dirs.iter().any(|d| d.join(&old_aside).exists()) {
        old_aside = format!("{OLD_DIR_PREFIX}{now_unix_s}-{n}");
        n += 1;
    }
    let c = Commit {
        phase: 1,
        old_aside,
        old_dirs: plan.old_dirs.clone(),
        new_dirs: plan.new_dirs.clone(),
    };
    let kept = c.old_dirs.iter().map(|o| o.join(&c.old_aside)).collect();
    write_commit(storage, &c)?;
    roll_forward(storage, c)?;
    Ok(kept)
}

/// What a whole reshape did.
#[derive(Debug, Clone)]
pub struct ReshapeReport {
    pub copy: CopyReport,
    pub old_kept: Vec<PathBuf>,
}

/// Steps 2–5: copy, verify, commit, switch. The caller checked free space
/// ([`check_free_space`]) and holds the data directories' locks.
pub fn run(
    plan: &ReshapePlan,
    base: &crate::StoreConfig,
    storage: std::sync::Arc<dyn Storage>,
    now_unix_s: u64,
) -> Result<ReshapeReport, StoreError> {
    let copy = copy_and_verify(plan, base, std::sync::Arc::clone(&storage))?;
    let old_kept = commit(storage.as_ref(), plan, now_unix_s)?;
    Ok(ReshapeReport { copy, old_kept })
}

#[cfg(test)]
mod tests;
