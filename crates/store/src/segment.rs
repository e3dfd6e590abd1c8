//! Segment files: names, and the 32-byte header every segment starts with.
//!
//! ```text
//!  0          8        12      16           24        28       32
//!  +----------+--------+-------+------------+---------+--------+
//!  | BERTHSEG | version| group |    seq     | reserved| crc32c |
//!  |  8 bytes |  u32   |  u32  |    u64     |  u32=0  |  u32   |
//!  +----------+--------+-------+------------+---------+--------+
//!  crc32c covers bytes 0 .. 28.
//! ```
//!
//! Invariants:
//! - A segment's file name and header carry the same `seq`; segments of a
//!   group are numbered consecutively and never renumbered.
//! - Records start right after the header and follow each other with no
//!   padding; a segment is only ever appended to, except by recovery
//!   (truncate a torn tail, patch a quarantined range with a `Hole` record).

use std::path::{Path, PathBuf};

pub const SEGMENT_MAGIC: [u8; 8] = *b"BERTHSEG";
/// Version of the segment and checkpoint formats (the manifest has its
/// own, `manifest::MANIFEST_VERSION`). Bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

pub const SEG_OFF_MAGIC: usize = 0;
pub const SEG_OFF_VERSION: usize = SEG_OFF_MAGIC + 8;
pub const SEG_OFF_GROUP: usize = SEG_OFF_VERSION + 4;
pub const SEG_OFF_SEQ: usize = SEG_OFF_GROUP + 4;
pub const SEG_OFF_RESERVED: usize = SEG_OFF_SEQ + 8;
pub const SEG_OFF_CRC: usize = SEG_OFF_RESERVED + 4;
pub const SEGMENT_HEADER_BYTES: usize = SEG_OFF_CRC + 4;
const _: () = assert!(SEGMENT_HEADER_BYTES == 32);

/// File name of segment `seq`.
pub fn segment_name(seq: u32) -> String {
    format!("{seq:010}.seg")
}

pub fn segment_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(segment_name(seq))
}

/// The segment a writer prepares before it needs it (zeros to the
/// segment size, fdatasynced), renamed to [`segment_name`] at the roll.
/// Never read: recovery removes one a crash left, inspection, backup and
/// reshape's copy skip it (its name is not a segment's).
pub const PREPARED_SEGMENT_NAME: &str = "next.seg.prep";

pub fn prepared_segment_path(dir: &Path) -> PathBuf {
    dir.join(PREPARED_SEGMENT_NAME)
}

/// Inverse of [`segment_name`].
pub fn parse_segment_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn encode_header(group: u32, seq: u32) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[SEG_OFF_MAGIC..SEG_OFF_VERSION].copy_from_slice(&SEGMENT_MAGIC);
    h[SEG_OFF_VERSION..SEG_OFF_GROUP].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[SEG_OFF_GROUP..SEG_OFF_SEQ].copy_from_slice(&group.to_le_bytes());
    h[SEG_OFF_SEQ..SEG_OFF_RESERVED].copy_from_slice(&u64::from(seq).to_le_bytes());
    let crc = crc32c::crc32c(&h[..SEG_OFF_CRC]);
    h[SEG_OFF_CRC..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What a segment's first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderCheck {
    /// Checksummed, ours, and naming the expected group and seq.
    Ok,
    /// Too short or checksum mismatch: possibly a creation torn by a crash.
    Torn,
    /// Checksum passes but magic, version, group or seq is not what this
    /// file should hold.
    Foreign(String),
}

pub fn check_header(bytes: &[u8], group: u32, seq: u32) -> HeaderCheck {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return HeaderCheck::Torn;
    }
    let h = &bytes[..SEGMENT_HEADER_BYTES];
    let stored = u32::from_le_bytes(h[SEG_OFF_CRC..].try_into().expect("4 bytes"));
    if stored != crc32c::crc32c(&h[..SEG_OFF_CRC]) {
        return HeaderCheck::Torn;
    }
    let u32_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
    if h[..8] != SEGMENT_MAGIC {
        return HeaderCheck::Foreign("bad magic".into());
    }
    let version = u32_at(SEG_OFF_VERSION);
    if version != FORMAT_VERSION {
        return HeaderCheck::Foreign(format!(
            "format version {version}, expected {FORMAT_VERSION}"
        ));
    }
    let g = u32_at(SEG_OFF_GROUP);
    let s = u64::from_le_bytes(
        h[SEG_OFF_SEQ..SEG_OFF_RESERVED]
            .try_into()
            .expect("8 bytes"),
    );
    if g != group || s != u64::from(seq) {
        return HeaderCheck::Foreign(format!(
            "header names group {g} segment {s}, file is group {group} segment {seq}"
        ));
    }
    HeaderCheck::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_segment_header() {
        let h = encode_header(3, 258);
        assert_eq!(&h[..8], b"BERTHSEG");
        assert_eq!(
            &h[8..28],
            &[1, 0, 0, 0, 3, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(check_header(&h, 3, 258), HeaderCheck::Ok);
        assert!(matches!(check_header(&h, 4, 258), HeaderCheck::Foreign(_)));
        assert_eq!(check_header(&h[..31], 3, 258), HeaderCheck::Torn);
    }

    #[test]
    fn names_roundtrip() {
        assert_eq!(segment_name(42), "0000000042.seg");
        assert_eq!(parse_segment_name("0000000042.seg"), Some(42));
        assert_eq!(parse_segment_name("42.seg"), None);
        assert_eq!(parse_segment_name("0000000042.tmp"), None);
    }
}
