//! `raft.snapshot`: a snapshot as one file, written and read as a stream,
//! so that no buffer holds more of it than one chunk (docs/FORMAT.md,
//! "Cluster directory").
//!
//! Layout: `BERTHSN2 | u32 LE meta length | u32 LE crc32c(meta) | meta
//! (postcard) | data | u64 LE data length | u32 LE crc32c(data)`. The data
//! is the application's ([`crate::Apply::capture`]); the file is what a
//! leader streams to a follower, chunk by chunk, as it is on disk.
//!
//! Invariants:
//! - `raft.snapshot` is replaced only by rename of a complete file that was
//!   fdatasynced first, and the directory is fsynced after the rename: at
//!   any crash the name holds a whole snapshot or the previous one.
//! - A snapshot never replaces a newer one (a build that ends after an
//!   install of a later snapshot is dropped).
//! - Nothing is trusted without its checksum: a file whose meta or data
//!   does not match its CRC, or whose data length disagrees with its size,
//!   is refused with the file named.
//! - A file written before this layout (one log frame holding meta and
//!   data together) is still read, and rewritten in this layout at start.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use openraft::{BasicNode, SnapshotMeta};
use parking_lot::Mutex;
use serde::Deserialize;

use crate::error::ClusterError;
use crate::log_frame::{scan, Tail};
use crate::types::NodeId;

pub const SNAPSHOT_FILE: &str = "raft.snapshot";
/// Where a snapshot is built before its rename.
const BUILDING_FILE: &str = "raft.snapshot.building";
/// Where a snapshot streamed from the leader is received.
pub const INCOMING_FILE: &str = "raft.snapshot.incoming";
const MAGIC: &[u8; 8] = b"BERTHSN2";
const HEADER_BYTES: u64 = 16;
const TRAILER_BYTES: u64 = 12;
/// Largest encoded meta (membership and ids: a few hundred bytes).
const META_BYTES_MAX: u32 = 1024 * 1024;
/// Buffer of the writer and of each reader.
const IO_BUFFER_BYTES: usize = 1024 * 1024;

pub type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Writes a snapshot's data (see [`crate::Apply::capture`]).
pub type WriteSnapshot = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send>;

/// Where a snapshot's data can be read from, as many times as needed.
pub trait SnapshotSource {
    /// A reader of the data from its first byte.
    fn open(&self) -> io::Result<Box<dyn Read + '_>>;
}

impl SnapshotSource for [u8] {
    fn open(&self) -> io::Result<Box<dyn Read + '_>> {
        Ok(Box::new(self))
    }
}

impl SnapshotSource for Vec<u8> {
    fn open(&self) -> io::Result<Box<dyn Read + '_>> {
        Ok(Box::new(self.as_slice()))
    }
}

/// A checked snapshot file: its meta, and where its data lies.
#[derive(Clone, Debug)]
pub struct Checked {
    pub meta: Meta,
    pub path: PathBuf,
    data_at: u64,
    data_len: u64,
}

impl SnapshotSource for Checked {
    fn open(&self) -> io::Result<Box<dyn Read + '_>> {
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(self.data_at))?;
        Ok(Box::new(
            BufReader::with_capacity(IO_BUFFER_BYTES, f).take(self.data_len),
        ))
    }
}

/// Counts and checksums what passes through to the file.
struct Summing<W> {
    inner: W,
    len: u64,
    crc: u32,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.len += n as u64;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Builds a snapshot in `dir`: header, the data `body` writes, trailer,
/// fdatasync. Returns the (not yet published) file; blocking.
pub fn build(dir: &Path, meta: &Meta, body: WriteSnapshot) -> io::Result<PathBuf> {
    let path = dir.join(BUILDING_FILE);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let meta_bytes = postcard::to_allocvec(meta).map_err(io::Error::other)?;
    let mut out = BufWriter::with_capacity(IO_BUFFER_BYTES, file);
    out.write_all(MAGIC)?;
    out.write_all(
        &u32::try_from(meta_bytes.len())
            .map_err(io::Error::other)?
            .to_le_bytes(),
    )?;
    out.write_all(&crc32c::crc32c(&meta_bytes).to_le_bytes())?;
    out.write_all(&meta_bytes)?;
    let mut data = Summing {
        inner: out,
        len: 0,
        crc: 0,
    };
    body(&mut data)?;
    let Summing {
        inner: mut out,
        len,
        crc,
    } = data;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&crc.to_le_bytes())?;
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_data()?;
    Ok(path)
}

/// Makes `file` (built or received, complete and fdatasynced) the
/// snapshot of `dir`, unless `current` is newer; returns whether it did.
/// `current` is updated under its lock, so two of these never cross.
pub fn publish(
    dir: &Path,
    file: &Path,
    checked: Checked,
    current: &Mutex<Option<Checked>>,
) -> io::Result<Option<Checked>> {
    let mut cur = current.lock();
    if cur
        .as_ref()
        .is_some_and(|c| c.meta.last_log_id > checked.meta.last_log_id)
    {
        let _gone = fs::remove_file(file);
        return Ok(None);
    }
    let to = dir.join(SNAPSHOT_FILE);
    fs::rename(file, &to)?;
    fsync_dir(dir)?;
    let published = Checked {
        path: to,
        ..checked
    };
    *cur = Some(published.clone());
    Ok(Some(published))
}

fn read_exact_at(f: &mut BufReader<File>, n: usize, what: &str) -> Result<Vec<u8>, String> {
    let mut buf = vec![0; n];
    f.read_exact(&mut buf)
        .map_err(|e| format!("{what}: {e} (the file is cut short)"))?;
    Ok(buf)
}

/// Reads and checks a snapshot file of this layout, streaming its data
/// once through the checksum. Blocking.
pub fn check(path: &Path) -> Result<Checked, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut f = BufReader::with_capacity(IO_BUFFER_BYTES, file);
    let head = read_exact_at(&mut f, HEADER_BYTES as usize, "header")?;
    if &head[..8] != MAGIC {
        return Err("not a snapshot file (its first 8 bytes are not BERTHSN2)".into());
    }
    let meta_len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    let meta_crc = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
    if meta_len > META_BYTES_MAX {
        return Err(format!("a meta of {meta_len} bytes is claimed (damage)"));
    }
    let meta_bytes = read_exact_at(&mut f, meta_len as usize, "meta")?;
    if crc32c::crc32c(&meta_bytes) != meta_crc {
        return Err("the meta does not match its CRC".into());
    }
    let meta: Meta = postcard::from_bytes(&meta_bytes).map_err(|e| format!("the meta: {e}"))?;
    let data_at = HEADER_BYTES + u64::from(meta_len);
    let Some(data_len) = size.checked_sub(data_at + TRAILER_BYTES) else {
        return Err(format!("{size} bytes: shorter than its header and trailer"));
    };
    let mut crc = 0;
    let mut left = data_len;
    let mut buf = vec![0u8; IO_BUFFER_BYTES];
    while left > 0 {
        let n = usize::try_from(left.min(buf.len() as u64)).expect("at most the buffer");
        f.read_exact(&mut buf[..n])
            .map_err(|e| format!("data: {e} (the file is cut short)"))?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        left -= n as u64;
    }
    let tail = read_exact_at(&mut f, TRAILER_BYTES as usize, "trailer")?;
    let claimed_len = u64::from_le_bytes(tail[..8].try_into().expect("8 bytes"));
    let claimed_crc = u32::from_le_bytes(tail[8..].try_into().expect("4 bytes"));
    if claimed_len != data_len {
        return Err(format!(
            "the trailer claims {claimed_len} bytes of data, the file holds {data_len}"
        ));
    }
    if claimed_crc != crc {
        return Err("the data does not match its CRC".into());
    }
    Ok(Checked {
        meta,
        path: path.to_path_buf(),
        data_at,
        data_len,
    })
}

/// The snapshot layout before this one: one log frame of postcard
/// `(meta, data)`.
#[derive(Deserialize)]
struct Legacy {
    meta: Meta,
    data: Vec<u8>,
}

/// The snapshot `dir` holds, checked (`None` without one). A leftover
/// build or receive is removed; a snapshot in the old single-frame layout
/// is rewritten in this one.
pub fn load(dir: &Path) -> Result<Option<Checked>, ClusterError> {
    for leftover in [BUILDING_FILE, INCOMING_FILE] {
        let _absent_is_fine = fs::remove_file(dir.join(leftover));
    }
    let path = dir.join(SNAPSHOT_FILE);
    let undecodable = |detail: String| ClusterError::Undecodable {
        path: path.clone(),
        detail,
    };
    let mut magic = [0u8; 8];
    match File::open(&path).and_then(|mut f| f.read_exact(&mut magic)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
        Err(source) => return Err(ClusterError::Io { path, source }),
        Ok(()) => {}
    }
    if &magic == MAGIC {
        return check(&path).map(Some).map_err(undecodable);
    }
    // The old layout: read whole (it was bounded by the largest frame).
    let bytes = fs::read(&path).map_err(|source| ClusterError::Io {
        path: path.clone(),
        source,
    })?;
    let scanned = scan(&bytes);
    let payload = match (scanned.frames.as_slice(), scanned.tail) {
        ([(_, payload)], Tail::Clean) => *payload,
        _ => {
            return Err(undecodable(format!(
                "neither a snapshot file nor one whole frame of the old layout ({} frames, {:?})",
                scanned.frames.len(),
                scanned.tail
            )))
        }
    };
    let legacy: Legacy =
        postcard::from_bytes(payload).map_err(|e| undecodable(format!("old layout: {e}")))?;
    let data = legacy.data;
    let built = build(
        dir,
        &legacy.meta,
        Box::new(move |out: &mut dyn Write| out.write_all(&data)),
    )
    .map_err(|source| ClusterError::Io {
        path: dir.join(BUILDING_FILE),
        source,
    })?;
    let checked = check(&built).map_err(undecodable)?;
    let current = Mutex::new(None);
    let published = publish(dir, &built, checked, &current).map_err(|source| ClusterError::Io {
        path: path.clone(),
        source,
    })?;
    tracing::info!(path = %path.display(), "the snapshot was rewritten in the streamed layout");
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, StoredMembership};

    fn meta(index: u64) -> Meta {
        Meta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("s{index}"),
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn a_built_snapshot_reads_back_as_written_through_a_bounded_reader() {
        let dir = berth_testdir::TestDir::new("snapshot-file-roundtrip");
        let body = data(3 * IO_BUFFER_BYTES + 17);
        let copy = body.clone();
        let built = build(
            dir.path(),
            &meta(7),
            Box::new(move |out: &mut dyn Write| {
                for chunk in copy.chunks(1000) {
                    out.write_all(chunk)?;
                }
                Ok(())
            }),
        )
        .unwrap();
        let checked = check(&built).unwrap();
        assert_eq!(checked.meta.snapshot_id, "s7");
        let current = Mutex::new(None);
        let published = publish(dir.path(), &built, checked, &current)
            .unwrap()
            .unwrap();
        let mut back = Vec::new();
        published.open().unwrap().read_to_end(&mut back).unwrap();
        assert!(back == body, "the data reads back unchanged");
        assert!(load(dir.path()).unwrap().is_some());
    }

    #[test]
    fn damage_anywhere_is_refused_with_what_is_wrong() {
        let dir = berth_testdir::TestDir::new("snapshot-file-damage");
        let body = data(10_000);
        let built = build(
            dir.path(),
            &meta(3),
            Box::new(move |out: &mut dyn Write| out.write_all(&body)),
        )
        .unwrap();
        let good = fs::read(&built).unwrap();
        for (at, want) in [
            (0, "not a snapshot file"),
            (14, "meta does not match"),
            (5_000, "data does not match"),
            (good.len() - 3, "data does not match"),
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            fs::write(&built, &bad).unwrap();
            let e = check(&built).unwrap_err();
            assert!(e.contains(want), "byte {at}: {e}");
        }
        fs::write(&built, &good[..good.len() - 100]).unwrap();
        let e = check(&built).unwrap_err();
        assert!(e.contains("trailer claims"), "cut short: {e}");
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = berth_testdir::TestDir::new("snapshot-file-order");
        let current = Mutex::new(None);
        for (index, want) in [(5, true), (9, true), (7, false)] {
            let built = build(
                dir.path(),
                &meta(index),
                Box::new(|out: &mut dyn Write| out.write_all(b"x")),
            )
            .unwrap();
            let checked = check(&built).unwrap();
            let done = publish(dir.path(), &built, checked, &current).unwrap();
            assert_eq!(done.is_some(), want, "snapshot at {index}");
        }
        assert_eq!(load(dir.path()).unwrap().unwrap().meta.snapshot_id, "s9");
    }

    #[test]
    fn a_snapshot_of_the_old_single_frame_layout_is_read_and_rewritten() {
        #[derive(serde::Serialize)]
        struct Old<'a> {
            meta: &'a Meta,
            data: Vec<u8>,
        }
        let dir = berth_testdir::TestDir::new("snapshot-file-legacy");
        let payload = postcard::to_allocvec(&Old {
            meta: &meta(4),
            data: b"old data".to_vec(),
        })
        .unwrap();
        fs::write(
            dir.path().join(SNAPSHOT_FILE),
            crate::log_frame::encode_frame(&payload),
        )
        .unwrap();
        let loaded = load(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.meta.snapshot_id, "s4");
        let mut back = Vec::new();
        loaded.open().unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back, b"old data");
        let mut magic = [0u8; 8];
        File::open(dir.path().join(SNAPSHOT_FILE))
            .unwrap()
            .read_exact(&mut magic)
            .unwrap();
        assert_eq!(&magic, MAGIC, "rewritten in the new layout");
    }
}
