//! The event file format and its readers: per-group files of opaque event
//! payloads, each stamped with a time and a per-group sequence, and the
//! k-way merge that puts several groups' events into one time order.
//!
//! The store does not know what an event means (the broker encodes the
//! payload); it only frames, checksums, orders and rotates them. The
//! writer side is [`crate::writer`].
//!
//! File layout (see docs/FORMAT.md, "Event files"): an 8-byte magic
//! [`EVENT_FILE_MAGIC`], then records:
//!
//! ```text
//!  0        4        8                16               24       28
//!  +--------+--------+----------------+----------------+--------+-------------+
//!  | crc32c | length |    time_us     |      seq       | group  | payload ... |
//!  +--------+--------+----------------+----------------+--------+-------------+
//! ```
//!
//! all little-endian; `length` counts the bytes after itself (20 + payload);
//! `crc32c` covers bytes 4 .. 8 + length (everything after itself, unsalted:
//! event payloads are written by the broker, not copied from publishers).
//!
//! Invariants:
//! - Within one group's files, `seq` increases by one per record and
//!   `time_us` never decreases (both are assigned under the group's event
//!   lock), so (time, group, seq) is a total order consistent with each
//!   group's file order.
//! - A reader never trusts a record whose checksum fails: it stops there
//!   (a torn tail) and never panics on any byte string.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use berth_store::storage::Storage;
use berth_store::StoreError;

/// First bytes of every event file ("BERTHEV" + format version 1).
pub const EVENT_FILE_MAGIC: [u8; 8] = *b"BERTHEV\x01";
/// Bytes of [`EVENT_FILE_MAGIC`] at the start of a file.
pub const EVENT_FILE_HEADER_BYTES: usize = EVENT_FILE_MAGIC.len();

pub const EV_OFF_CRC: usize = 0;
pub const EV_OFF_LENGTH: usize = EV_OFF_CRC + 4;
pub const EV_OFF_TIME: usize = EV_OFF_LENGTH + 4;
pub const EV_OFF_SEQ: usize = EV_OFF_TIME + 8;
pub const EV_OFF_GROUP: usize = EV_OFF_SEQ + 8;
pub const EV_OFF_PAYLOAD: usize = EV_OFF_GROUP + 4;
/// Bytes of a record before its payload.
pub const EVENT_HEADER_BYTES: usize = EV_OFF_PAYLOAD;
const _: () = assert!(EVENT_HEADER_BYTES == 28);

/// Largest payload an event may carry. Bounded so that a corrupt length
/// never makes a reader allocate much; broker events are a few hundred
/// bytes (names are at most 255 bytes each).
pub const EVENT_PAYLOAD_BYTES_MAX: usize = 4096;

/// Name prefix of a group's event files (`events-00000001.log`).
pub const GROUP_EVENT_FILE_PREFIX: &str = "events-";
/// Name prefix of the combined (merged) event files, in the first data
/// directory.
pub const MERGED_EVENT_FILE_PREFIX: &str = "events-merged-";
const EVENT_FILE_SUFFIX: &str = ".log";

/// One event as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// Microseconds since the Unix epoch, from the broker's clock.
    pub time_us: u64,
    pub group: u32,
    /// Position in its group's event stream (1, 2, 3, …).
    pub seq: u64,
    /// Opaque to the store (the broker's encoding).
    pub payload: Vec<u8>,
}

impl EventRecord {
    /// The merge order: time, then group, then sequence.
    pub fn order_key(&self) -> (u64, u32, u64) {
        (self.time_us, self.group, self.seq)
    }
}

/// Appends one framed record to `out`.
///
/// # Panics
/// If the payload exceeds [`EVENT_PAYLOAD_BYTES_MAX`] (callers check).
pub fn encode_event(out: &mut Vec<u8>, time_us: u64, group: u32, seq: u64, payload: &[u8]) {
    assert!(
        payload.len() <= EVENT_PAYLOAD_BYTES_MAX,
        "event payload too long"
    );
    let start = out.len();
    let length = u32::try_from(EVENT_HEADER_BYTES - EV_OFF_TIME + payload.len())
        .expect("bounded by EVENT_PAYLOAD_BYTES_MAX");
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&time_us.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + EV_OFF_LENGTH..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Why decoding stopped before the end of the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventStop {
    /// The bytes end inside a record: a write in progress or torn by a
    /// crash. A follower waits for more.
    Incomplete,
    /// A record's length or checksum is wrong: the rest is not trusted.
    Corrupt,
}

/// Decodes whole records from `bytes` (which start at a record boundary).
/// Returns the bytes consumed and why it stopped early, if it did.
pub fn decode_events(bytes: &[u8], out: &mut Vec<EventRecord>) -> (usize, Option<EventStop>) {
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < EVENT_HEADER_BYTES {
            return (at, Some(EventStop::Incomplete));
        }
        let word = |o: usize| u32::from_le_bytes(rest[o..o + 4].try_into().expect("4 bytes"));
        let long = |o: usize| u64::from_le_bytes(rest[o..o + 8].try_into().expect("8 bytes"));
        let length = word(EV_OFF_LENGTH) as usize;
        let payload_len = length.wrapping_sub(EVENT_HEADER_BYTES - EV_OFF_TIME);
        if length < EVENT_HEADER_BYTES - EV_OFF_TIME || payload_len > EVENT_PAYLOAD_BYTES_MAX {
            return (at, Some(EventStop::Corrupt));
        }
        let total = EV_OFF_TIME + length;
        if rest.len() < total {
            return (at, Some(EventStop::Incomplete));
        }
        if crc32c::crc32c(&rest[EV_OFF_LENGTH..total]) != word(EV_OFF_CRC) {
            return (at, Some(EventStop::Corrupt));
        }
        out.push(EventRecord {
            time_us: long(EV_OFF_TIME),
            seq: long(EV_OFF_SEQ),
            group: word(EV_OFF_GROUP),
            payload: rest[EV_OFF_PAYLOAD..total].to_vec(),
        });
        at += total;
    }
    (at, None)
}

/// File name of event file number `n` with this prefix.
pub fn event_file_name(prefix: &str, n: u64) -> String {
    format!("{prefix}{n:08}{EVENT_FILE_SUFFIX}")
}

/// The numbers of the event files with this prefix in `dir`, ascending.
/// A missing directory has none.
pub fn list_event_files(
    storage: &dyn Storage,
    dir: &Path,
    prefix: &str,
) -> Result<Vec<u64>, StoreError> {
    let names = match storage.list(dir) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    let mut nos: Vec<u64> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.strip_suffix(EVENT_FILE_SUFFIX))
        // `events-merged-…` also starts with `events-`: digits only.
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|n| n.parse().ok())
        .collect();
    nos.sort_unstable();
    Ok(nos)
}

/// A damaged place a reader skipped: file, offset, what was wrong.
pub type Damage = (PathBuf, u64, EventStop);

/// Follows one directory's event files (one group's, or the merged ones):
/// each [`EventTail::poll`] returns the records written since the last.
/// Read-only, so it works on a running broker's files.
pub struct EventTail {
    dir: PathBuf,
    prefix: &'static str,
    /// File being read and the offset of the next record in it.
    file: Option<(u64, u64)>,
    /// Records skipped because a file had a corrupt or torn part (the
    /// reader moved on to the next file).
    pub damaged: Vec<Damage>,
}

impl EventTail {
    pub fn new(dir: PathBuf, prefix: &'static str) -> Self {
        Self {
            dir,
            prefix,
            file: None,
            damaged: Vec::new(),
        }
    }

    /// A tail that starts at file number `no` (skipping older files).
    pub fn from_file(dir: PathBuf, prefix: &'static str, no: u64) -> Self {
        Self {
            file: Some((no, EVENT_FILE_HEADER_BYTES as u64)),
            ..Self::new(dir, prefix)
        }
    }

    /// New records since the last poll, in file order. A file whose tail
    /// does not decode is left for the next one once a newer file exists
    /// (the writer moved on, so the tail will never complete); until then
    /// the reader waits at that point.
    pub fn poll(
        &mut self,
        storage: &dyn Storage,
        out: &mut Vec<EventRecord>,
    ) -> Result<(), StoreError> {
        loop {
            let files = list_event_files(storage, &self.dir, self.prefix)?;
            let (no, offset) = match self.file {
                Some((no, off)) if files.contains(&no) => (no, off),
                // Start at the oldest file, or skip past one removed by
                // retention while we were reading it.
                Some((no, _)) => match files.iter().find(|n| **n > no) {
                    Some(n) => (*n, EVENT_FILE_HEADER_BYTES as u64),
                    None => return Ok(()),
                },
                None => match files.first() {
                    Some(n) => (*n, EVENT_FILE_HEADER_BYTES as u64),
                    None => return Ok(()),
                },
            };
            let path = self.dir.join(event_file_name(self.prefix, no));
            // `None`: removed by retention between the listing and the
            // open; go on with the next file.
            let (consumed, stop) = match read_from(storage, &path, offset)? {
                Some(bytes) => {
                    let (n, stop) = decode_events(&bytes, out);
                    (n as u64, stop)
                }
                None => (0, None),
            };
            let offset = offset + consumed;
            self.file = Some((no, offset));
            let newer = files.iter().find(|n| **n > no);
            match (stop, newer) {
                (_, None) => return Ok(()),
                (None, Some(&next)) => {
                    self.file = Some((next, EVENT_FILE_HEADER_BYTES as u64));
                }
                (Some(why), Some(&next)) => {
                    self.damaged.push((path, offset, why));
                    self.file = Some((next, EVENT_FILE_HEADER_BYTES as u64));
                }
            }
        }
    }
}

/// The bytes of `path` from `offset` to its end; `None` if it is gone. A
/// file shorter than its header, or with another magic, reads as empty
/// past its header.
fn read_from(
    storage: &dyn Storage,
    path: &Path,
    offset: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let file = match storage.open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", path, e)),
    };
    let len = file.len().map_err(|e| StoreError::io("stat", path, e))?;
    let mut magic = [0u8; EVENT_FILE_HEADER_BYTES];
    if len < EVENT_FILE_HEADER_BYTES as u64
        || file.read_exact_at(&mut magic, 0).is_err()
        || magic != EVENT_FILE_MAGIC
    {
        return Ok(Some(Vec::new()));
    }
    if len <= offset {
        return Ok(Some(Vec::new()));
    }
    let n = usize::try_from(len - offset)
        .map_err(|_| StoreError::Invalid(format!("{} is too large to read", path.display())))?;
    let mut buf = vec![0; n];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| StoreError::io("read", path, e))?;
    Ok(Some(buf))
}

/// Merges per-group streams (each already in its group's order) into one
/// total order by (time, group, seq): a k-way merge, stable within each
/// group.
pub fn merge_events(streams: Vec<Vec<EventRecord>>) -> Vec<EventRecord> {
    let total = streams.iter().map(Vec::len).sum();
    let mut iters: Vec<std::vec::IntoIter<EventRecord>> =
        streams.into_iter().map(Vec::into_iter).collect();
    let mut heap = BinaryHeap::new();
    let mut heads: Vec<Option<EventRecord>> = Vec::with_capacity(iters.len());
    for (i, it) in iters.iter_mut().enumerate() {
        let head = it.next();
        if let Some(h) = &head {
            heap.push(Reverse((h.order_key(), i)));
        }
        heads.push(head);
    }
    let mut out = Vec::with_capacity(total);
    while let Some(Reverse((_, i))) = heap.pop() {
        let rec = heads[i].take().expect("a stream in the heap has a head");
        out.push(rec);
        if let Some(next) = iters[i].next() {
            heap.push(Reverse((next.order_key(), i)));
            heads[i] = Some(next);
        }
    }
    out
}

/// Reads every event of a store's groups (and nothing of the merged
/// files), merged into time order; also returns the damaged places found.
pub fn read_all_groups(
    storage: &dyn Storage,
    group_dirs: &[PathBuf],
) -> Result<(Vec<EventRecord>, Vec<Damage>), StoreError> {
    let mut streams = Vec::new();
    let mut damaged = Vec::new();
    for dir in group_dirs {
        let mut tail = EventTail::new(dir.clone(), GROUP_EVENT_FILE_PREFIX);
        let mut recs = Vec::new();
        tail.poll(storage, &mut recs)?;
        damaged.append(&mut tail.damaged);
        streams.push(recs);
    }
    Ok((merge_events(streams), damaged))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(time_us: u64, group: u32, seq: u64) -> EventRecord {
        EventRecord {
            time_us,
            group,
            seq,
            payload: vec![u8::try_from(seq % 256).expect("small")],
        }
    }

    #[test]
    fn golden_bytes_of_one_record() {
        let mut out = Vec::new();
        encode_event(&mut out, 0x0102, 3, 7, b"hi");
        assert_eq!(out.len(), EVENT_HEADER_BYTES + 2);
        assert_eq!(&out[EV_OFF_LENGTH..EV_OFF_TIME], &22u32.to_le_bytes());
        assert_eq!(&out[EV_OFF_TIME..EV_OFF_SEQ], &0x0102u64.to_le_bytes());
        assert_eq!(&out[EV_OFF_SEQ..EV_OFF_GROUP], &7u64.to_le_bytes());
        assert_eq!(&out[EV_OFF_GROUP..EV_OFF_PAYLOAD], &3u32.to_le_bytes());
        assert_eq!(&out[EV_OFF_PAYLOAD..], b"hi");
        let crc = crc32c::crc32c(&out[EV_OFF_LENGTH..]);
        assert_eq!(&out[..EV_OFF_LENGTH], &crc.to_le_bytes());
    }

    #[test]
    fn torn_tail_stops_decoding_without_panic_at_every_cut() {
        let mut bytes = Vec::new();
        encode_event(&mut bytes, 1, 0, 1, b"first");
        let one = bytes.len();
        encode_event(&mut bytes, 2, 0, 2, b"second");
        for cut in 0..bytes.len() {
            let mut out = Vec::new();
            let (n, stop) = decode_events(&bytes[..cut], &mut out);
            let expect = usize::from(cut >= one);
            assert_eq!(out.len(), expect, "cut at {cut}");
            assert_eq!(n, if cut >= one { one } else { 0 });
            assert_eq!(stop.is_some(), cut != one && cut != 0, "cut at {cut}");
        }
    }

    #[test]
    fn flipped_byte_is_corrupt_not_trusted() {
        let mut bytes = Vec::new();
        encode_event(&mut bytes, 1, 0, 1, b"payload");
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            let mut out = Vec::new();
            let (n, stop) = decode_events(&b, &mut out);
            assert_eq!((n, out.len()), (0, 0), "flip at {i}");
            assert!(stop.is_some());
        }
    }

    fn file_with(records: &[(u64, u64)]) -> Vec<u8> {
        let mut b = EVENT_FILE_MAGIC.to_vec();
        for &(t, s) in records {
            encode_event(&mut b, t, 0, s, b"e");
        }
        b
    }

    #[test]
    fn damage_in_an_older_file_is_skipped_and_reported_torn_newest_tail_waits() {
        let (_dir, dir) = berth_testdir::TestDir::new("event-tail").and_path();
        let name = |n| dir.join(event_file_name(GROUP_EVENT_FILE_PREFIX, n));
        // File 1: a good record, a corrupt one, a good one (never trusted).
        let mut one = file_with(&[(1, 1), (2, 2), (3, 3)]);
        let second = EVENT_FILE_HEADER_BYTES + EVENT_HEADER_BYTES + 1;
        one[second + EV_OFF_PAYLOAD] ^= 1;
        std::fs::write(name(1), one).unwrap();
        // File 2 (newest): two good records and a torn third.
        let mut two = file_with(&[(4, 4), (5, 5), (6, 6)]);
        two.truncate(two.len() - 3);
        std::fs::write(name(2), &two).unwrap();
        let storage = berth_store::storage::OsStorage;
        let mut tail = EventTail::new(dir.clone(), GROUP_EVENT_FILE_PREFIX);
        let mut out = Vec::new();
        tail.poll(&storage, &mut out).unwrap();
        let seqs: Vec<u64> = out.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 4, 5]);
        assert_eq!(tail.damaged.len(), 1, "the corrupt record in file 1");
        assert_eq!(tail.damaged[0].1, second as u64);
        assert_eq!(tail.damaged[0].2, EventStop::Corrupt);
        // The writer completes the torn record: a follower picks it up.
        let full = file_with(&[(4, 4), (5, 5), (6, 6)]);
        std::fs::write(name(2), full).unwrap();
        out.clear();
        tail.poll(&storage, &mut out).unwrap();
        assert_eq!(out.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![6]);
        assert_eq!(tail.damaged.len(), 1, "a torn newest tail is not damage");
    }

    #[test]
    fn merge_orders_by_time_then_group_then_seq() {
        let a = vec![rec(1, 0, 1), rec(5, 0, 2), rec(5, 0, 3)];
        let b = vec![rec(2, 1, 1), rec(5, 1, 2), rec(9, 1, 3)];
        let merged = merge_events(vec![b, a]);
        let keys: Vec<_> = merged.iter().map(EventRecord::order_key).collect();
        assert_eq!(
            keys,
            vec![
                (1, 0, 1),
                (2, 1, 1),
                (5, 0, 2),
                (5, 0, 3),
                (5, 1, 2),
                (9, 1, 3)
            ]
        );
    }
}
