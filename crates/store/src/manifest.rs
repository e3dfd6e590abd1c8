//! The store manifest: one 44-byte file `MANIFEST` in every data directory,
//! fixing the format version, the group count (queue placement depends on
//! it) and which directory of the set this is.
//!
//! ```text
//!  0          8        12           16          20          24        32          36          40       44
//!  +----------+--------+------------+-----------+-----------+---------+-----------+-------------+--------+
//!  | BERTHMAN | version| group_count| dir_count | dir_index | store_id| placement | record_salt | crc32c |
//!  |  8 bytes |  u32   |    u32     |    u32    |    u32    |   u64   |    u32    |     u32     |  u32   |
//!  +----------+--------+------------+-----------+-----------+---------+-----------+-------------+--------+
//! ```
//!
//! Version 2 added `record_salt` (the seed of every record checksum, see
//! `record.rs`) where version 1 had a reserved zero; a version 1 manifest
//! is read as salt 0, the plain CRC32C its records were written with. The
//! version was bumped so that a binary that ignores the salt refuses a
//! salted store instead of taking every record for damage.
//!
//! Version 3 changed no byte of the manifest: it says that the broker's
//! message payloads in this store may open with their times (issue 42,
//! docs/FORMAT.md "Message payload"), which a berth before them cannot
//! read. A store of version 1 or 2 is upgraded to 3 when this build opens
//! it, before anything is written, and says so in the log: a berth before
//! times then refuses the store, naming its manifest, instead of leaving
//! every message written since unread.
//!
//! Invariants:
//! - Written at store creation, via temp file + fsync + rename +
//!   directory fsync; rewritten (the same way, every field kept) only to
//!   raise an older version to this one. A store whose manifests disagree
//!   (another store's directory, reordered `data_dirs`) refuses to open.

use std::path::{Path, PathBuf};

use crate::decision::{decide_layout, LayoutCase};
use crate::error::StoreError;
use crate::limits::LOG_GROUPS_MAX;
use crate::storage::Storage;

/// Version of the manifest written by this build.
pub const MANIFEST_VERSION: u32 = 3;
/// Oldest manifest version this build reads (1: no record salt).
pub const MANIFEST_VERSION_MIN: u32 = 1;

pub const MANIFEST_MAGIC: [u8; 8] = *b"BERTHMAN";
pub const MANIFEST_NAME: &str = "MANIFEST";
pub const MAN_OFF_VERSION: usize = 8;
pub const MAN_OFF_GROUP_COUNT: usize = MAN_OFF_VERSION + 4;
pub const MAN_OFF_DIR_COUNT: usize = MAN_OFF_GROUP_COUNT + 4;
pub const MAN_OFF_DIR_INDEX: usize = MAN_OFF_DIR_COUNT + 4;
pub const MAN_OFF_STORE_ID: usize = MAN_OFF_DIR_INDEX + 4;
pub const MAN_OFF_PLACEMENT: usize = MAN_OFF_STORE_ID + 8;
pub const MAN_OFF_RECORD_SALT: usize = MAN_OFF_PLACEMENT + 4;
pub const MAN_OFF_CRC: usize = MAN_OFF_RECORD_SALT + 4;
pub const MANIFEST_BYTES: usize = MAN_OFF_CRC + 4;
const _: () = assert!(MANIFEST_BYTES == 44);
/// Queue placement 1: `splitmix64(queue) % group_count` ([`crate::group_of`]).
pub const PLACEMENT_SPLITMIX_MOD: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    pub group_count: u32,
    pub dir_count: u32,
    pub dir_index: u32,
    pub store_id: u64,
    /// Seed of every record checksum of this store; 0 for version 1.
    pub record_salt: u32,
}

impl Manifest {
    /// Writes this manifest as `dir/MANIFEST`, atomically (a crash leaves
    /// the old one or this one, never a torn file).
    pub fn write(&self, storage: &dyn Storage, dir: &Path) -> Result<(), StoreError> {
        crate::storage::write_atomically(
            storage,
            dir,
            &format!("{MANIFEST_NAME}.tmp"),
            MANIFEST_NAME,
            &self.encode(),
        )
    }

    pub fn encode(&self) -> [u8; MANIFEST_BYTES] {
        let mut b = [0u8; MANIFEST_BYTES];
        b[..8].copy_from_slice(&MANIFEST_MAGIC);
        b[MAN_OFF_VERSION..MAN_OFF_GROUP_COUNT].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
        b[MAN_OFF_GROUP_COUNT..MAN_OFF_DIR_COUNT].copy_from_slice(&self.group_count.to_le_bytes());
        b[MAN_OFF_DIR_COUNT..MAN_OFF_DIR_INDEX].copy_from_slice(&self.dir_count.to_le_bytes());
        b[MAN_OFF_DIR_INDEX..MAN_OFF_STORE_ID].copy_from_slice(&self.dir_index.to_le_bytes());
        b[MAN_OFF_STORE_ID..MAN_OFF_PLACEMENT].copy_from_slice(&self.store_id.to_le_bytes());
        b[MAN_OFF_PLACEMENT..MAN_OFF_RECORD_SALT]
            .copy_from_slice(&PLACEMENT_SPLITMIX_MOD.to_le_bytes());
        b[MAN_OFF_RECORD_SALT..MAN_OFF_CRC].copy_from_slice(&self.record_salt.to_le_bytes());
        let crc = crc32c::crc32c(&b[..MAN_OFF_CRC]);
        b[MAN_OFF_CRC..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8], path: &Path) -> Result<Manifest, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason,
        };
        if b.len() != MANIFEST_BYTES {
            return Err(corrupt(format!(
                "{} bytes, expected {MANIFEST_BYTES}",
                b.len()
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let stored = u32_at(MAN_OFF_CRC);
        if stored != crc32c::crc32c(&b[..MAN_OFF_CRC]) || b[..8] != MANIFEST_MAGIC {
            return Err(corrupt("checksum or magic mismatch".into()));
        }
        let version = u32_at(MAN_OFF_VERSION);
        if !(MANIFEST_VERSION_MIN..=MANIFEST_VERSION).contains(&version) {
            return Err(StoreError::FormatVersion {
                path: path.to_path_buf(),
                found: version,
                expected: MANIFEST_VERSION,
            });
        }
        let record_salt = u32_at(MAN_OFF_RECORD_SALT);
        if version == 1 && record_salt != 0 {
            return Err(corrupt(format!(
                "version 1 manifest with reserved bytes {record_salt:#x}"
            )));
        }
        let placement = u32_at(MAN_OFF_PLACEMENT);
        if placement != PLACEMENT_SPLITMIX_MOD {
            return Err(corrupt(format!("unknown queue placement {placement}")));
        }
        let group_count = u32_at(MAN_OFF_GROUP_COUNT);
        if !(1..=LOG_GROUPS_MAX).contains(&group_count) {
            let (_, why) = decide_layout(LayoutCase::GroupCountOutOfRange);
            return Err(corrupt(format!(
                "{why}: group_count {group_count} (expected 1..={LOG_GROUPS_MAX}); the manifest \
                 is damaged or not berth's: restore this data directory from a backup"
            )));
        }
        Ok(Manifest {
            group_count,
            dir_count: u32_at(MAN_OFF_DIR_COUNT),
            dir_index: u32_at(MAN_OFF_DIR_INDEX),
            store_id: u64::from_le_bytes(
                b[MAN_OFF_STORE_ID..MAN_OFF_PLACEMENT]
                    .try_into()
                    .expect("8 bytes"),
            ),
            record_salt,
        })
    }
}

/// The format version of manifest bytes that [`Manifest::decode`] took.
pub fn version_of(b: &[u8]) -> u32 {
    u32::from_le_bytes(
        b[MAN_OFF_VERSION..MAN_OFF_GROUP_COUNT]
            .try_into()
            .expect("4 bytes"),
    )
}

/// Directory of group `g` among the store's data directories `dirs`
/// (groups are dealt round-robin over them).
pub fn group_dir(dirs: &[PathBuf], g: u32) -> PathBuf {
    dirs[g as usize % dirs.len()].join(format!("group-{g:04}"))
}

/// Creates the directory of every group of a store whose manifests are
/// about to be written (a new store, a restore, a reshape's copy). Before
/// the manifests: recovery refuses a store that has a manifest but lacks
/// a group directory, and the manifest's own write fsyncs the data
/// directory, which makes these entries durable with it.
pub fn create_group_dirs(
    storage: &dyn Storage,
    dirs: &[PathBuf],
    group_count: u32,
) -> Result<(), StoreError> {
    for g in 0..group_count {
        let dir = group_dir(dirs, g);
        storage
            .create_dir_all(&dir)
            .map_err(|e| StoreError::io("create dir", &dir, e))?;
    }
    Ok(())
}

/// Reads a whole small file.
pub fn read_all(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>, StoreError> {
    let f = storage
        .open(path)
        .map_err(|e| StoreError::io("open", path, e))?;
    let len = f.len().map_err(|e| StoreError::io("stat", path, e))?;
    let mut buf = vec![
        0u8;
        usize::try_from(len).map_err(|e| StoreError::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
            reason: format!("file of {len} bytes does not fit in memory: {e}"),
        })?
    ];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_manifest() {
        let m = Manifest {
            group_count: 4,
            dir_count: 2,
            dir_index: 1,
            store_id: 0x0102_0304_0506_0708,
            record_salt: 0xA1B2_C3D4,
        };
        let b = m.encode();
        #[rustfmt::skip]
        assert_eq!(&b[..40], &[
            b'B', b'E', b'R', b'T', b'H', b'M', b'A', b'N',
            3, 0, 0, 0,   4, 0, 0, 0,   2, 0, 0, 0,   1, 0, 0, 0,
            8, 7, 6, 5, 4, 3, 2, 1,
            1, 0, 0, 0,   0xD4, 0xC3, 0xB2, 0xA1,
        ]);
        assert_eq!(b[40..], crc32c::crc32c(&b[..40]).to_le_bytes());
        assert_eq!(Manifest::decode(&b, Path::new("M")).unwrap(), m);
        let mut bad = b;
        bad[13] ^= 1;
        assert!(Manifest::decode(&bad, Path::new("M")).is_err());
    }

    /// 0 groups would divide by zero, a huge count spawn that many threads:
    /// berth never writes either, so a manifest that says so is refused,
    /// naming the file.
    #[test]
    fn group_count_out_of_range_is_refused() {
        for group_count in [0, LOG_GROUPS_MAX + 1, u32::MAX] {
            let m = Manifest {
                group_count,
                dir_count: 1,
                dir_index: 0,
                store_id: 7,
                record_salt: 9,
            };
            let e = Manifest::decode(&m.encode(), Path::new("/d/MANIFEST")).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("/d/MANIFEST"), "{text}");
            assert!(text.contains("group_count"), "{text}");
            assert!(text.contains("restore"), "{text}");
        }
        let m = Manifest {
            group_count: LOG_GROUPS_MAX,
            dir_count: 1,
            dir_index: 0,
            store_id: 7,
            record_salt: 9,
        };
        assert_eq!(Manifest::decode(&m.encode(), Path::new("M")).unwrap(), m);
    }

    /// A store created before the record salt (manifest version 1) still
    /// opens, with salt 0: the plain CRC32C its records carry.
    #[test]
    fn version_1_manifest_reads_as_salt_0() {
        #[rustfmt::skip]
        let mut b: Vec<u8> = vec![
            b'B', b'E', b'R', b'T', b'H', b'M', b'A', b'N',
            1, 0, 0, 0,   4, 0, 0, 0,   2, 0, 0, 0,   1, 0, 0, 0,
            8, 7, 6, 5, 4, 3, 2, 1,
            1, 0, 0, 0,   0, 0, 0, 0,
        ];
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let m = Manifest::decode(&b, Path::new("M")).unwrap();
        assert_eq!(m.record_salt, 0);
        assert_eq!(m.group_count, 4);
        assert_eq!(version_of(&b), 1);
        b[8] = 4;
        let crc = crc32c::crc32c(&b[..40]);
        b[40..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Manifest::decode(&b, Path::new("M")),
            Err(StoreError::FormatVersion { found: 4, .. })
        ));
    }
}
