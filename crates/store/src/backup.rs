//! Backup and restore of a whole store (`berth store backup|restore`),
//! online or offline, with a manifest so restore needs no hand-set
//! parameter.
//!
//! A backup directory `OUT` holds:
//!
//! ```text
//! OUT/BACKUP                       the backup manifest (text, below)
//! OUT/data/MANIFEST                a store manifest for one directory
//! OUT/data/group-<g:04>/...        every group's checkpoints and segments
//! ```
//!
//! so `OUT/data` is itself a valid one-directory store (`berth store
//! verify --data-dir OUT/data` checks it). `BACKUP` is line-oriented:
//!
//! ```text
//! berth-backup 1
//! store_format_version 1          segment and checkpoint format
//! manifest_version 2
//! store_id 0123456789abcdef
//! log_groups 4
//! source_data_dirs 2              how many directories the store had
//! segment_size_bytes 67108864     largest sealed segment seen (0: none)
//! broker_version 0.1.0
//! created_unix_s 1763900000
//! file <crc32c:08x> <bytes> <path relative to OUT>
//! ...
//! end <crc32c:08x of every byte before this line>
//! ```
//!
//! Invariants:
//! - A backup is one instant of the whole store: every file of every
//!   group is opened before any is copied (a handle stays readable after
//!   the broker reclaims its file), either with no broker running (the
//!   CLI holds its lock) or while every group's writer is paused
//!   (`Store::backup`); the newest segment is copied only up to its length
//!   at that moment, trimmed to its last whole record. The writer only
//!   appends, so each group's copy is a journal prefix recovery accepts.
//! - Everything confirmed before the backup started is in it (a confirmed
//!   record is written before its confirm, so it is within the cut), also
//!   a message dead-lettered between groups meanwhile (its Remove is
//!   written only after its copy is durable, so a cut with the Remove has
//!   the copy).
//! - `BACKUP` is written last, through a temp file and rename: a backup
//!   without it is incomplete and restore refuses it.
//! - Restore checks the format versions and every file's checksum before
//!   writing anything, writes only into empty directories, and writes the
//!   store manifests last.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::Rng;

use crate::checkpoint;
use crate::error::StoreError;
use crate::inspect::{read_file, Layout};
use crate::manifest::{self, Manifest, MANIFEST_NAME, MANIFEST_VERSION};
use crate::record::{self, Decoded};
use crate::segment::{self, FORMAT_VERSION, SEGMENT_HEADER_BYTES};
use crate::storage::{write_atomically, Storage, StorageFile};

/// Version of the backup layout and of the `BACKUP` file.
pub const BACKUP_FORMAT_VERSION: u32 = 1;
pub const BACKUP_NAME: &str = "BACKUP";
pub const BACKUP_DATA_DIR: &str = "data";
/// Bytes copied per read.
const COPY_CHUNK_BYTES: usize = 1024 * 1024;

/// One file of a backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupFile {
    /// Relative to the backup directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    pub crc32c: u32,
}

/// The parsed `BACKUP` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupManifest {
    pub store_format_version: u32,
    pub manifest_version: u32,
    pub store_id: u64,
    pub log_groups: u32,
    pub source_data_dirs: u32,
    pub record_salt: u32,
    pub segment_size_bytes: u64,
    pub broker_version: String,
    pub created_unix_s: u64,
    pub files: Vec<BackupFile>,
}

impl BackupManifest {
    pub fn encode(&self) -> String {
        let mut s = String::new();
        s += &format!("berth-backup {BACKUP_FORMAT_VERSION}\n");
        s += &format!("store_format_version {}\n", self.store_format_version);
        s += &format!("manifest_version {}\n", self.manifest_version);
        s += &format!("store_id {:016x}\n", self.store_id);
        s += &format!("log_groups {}\n", self.log_groups);
        s += &format!("source_data_dirs {}\n", self.source_data_dirs);
        s += &format!("record_salt {:08x}\n", self.record_salt);
        s += &format!("segment_size_bytes {}\n", self.segment_size_bytes);
        s += &format!("broker_version {}\n", self.broker_version);
        s += &format!("created_unix_s {}\n", self.created_unix_s);
        for f in &self.files {
            s += &format!("file {:08x} {} {}\n", f.crc32c, f.bytes, f.path);
        }
        let crc = crc32c::crc32c(s.as_bytes());
        s += &format!("end {crc:08x}\n");
        s
    }

    /// Parses and checks a `BACKUP` file; `path` names it in errors.
    pub fn decode(text: &[u8], path: &Path) -> Result<BackupManifest, StoreError> {
        let bad = |reason: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason,
        };
        let text = std::str::from_utf8(text).map_err(|e| bad(format!("not UTF-8: {e}")))?;
        let first = text.lines().next().unwrap_or_default();
        let Some(version) = first.strip_prefix("berth-backup ") else {
            return Err(bad("not a berth backup manifest".into()));
        };
        let version: u32 = version
            .trim()
            .parse()
            .map_err(|e| bad(format!("backup format version {version:?}: {e}")))?;
        if version != BACKUP_FORMAT_VERSION {
            return Err(StoreError::FormatVersion {
                path: path.to_path_buf(),
                found: version,
                expected: BACKUP_FORMAT_VERSION,
            });
        }
        let end_at = text
            .rfind("end ")
            .filter(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
            .ok_or_else(|| bad("no end line: the backup is incomplete".into()))?;
        let stored = u32::from_str_radix(text[end_at + 4..].trim(), 16)
            .map_err(|e| bad(format!("end line: {e}")))?;
        let computed = crc32c::crc32c(&text.as_bytes()[..end_at]);
        if stored != computed {
            return Err(bad(format!(
                "checksum {computed:08x}, its end line says {stored:08x}: the manifest is damaged"
            )));
        }
        let mut m = BackupManifest {
            store_format_version: 0,
            manifest_version: 0,
            store_id: 0,
            log_groups: 0,
            source_data_dirs: 0,
            record_salt: 0,
            segment_size_bytes: 0,
            broker_version: String::new(),
            created_unix_s: 0,
            files: Vec::new(),
        };
        for line in text[..end_at].lines().skip(1) {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            let num = |v: &str| -> Result<u64, StoreError> {
                v.parse().map_err(|e| bad(format!("{key} {v:?}: {e}")))
            };
            let num32 = |v: &str| -> Result<u32, StoreError> {
                v.parse().map_err(|e| bad(format!("{key} {v:?}: {e}")))
            };
            let hex = |v: &str| -> Result<u64, StoreError> {
                u64::from_str_radix(v, 16).map_err(|e| bad(format!("{key} {v:?}: {e}")))
            };
            match key {
                "store_format_version" => m.store_format_version = num32(value)?,
                "manifest_version" => m.manifest_version = num32(value)?,
                "store_id" => m.store_id = hex(value)?,
                "log_groups" => m.log_groups = num32(value)?,
                "source_data_dirs" => m.source_data_dirs = num32(value)?,
                "record_salt" => {
                    m.record_salt =
                        u32::try_from(hex(value)?).map_err(|e| bad(format!("record_salt: {e}")))?;
                }
                "segment_size_bytes" => m.segment_size_bytes = num(value)?,
                "broker_version" => value.clone_into(&mut m.broker_version),
                "created_unix_s" => m.created_unix_s = num(value)?,
                "file" => {
                    let mut parts = value.splitn(3, ' ');
                    let (Some(crc), Some(bytes), Some(p)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(bad(format!("file line {value:?}")));
                    };
                    if p.split('/').any(|c| c == ".." || c.is_empty()) || p.starts_with('/') {
                        return Err(bad(format!("file path {p:?} leaves the backup")));
                    }
                    m.files.push(BackupFile {
                        path: p.to_owned(),
                        bytes: num(bytes)?,
                        crc32c: u32::try_from(hex(crc)?)
                            .map_err(|e| bad(format!("file crc: {e}")))?,
                    });
                }
                // Unknown keys are ignored, so a later minor addition reads.
                _ => {}
            }
        }
        if m.store_format_version != FORMAT_VERSION {
            return Err(StoreError::FormatVersion {
                path: path.to_path_buf(),
                found: m.store_format_version,
                expected: FORMAT_VERSION,
            });
        }
        if m.manifest_version == 0 || m.manifest_version > MANIFEST_VERSION {
            return Err(StoreError::FormatVersion {
                path: path.to_path_buf(),
                found: m.manifest_version,
                expected: MANIFEST_VERSION,
            });
        }
        if m.log_groups == 0 {
            return Err(bad("log_groups 0".into()));
        }
        Ok(m)
    }
}

/// What a backup took.
#[derive(Clone, Debug)]
pub struct BackupReport {
    pub manifest: BackupManifest,
    pub bytes: u64,
    /// Bytes of records in progress at the cut, left out.
    pub trimmed_bytes: u64,
    /// How long the store's writers were paused for the cut (a backup of
    /// an open store, `Store::backup`); `None` for a backup of files no
    /// broker writes.
    pub pause: Option<std::time::Duration>,
}

/// A file opened at the cut: its handle and the length to copy.
pub(crate) struct CutFile {
    rel: String,
    file: Arc<dyn StorageFile>,
    len: u64,
    /// The newest segment of its group: trimmed to its last whole record.
    newest_segment: bool,
}

fn io<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| StoreError::io(op, p, e)
}

/// Opens every file of every group (the cut). A file listed but gone
/// before it could be opened (reclaimed meanwhile) makes the pass restart.
pub(crate) fn cut(storage: &dyn Storage, layout: &Layout) -> Result<Vec<CutFile>, StoreError> {
    let mut attempt = 0;
    'again: loop {
        let mut files = Vec::new();
        for g in 0..layout.manifest.group_count {
            let dir = layout.group_dir(g);
            let names = match storage.list(&dir) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io("list", &dir, e)),
            };
            let mut segs: Vec<u32> = names
                .iter()
                .filter_map(|n| segment::parse_segment_name(n))
                .collect();
            segs.sort_unstable();
            let ckpts = names
                .iter()
                .filter(|n| checkpoint::parse_checkpoint_name(n).is_some());
            let group_rel = format!("{BACKUP_DATA_DIR}/group-{g:04}");
            // Checkpoints first: the journal opened after them reaches at
            // least as far as they cover.
            let mut ordered: Vec<(String, bool)> = ckpts.map(|n| (n.clone(), false)).collect();
            ordered.sort();
            let newest = segs.last().copied();
            ordered.extend(
                segs.iter()
                    .map(|&s| (segment::segment_name(s), Some(s) == newest)),
            );
            for (name, newest_segment) in ordered {
                let path = dir.join(&name);
                let file = match storage.open_read(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempt < 8 => {
                        attempt += 1;
                        continue 'again;
                    }
                    Err(e) => return Err(StoreError::io("open", &path, e)),
                };
                let len = file.len().map_err(io("stat", &path))?;
                files.push(CutFile {
                    rel: format!("{group_rel}/{name}"),
                    file,
                    len,
                    newest_segment,
                });
            }
        }
        return Ok(files);
    }
}

/// Length of the longest prefix of `bytes` made of whole valid records.
fn whole_records_len(bytes: &[u8], salt: u32) -> usize {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return 0;
    }
    let mut at = SEGMENT_HEADER_BYTES;
    while let Decoded::Record { len, .. } = record::decode(salt, &bytes[at..]) {
        at += len;
    }
    at
}

fn rel_path(root: &Path, rel: &str) -> PathBuf {
    rel.split('/').fold(root.to_path_buf(), |p, c| p.join(c))
}

/// Copies `len` bytes of `from` into a new file `to`, fdatasynced;
/// returns its CRC32C.
fn copy_file(
    storage: &dyn Storage,
    from: &dyn StorageFile,
    src: &Path,
    len: u64,
    to: &Path,
    progress: &dyn Fn(u64),
) -> Result<u32, StoreError> {
    let out = storage.create(to).map_err(io("create", to))?;
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    let mut crc = 0u32;
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from((len - at).min(COPY_CHUNK_BYTES as u64)).expect("≤ 1 MiB");
        from.read_exact_at(&mut buf[..n], at)
            .map_err(io("read", src))?;
        out.write_all_at(&buf[..n], at).map_err(io("write", to))?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
        progress(n as u64);
    }
    out.sync_data().map_err(io("fdatasync", to))?;
    Ok(crc)
}

/// Backs up the store in `layout`, which no broker is writing, into the
/// empty or absent directory `out`. (A running broker's store is backed up
/// through `Store::backup`, whose cut is one instant for every group.)
pub fn backup(
    storage: &dyn Storage,
    layout: &Layout,
    out: &Path,
    broker_version: &str,
    created_unix_s: u64,
    progress: &dyn Fn(u64),
) -> Result<BackupReport, StoreError> {
    backup_with_cut(
        storage,
        layout,
        out,
        broker_version,
        created_unix_s,
        progress,
        &|| cut(storage, layout),
    )
}

/// [`backup`] with the cut taken by `take_cut` (after `out` was checked).
pub(crate) fn backup_with_cut(
    storage: &dyn Storage,
    layout: &Layout,
    out: &Path,
    broker_version: &str,
    created_unix_s: u64,
    progress: &dyn Fn(u64),
    take_cut: &dyn Fn() -> Result<Vec<CutFile>, StoreError>,
) -> Result<BackupReport, StoreError> {
    ensure_empty(storage, out)?;
    let salt = layout.manifest.record_salt;
    let files = take_cut()?;
    let data = out.join(BACKUP_DATA_DIR);
    storage
        .create_dir_all(&data)
        .map_err(io("create dir", &data))?;
    let one_dir = Manifest {
        dir_count: 1,
        dir_index: 0,
        ..layout.manifest
    };
    one_dir.write(storage, &data)?;
    let mut listed = vec![BackupFile {
        path: format!("{BACKUP_DATA_DIR}/{MANIFEST_NAME}"),
        bytes: one_dir.encode().len() as u64,
        crc32c: crc32c::crc32c(&one_dir.encode()),
    }];
    let (mut bytes, mut trimmed, mut segment_size) = (0u64, 0u64, 0u64);
    let mut dirs_made = std::collections::BTreeSet::new();
    for f in &files {
        let to = rel_path(out, &f.rel);
        let parent = to.parent().expect("has a group dir").to_path_buf();
        if dirs_made.insert(parent.clone()) {
            storage
                .create_dir_all(&parent)
                .map_err(io("create dir", &parent))?;
        }
        let mut len = f.len;
        if f.newest_segment {
            let mut whole = vec![0u8; usize::try_from(f.len).expect("segments are below 4 GiB")];
            f.file
                .read_exact_at(&mut whole, 0)
                .map_err(io("read", &to))?;
            len = whole_records_len(&whole, salt) as u64;
            trimmed += f.len - len;
        } else if f.rel.ends_with(".seg") {
            segment_size = segment_size.max(f.len);
        }
        let crc = copy_file(storage, f.file.as_ref(), &to, len, &to, progress)?;
        bytes += len;
        listed.push(BackupFile {
            path: f.rel.clone(),
            bytes: len,
            crc32c: crc,
        });
    }
    for d in &dirs_made {
        storage.sync_dir(d).map_err(io("fsync dir", d))?;
    }
    storage.sync_dir(&data).map_err(io("fsync dir", &data))?;
    // The copy must itself verify before it is declared a backup.
    let copied = Layout::open(storage, std::slice::from_ref(&data))?;
    for g in 0..copied.manifest.group_count {
        let rep = crate::inspect::inspect_group(storage, &copied, g, &|_| {})?;
        if let Some(p) = rep.problems.first() {
            return Err(StoreError::Corrupt {
                path: p.file.clone(),
                offset: p.offset,
                reason: format!(
                    "the copy does not verify ({}; {} problem(s) in group {g}); no {BACKUP_NAME} \
                     was written, so this directory is not a backup",
                    p.what,
                    rep.problems.len()
                ),
            });
        }
    }
    let manifest = BackupManifest {
        store_format_version: FORMAT_VERSION,
        manifest_version: MANIFEST_VERSION,
        store_id: layout.manifest.store_id,
        log_groups: layout.manifest.group_count,
        source_data_dirs: layout.manifest.dir_count,
        record_salt: salt,
        segment_size_bytes: segment_size,
        broker_version: broker_version.to_owned(),
        created_unix_s,
        files: listed,
    };
    write_atomically(
        storage,
        out,
        &format!("{BACKUP_NAME}.tmp"),
        BACKUP_NAME,
        manifest.encode().as_bytes(),
    )?;
    Ok(BackupReport {
        manifest,
        bytes,
        trimmed_bytes: trimmed,
        pause: None,
    })
}

fn ensure_empty(storage: &dyn Storage, dir: &Path) -> Result<(), StoreError> {
    match storage.list(dir) {
        Ok(names) if !names.is_empty() => Err(StoreError::Config(format!(
            "{} is not empty ({} entries): give a new or empty directory",
            dir.display(),
            names.len()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            storage.create_dir_all(dir).map_err(io("create dir", dir))
        }
        Err(e) => Err(StoreError::io("list", dir, e)),
    }
}

/// Rewrites the segment at `path` with every record re-sealed from salt
/// `from` to `to` ([`record::reseal`]), and fdatasyncs it. A backup holds
/// whole records only (its check proved them), so a frame that does not
/// check out is an error naming the file and offset.
fn reseal_segment(
    storage: &dyn Storage,
    path: &Path,
    from: u32,
    to: u32,
) -> Result<(), StoreError> {
    let mut bytes = read_file(storage, path)?;
    let start = SEGMENT_HEADER_BYTES.min(bytes.len());
    let end = start + record::reseal(from, to, &mut bytes[start..]);
    if end != bytes.len() {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: end as u64,
            reason: "restored segment holds a frame that does not check out under the backup's \
                     record salt: the backup was changed after its check"
                .into(),
        });
    }
    let f = storage.open(path).map_err(io("open", path))?;
    f.write_all_at(&bytes, 0).map_err(io("write", path))?;
    f.sync_data().map_err(io("fdatasync", path))
}

/// Reads `OUT/BACKUP` and checks every file it lists against its length
/// and checksum. Returns the manifest; any mismatch is an error naming
/// the file.
pub fn check_backup(
    storage: &dyn Storage,
    backup_dir: &Path,
    progress: &dyn Fn(u64),
) -> Result<BackupManifest, StoreError> {
    let path = backup_dir.join(BACKUP_NAME);
    let text = read_file(storage, &path).map_err(|e| match e {
        StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            StoreError::Config(format!(
                "{} has no {BACKUP_NAME} file: not a berth backup, or an incomplete one",
                backup_dir.display()
            ))
        }
        e => e,
    })?;
    let m = BackupManifest::decode(&text, &path)?;
    for f in &m.files {
        let p = rel_path(backup_dir, &f.path);
        let bytes = read_file(storage, &p)?;
        progress(bytes.len() as u64);
        let crc = crc32c::crc32c(&bytes);
        if bytes.len() as u64 != f.bytes || crc != f.crc32c {
            return Err(StoreError::Corrupt {
                path: p,
                offset: 0,
                reason: format!(
                    "{} bytes with checksum {crc:08x}; the backup manifest says {} bytes, {:08x}: \
                     the backup is corrupt",
                    bytes.len(),
                    f.bytes,
                    f.crc32c
                ),
            });
        }
    }
    Ok(m)
}

/// Restores a checked backup into `dirs` (any number; each empty or
/// absent): group `g` goes to `dirs[g % dirs.len()]`.
pub fn restore(
    storage: &dyn Storage,
    backup_dir: &Path,
    dirs: &[PathBuf],
    progress: &dyn Fn(u64),
) -> Result<BackupManifest, StoreError> {
    if dirs.is_empty() {
        return Err(StoreError::Config("no data directory given".into()));
    }
    let m = check_backup(storage, backup_dir, &|_| {})?;
    for d in dirs {
        ensure_empty(storage, d)?;
    }
    let dir_count = u32::try_from(dirs.len())
        .map_err(|e| StoreError::Config(format!("too many data directories: {e}")))?;
    let prefix = format!("{BACKUP_DATA_DIR}/group-");
    let mut made = std::collections::BTreeSet::new();
    let mut segments = Vec::new();
    for f in &m.files {
        let Some(rest) = f.path.strip_prefix(&prefix) else {
            continue; // the backup's own one-directory manifest
        };
        let (group, name) = rest
            .split_once('/')
            .ok_or_else(|| StoreError::Config(format!("unexpected file {} in backup", f.path)))?;
        let g: u32 = group.parse().map_err(|e| {
            StoreError::Config(format!(
                "unexpected group directory in backup {}: {e}",
                f.path
            ))
        })?;
        let dir = manifest::group_dir(dirs, g);
        if made.insert(dir.clone()) {
            storage
                .create_dir_all(&dir)
                .map_err(io("create dir", &dir))?;
        }
        let src = rel_path(backup_dir, &f.path);
        let from = storage.open_read(&src).map_err(io("open", &src))?;
        copy_file(
            storage,
            from.as_ref(),
            &src,
            f.bytes,
            &dir.join(name),
            progress,
        )?;
        if segment::parse_segment_name(name).is_some() {
            segments.push(dir.join(name));
        }
    }
    for d in &made {
        storage.sync_dir(d).map_err(io("fsync dir", d))?;
    }
    // Groups the backup holds no file of get their (empty) directory too.
    manifest::create_group_dirs(storage, dirs, m.log_groups)?;
    // A new store gets a new secret (and a version-1 store, salt 0, its
    // first): every record is re-sealed under it before the manifests
    // that name it exist.
    let record_salt: u32 = rand::rng().random_range(1..=u32::MAX);
    for seg in &segments {
        reseal_segment(storage, seg, m.record_salt, record_salt)?;
    }
    for (i, d) in dirs.iter().enumerate() {
        let man = Manifest {
            group_count: m.log_groups,
            dir_count,
            dir_index: u32::try_from(i).expect("checked above"),
            store_id: m.store_id,
            record_salt,
        };
        man.write(storage, d)?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BackupManifest {
        BackupManifest {
            store_format_version: FORMAT_VERSION,
            manifest_version: MANIFEST_VERSION,
            store_id: 0x0102_0304_0506_0708,
            log_groups: 4,
            source_data_dirs: 2,
            record_salt: 0xA1B2_C3D4,
            segment_size_bytes: 65536,
            broker_version: "0.1.0".into(),
            created_unix_s: 1_700_000_000,
            files: vec![BackupFile {
                path: "data/group-0000/0000000001.seg".into(),
                bytes: 100,
                crc32c: 0xdead_beef,
            }],
        }
    }

    #[test]
    fn backup_manifest_roundtrips_and_refuses_damage_and_other_formats() {
        let m = sample();
        let text = m.encode();
        assert_eq!(
            BackupManifest::decode(text.as_bytes(), Path::new("B")).unwrap(),
            m
        );
        let damaged = text.replace("log_groups 4", "log_groups 5");
        let e = BackupManifest::decode(damaged.as_bytes(), Path::new("B")).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
        let newer = text.replace("berth-backup 1", "berth-backup 2");
        assert!(matches!(
            BackupManifest::decode(newer.as_bytes(), Path::new("B")),
            Err(StoreError::FormatVersion { found: 2, .. })
        ));
        let cut = &text[..text.find("end ").unwrap()];
        let e = BackupManifest::decode(cut.as_bytes(), Path::new("B")).unwrap_err();
        assert!(e.to_string().contains("incomplete"), "{e}");
    }

    #[test]
    fn backup_manifest_refuses_paths_leaving_the_backup() {
        let mut m = sample();
        m.files[0].path = "data/../../etc/passwd".into();
        let e = BackupManifest::decode(m.encode().as_bytes(), Path::new("B")).unwrap_err();
        assert!(e.to_string().contains("leaves the backup"), "{e}");
    }

    #[test]
    fn whole_records_len_stops_before_a_partial_record() {
        let mut seg = segment::encode_header(0, 1).to_vec();
        let r = record::Record::Purge {
            queue: crate::QueueId(1),
        };
        record::encode(7, 1, &r, &mut seg);
        let whole = seg.len();
        record::encode(7, 2, &r, &mut seg);
        seg.truncate(seg.len() - 3);
        assert_eq!(whole_records_len(&seg, 7), whole);
    }
}
