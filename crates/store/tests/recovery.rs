//! Every row of the recovery decision tables, driven through the
//! fault-injecting storage by building the on-disk image each case needs.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::record::{self, Record, RECORD_HEADER_BYTES};
use berth_store::segment::{encode_header, SEGMENT_HEADER_BYTES};
use berth_store::storage::Storage;
use berth_store::{MsgId, QueueId, Store, StoreConfig, StoreError};
use bytes::Bytes;
use common::{config, group_dir, open, wait};

const PAYLOAD_BYTES: usize = 100;
/// Size of one publish record to one queue with a 100-byte payload.
const REC: usize = RECORD_HEADER_BYTES + 12 + 8 + PAYLOAD_BYTES;

fn payload(m: MsgId) -> Bytes {
    Bytes::from(vec![u8::try_from(m.0 % 251).unwrap(); PAYLOAD_BYTES])
}

fn seg(n: u32) -> PathBuf {
    group_dir(0).join(format!("{n:010}.seg"))
}

/// Publishes `n` messages to queue 1 of a one-group store, then loses power
/// (everything completed is synced; no checkpoint covers it).
///
/// Its segments grow as they are written (none is prepared), so a test can
/// append the bytes of its case at the end of the records; a prepared
/// segment's zeros have tests of their own (`tests/prepared.rs`).
fn populate(fs: &FaultStorage, cfg: &StoreConfig, n: usize) -> Vec<MsgId> {
    let mut cfg = cfg.clone();
    cfg.segment_prepare = false;
    let (store, _) = open(fs, &cfg);
    let ids: Vec<MsgId> = (0..n)
        .map(|_| {
            let m = store.next_msg_id();
            wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
            m
        })
        .collect();
    fs.crash();
    drop(store);
    fs.power_on();
    ids
}

fn reopen(
    fs: &FaultStorage,
    cfg: &StoreConfig,
) -> Result<(Store, berth_store::Recovered), StoreError> {
    Store::open_with(cfg.clone(), Arc::new(fs.clone()))
}

/// The store's record salt, from its manifest: records a test writes into
/// a segment must carry it to be valid.
fn salt(fs: &FaultStorage) -> u32 {
    let path = PathBuf::from("/data/MANIFEST");
    berth_store::manifest::Manifest::decode(&fs.contents(&path).unwrap(), &path)
        .unwrap()
        .record_salt
}

fn msgs(rec: &berth_store::Recovered) -> Vec<MsgId> {
    rec.queues
        .get(&QueueId(1))
        .map(|v| v.iter().map(|m| m.msg).collect())
        .unwrap_or_default()
}

#[test]
fn torn_tail_is_truncated_not_fatal() {
    let fs = FaultStorage::new(1);
    let cfg = config(1);
    let ids = populate(&fs, &cfg, 10);
    let mut bytes = fs.contents(&seg(1)).unwrap();
    let mut torn = Vec::new();
    record::encode(
        salt(&fs),
        11,
        &Record::MetaDelete {
            key: b"half-written",
        },
        &mut torn,
    );
    bytes.extend_from_slice(&torn[..torn.len() / 2]);
    fs.put_durable(&seg(1), &bytes).unwrap();
    let (store, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert_eq!(rec.stats.truncated_bytes, (torn.len() / 2) as u64);
    assert!(rec.damage.is_empty());
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
    drop(store);
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec).len(), 11);
}

#[test]
fn mid_segment_checksum_mismatch_is_quarantined_and_later_records_kept() {
    let fs = FaultStorage::new(2);
    let cfg = config(1);
    let ids = populate(&fs, &cfg, 10);
    let bad = SEGMENT_HEADER_BYTES + 4 * REC;
    fs.flip_bit(&seg(1), (bad + REC - 10) as u64, 3).unwrap(); // in the payload
    let (store, rec) = reopen(&fs, &cfg).unwrap();
    let mut expected = ids.clone();
    expected.remove(4);
    assert_eq!(
        msgs(&rec),
        expected,
        "every valid record after the damage is kept"
    );
    assert_eq!(rec.damage.len(), 1);
    let d = &rec.damage[0];
    assert_eq!((d.offset, d.len), (bad as u64, REC as u64));
    assert_eq!(d.records_lost, Some(1));
    assert_eq!(d.messages, vec![ids[4]], "the loss names the message");
    assert_eq!(d.queues, vec![QueueId(1)], "and its queue");
    assert_eq!(
        fs.contents(&d.quarantine_file).unwrap().len(),
        REC,
        "damaged bytes kept aside"
    );
    for &m in &expected {
        assert_eq!(store.read(QueueId(1), m).unwrap(), payload(m));
    }
    drop(store);
    // Patched with a Hole: the next start neither re-reports nor fails.
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
    assert_eq!(msgs(&rec), expected);
}

#[test]
fn damage_at_the_end_of_a_sealed_segment_is_quarantined() {
    let fs = FaultStorage::new(3);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    let ids = populate(&fs, &cfg, 60);
    let len1 = fs.contents(&seg(1)).unwrap().len();
    let per_seg = (len1 - SEGMENT_HEADER_BYTES) / REC;
    fs.flip_bit(&seg(1), (len1 - 30) as u64, 0).unwrap();
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    let mut expected = ids.clone();
    expected.remove(per_seg - 1);
    assert_eq!(msgs(&rec), expected);
    assert_eq!(rec.damage.len(), 1);
    assert_eq!(rec.damage[0].messages, vec![ids[per_seg - 1]]);
    assert_eq!(
        rec.damage[0].records_lost, None,
        "nothing valid followed in that segment"
    );
}

fn expect_recovery_failure(fs: &FaultStorage, cfg: &StoreConfig, what: &str) {
    match reopen(fs, cfg) {
        Err(StoreError::Recovery { reason, .. }) => assert!(reason.contains(what), "{reason}"),
        Err(e) => panic!("expected a recovery failure mentioning {what:?}, got {e}"),
        Ok(_) => panic!("expected a recovery failure mentioning {what:?}, store opened"),
    }
}

#[test]
fn out_of_order_record_fails_recovery() {
    let fs = FaultStorage::new(4);
    let cfg = config(1);
    populate(&fs, &cfg, 5);
    let mut bytes = fs.contents(&seg(1)).unwrap();
    let first = bytes[SEGMENT_HEADER_BYTES..SEGMENT_HEADER_BYTES + REC].to_vec();
    bytes.extend_from_slice(&first); // lsn 1 again
    fs.put_durable(&seg(1), &bytes).unwrap();
    expect_recovery_failure(&fs, &cfg, "out of order");
}

#[test]
fn missing_records_without_damage_fail_recovery() {
    let fs = FaultStorage::new(5);
    let cfg = config(1);
    populate(&fs, &cfg, 5);
    let mut bytes = fs.contents(&seg(1)).unwrap();
    let at = SEGMENT_HEADER_BYTES + 2 * REC;
    bytes.drain(at..at + REC);
    fs.put_durable(&seg(1), &bytes).unwrap();
    expect_recovery_failure(&fs, &cfg, "missing");
}

#[test]
fn checksummed_but_unparseable_record_fails_recovery() {
    let fs = FaultStorage::new(6);
    let cfg = config(1);
    populate(&fs, &cfg, 3);
    let mut bytes = fs.contents(&seg(1)).unwrap();
    let mut r = Vec::new();
    record::encode(salt(&fs), 4, &Record::Purge { queue: QueueId(1) }, &mut r);
    r[record::OFF_KIND] = 200; // a kind from the future
    let crc = crc32c::crc32c_append(salt(&fs), &r[4..]);
    r[..4].copy_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(&r);
    fs.put_durable(&seg(1), &bytes).unwrap();
    expect_recovery_failure(&fs, &cfg, "not understood");
}

#[test]
fn torn_creation_of_the_newest_segment_is_removed() {
    let fs = FaultStorage::new(7);
    let cfg = config(1);
    let ids = populate(&fs, &cfg, 3);
    fs.create(&seg(2)).unwrap();
    fs.put_durable(&seg(2), &encode_header(0, 2)[..10]).unwrap();
    let (store, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert!(!fs
        .names(&group_dir(0))
        .contains(&"0000000002.seg".to_string()));
    // Numbering stays consecutive: the next segment reuses number 2.
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
    fs.crash();
    drop(store);
    fs.power_on();
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec).len(), 4);
}

#[test]
fn damaged_header_of_a_sealed_segment_fails_recovery() {
    let fs = FaultStorage::new(8);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    populate(&fs, &cfg, 60);
    fs.flip_bit(&seg(1), 9, 1).unwrap();
    expect_recovery_failure(&fs, &cfg, "damaged header of a sealed segment");
}

#[test]
fn foreign_segment_fails_recovery() {
    let fs = FaultStorage::new(9);
    let cfg = config(1);
    populate(&fs, &cfg, 3);
    fs.create(&seg(2)).unwrap();
    fs.put_durable(&seg(2), &encode_header(5, 2)).unwrap();
    expect_recovery_failure(&fs, &cfg, "not this group's segment");
}

#[test]
fn corrupt_latest_checkpoint_falls_back_to_the_previous_one() {
    let fs = FaultStorage::new(10);
    let cfg = config(1);
    let (store, _) = open(&fs, &cfg);
    let mut ids = Vec::new();
    for round in 0..3 {
        for _ in 0..5 {
            let m = store.next_msg_id();
            wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
            ids.push(m);
        }
        if round < 2 {
            store.checkpoint().unwrap();
        }
    }
    fs.crash();
    drop(store);
    fs.power_on();
    let ckpts: Vec<String> = fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    assert_eq!(ckpts.len(), 2);
    let newest = group_dir(0).join(ckpts.last().unwrap());
    fs.flip_bit(&newest, 20, 2).unwrap();
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec), ids);
    assert_eq!(rec.stats.checkpoints_ignored, vec![newest]);
}

#[test]
fn lost_checkpoints_after_reclaim_fail_recovery_instead_of_resurrecting_acks() {
    let fs = FaultStorage::new(11);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    let (store, _) = open(&fs, &cfg);
    for _ in 0..60 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
        wait(|d| store.remove(QueueId(1), &[m], Some(d))).unwrap();
    }
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    assert!(store.stats()[0].segments_deleted > 0);
    drop(store);
    for name in fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
    {
        fs.flip_bit(&group_dir(0).join(name), 30, 0).unwrap();
    }
    expect_recovery_failure(&fs, &cfg, "reclaimed");
}

#[test]
fn damaged_header_over_valid_records_of_the_newest_segment_fails_recovery() {
    let fs = FaultStorage::new(12);
    let cfg = config(1);
    populate(&fs, &cfg, 3);
    fs.flip_bit(&seg(1), 2, 4).unwrap();
    expect_recovery_failure(&fs, &cfg, "damaged header over valid records");
}

/// Publishes `n` messages to queue 1 over several small segments, then
/// checkpoints twice so replay starts past the first segment, and closes.
fn populate_checkpointed(fs: &FaultStorage, cfg: &StoreConfig, n: usize) -> Vec<MsgId> {
    let (store, _) = open(fs, cfg);
    let ids: Vec<MsgId> = (0..n)
        .map(|_| {
            let m = store.next_msg_id();
            wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
            m
        })
        .collect();
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    drop(store);
    ids
}

#[test]
fn missing_segment_with_live_messages_refuses_to_start() {
    let fs = FaultStorage::new(13);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    populate_checkpointed(&fs, &cfg, 100);
    fs.remove(&seg(1)).unwrap();
    fs.sync_dir(&group_dir(0)).unwrap();
    let err = match reopen(&fs, &cfg) {
        Ok((_, rec)) => panic!(
            "opened with a segment of live messages missing; damage: {:?}",
            rec.damage
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("0000000001.seg"), "{err}");
    assert!(err.contains("restore"), "{err}");
    assert!(err.contains("accept_missing_segments"), "{err}");
}

#[test]
fn missing_segment_is_dropped_and_reported_only_when_the_loss_is_accepted() {
    let fs = FaultStorage::new(14);
    let mut cfg = config(1);
    cfg.segment_size_bytes = 4096;
    let ids = populate_checkpointed(&fs, &cfg, 100);
    fs.remove(&seg(1)).unwrap();
    fs.sync_dir(&group_dir(0)).unwrap();
    cfg.accept_missing_segments = true;
    let (store, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(rec.damage.len(), 1, "{:?}", rec.damage);
    let lost = &rec.damage[0];
    assert_eq!(lost.file, seg(1));
    assert!(!lost.messages.is_empty());
    let kept = msgs(&rec);
    assert_eq!(kept.len() + lost.messages.len(), ids.len());
    assert!(kept.iter().all(|m| !lost.messages.contains(m)));
    // The loss was accepted once: the next start is clean, with or without
    // the flag.
    drop(store);
    cfg.accept_missing_segments = false;
    let (_store, rec) = reopen(&fs, &cfg).unwrap();
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
    assert_eq!(msgs(&rec), kept);
}

/// A storage that reports one file as 4 GiB longer than it is (as a
/// segment grown past 32-bit offsets would be), without holding the bytes.
struct Oversized {
    inner: FaultStorage,
    path: PathBuf,
}

struct OversizedFile(Arc<dyn berth_store::storage::StorageFile>);

impl berth_store::storage::StorageFile for OversizedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.len()? + (4 << 30))
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

impl Storage for Oversized {
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Arc<dyn berth_store::storage::StorageFile>> {
        self.inner.create(path)
    }
    fn open(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Arc<dyn berth_store::storage::StorageFile>> {
        let f = self.inner.open(path)?;
        Ok(if path == self.path {
            Arc::new(OversizedFile(f))
        } else {
            f
        })
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

#[test]
fn segment_over_4_gib_is_refused_with_file_and_offset() {
    let fs = FaultStorage::new(15);
    let cfg = config(1);
    populate(&fs, &cfg, 3);
    let storage = Oversized {
        inner: fs.clone(),
        path: seg(1),
    };
    match Store::open_with(cfg.clone(), Arc::new(storage)) {
        Err(StoreError::Recovery {
            path,
            offset,
            reason,
            ..
        }) => {
            assert_eq!(path, seg(1));
            assert_eq!(offset, 1 << 32, "{reason}");
            assert!(reason.contains("4 GiB"), "{reason}");
        }
        Err(e) => panic!("expected a recovery error at offset 4 GiB, got: {e}"),
        Ok(_) => panic!("opened a segment over 4 GiB"),
    }
}

#[test]
fn damaged_range_larger_than_a_record_is_quarantined_under_several_holes() {
    let fs = FaultStorage::new(16);
    let cfg = config(1);
    populate(&fs, &cfg, 1);
    // Segment 1: header, record lsn 1, then 130 MiB of damage, then lsn 2.
    let mut image = fs.contents(&seg(1)).unwrap();
    assert_eq!(image.len(), SEGMENT_HEADER_BYTES + REC);
    let damage = 130 << 20;
    image.resize(image.len() + damage, 0xFF);
    record::encode(
        salt(&fs),
        2,
        &Record::Publish {
            msg: MsgId(2),
            queues: std::borrow::Cow::Borrowed(&[QueueId(1)]),
            payload: &payload(MsgId(2)),
        },
        &mut image,
    );
    fs.put_durable(&seg(1), &image).unwrap();
    drop(image);
    let (store, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec), vec![MsgId(1), MsgId(2)]);
    assert_eq!(rec.damage.len(), 1);
    assert_eq!(rec.damage[0].len, damage as u64);
    assert_eq!(rec.damage[0].offset, (SEGMENT_HEADER_BYTES + REC) as u64);
    drop(store);
    let (_store, rec) = reopen(&fs, &cfg).unwrap();
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
    assert_eq!(msgs(&rec), vec![MsgId(1), MsgId(2)]);
}

#[test]
fn checkpoint_of_another_format_version_is_refused_not_skipped() {
    let fs = FaultStorage::new(17);
    let cfg = config(1);
    let (store, _) = open(&fs, &cfg);
    for _ in 0..3 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
        store.checkpoint().unwrap();
    }
    drop(store);
    let newest = fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
        .max()
        .map(|n| group_dir(0).join(n))
        .unwrap();
    let mut bytes = fs.contents(&newest).unwrap();
    bytes[8..12].copy_from_slice(&4u32.to_le_bytes());
    let end = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    fs.put_durable(&newest, &bytes).unwrap();
    match reopen(&fs, &cfg) {
        Err(StoreError::FormatVersion {
            path,
            found,
            expected,
        }) => {
            assert_eq!(path, newest);
            assert_eq!((found, expected), (4, 3));
        }
        Err(e) => panic!("expected a format version error, got: {e}"),
        Ok(_) => panic!("opened past a checkpoint of another format version"),
    }
}

/// A payload a publisher chose, holding a well-formed record: what the
/// resynchronising scan after damage could mistake for a journal record.
fn forged_payload(forged: &Record<'_>) -> Bytes {
    let mut p = b"innocent-looking prefix".to_vec();
    // The publisher cannot know the store's record salt: its best guess is
    // the unsalted checksum.
    record::encode(0, 1_000_000, forged, &mut p);
    p.extend_from_slice(&[b'z'; 64]);
    Bytes::from(p)
}

/// Publishes 3 victims to queue 1 and then an attacker's message to queue
/// 2 whose payload embeds `forged`; returns the segment image and the
/// offset of the attacker's record.
///
/// Preparation is off, as in `populate`: every record must land in
/// segment 1, which ends at the attacker's record (an early roll into a
/// prepared segment could put the attacker's record in segment 2).
fn victims_and_forgery(
    fs: &FaultStorage,
    cfg: &StoreConfig,
    forged: &Record<'_>,
) -> (Vec<u8>, usize) {
    let mut cfg = cfg.clone();
    cfg.segment_prepare = false;
    let (store, _) = open(fs, &cfg);
    for _ in 0..3 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
    }
    let before = fs.contents(&seg(1)).unwrap().len();
    let m = store.next_msg_id();
    wait(|d| store.publish(m, &[QueueId(2)], forged_payload(forged), Some(d))).unwrap();
    fs.crash();
    drop(store);
    fs.power_on();
    (fs.contents(&seg(1)).unwrap(), before)
}

#[test]
fn forged_purge_in_a_torn_payload_is_never_applied() {
    let fs = FaultStorage::new(18);
    let cfg = config(1);
    let forged = Record::Purge { queue: QueueId(1) };
    let (image, at) = victims_and_forgery(&fs, &cfg, &forged);
    // Power failed while the attacker's record was being written: it is
    // torn after the embedded record.
    let cut = image.len() - 32;
    assert!(cut > at);
    fs.put_durable(&seg(1), &image[..cut]).unwrap();
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(
        msgs(&rec).len(),
        3,
        "queue 1 lost messages to a purge embedded in a payload: {:?}",
        rec.damage
    );
    assert!(rec.damage.is_empty(), "{:?}", rec.damage);
}

#[test]
fn forged_remove_in_a_damaged_payload_is_never_applied() {
    let fs = FaultStorage::new(19);
    let cfg = config(1);
    let victims = [MsgId(1), MsgId(2), MsgId(3)];
    let forged = Record::Remove {
        queue: QueueId(1),
        msgs: std::borrow::Cow::Borrowed(&victims),
    };
    let (mut image, at) = victims_and_forgery(&fs, &cfg, &forged);
    // Bit rot in the attacker's record header (its lsn), so the scan
    // resynchronises inside its payload.
    image[at + record::OFF_LSN] ^= 0x40;
    fs.put_durable(&seg(1), &image).unwrap();
    let (_s, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(
        msgs(&rec),
        victims.to_vec(),
        "queue 1 lost messages to a removal embedded in a payload: {:?}",
        rec.damage
    );
}

/// Checkpoints after the first are deltas: each costs what changed since
/// the previous one, not what is live (issue 20); a restart loads the base
/// and every delta of the chain, and a delta whose parent is damaged is
/// not used (the store falls back, never applies half a chain).
#[test]
fn checkpoints_after_a_base_are_deltas_that_cost_what_changed() {
    let fs = FaultStorage::new(23);
    let cfg = config(1);
    let (store, _) = open(&fs, &cfg);
    let mut live: Vec<MsgId> = Vec::new();
    for _ in 0..2_000 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
        live.push(m);
    }
    store.checkpoint().unwrap();
    for round in 0..3 {
        let m = store.next_msg_id();
        wait(|d| store.publish(m, &[QueueId(1)], payload(m), Some(d))).unwrap();
        live.push(m);
        let gone = live.remove(round);
        wait(|d| store.remove(QueueId(1), &[gone], Some(d))).unwrap();
        store.checkpoint().unwrap();
    }
    drop(store);
    let mut ckpts: Vec<PathBuf> = fs
        .names(&group_dir(0))
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
        .map(|n| group_dir(0).join(n))
        .collect();
    ckpts.sort();
    let sizes: Vec<usize> = ckpts
        .iter()
        .map(|p| fs.contents(p).unwrap().len())
        .collect();
    let base = *sizes.iter().max().unwrap();
    assert!(
        base > 2_000 * 20,
        "the base lists every live message: {sizes:?}"
    );
    let deltas = sizes.iter().filter(|&&s| s < 200).count();
    assert!(deltas >= 2, "later checkpoints are small deltas: {sizes:?}");

    let (store, rec) = reopen(&fs, &cfg).unwrap();
    assert_eq!(msgs(&rec), live);
    drop(store);

    // Damage the oldest delta: the newer links built on it are not used.
    let first_delta = ckpts
        .iter()
        .find(|p| fs.contents(p).unwrap().len() < 200)
        .unwrap()
        .clone();
    let mut bytes = fs.contents(&first_delta).unwrap();
    bytes[20] ^= 1;
    fs.put_durable(&first_delta, &bytes).unwrap();
    match reopen(&fs, &cfg) {
        // Fell back to the base, and the journal since it was still there.
        Ok((_, rec)) => {
            assert_eq!(msgs(&rec), live);
            assert!(!rec.stats.checkpoints_ignored.is_empty());
        }
        // Or refused, because that journal was reclaimed; never a wrong set.
        Err(e) => assert!(
            e.to_string().contains("segment") || e.to_string().contains("checkpoint"),
            "{e}"
        ),
    }
}
