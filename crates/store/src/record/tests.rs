//! The record codec's golden bytes, round trips and fuzz-like properties.
use super::*;
use proptest::prelude::*;

fn roundtrip(lsn: u64, r: &Record<'_>) {
    let mut buf = Vec::new();
    encode(0, lsn, r, &mut buf);
    assert_eq!(buf.len(), r.encoded_len());
    match decode(0, &buf) {
        Decoded::Record {
            lsn: l,
            record,
            len,
        } => {
            assert_eq!(l, lsn);
            assert_eq!(&record, r);
            assert_eq!(len, buf.len());
        }
        other => panic!("{other:?}"),
    }
}

const GOLDEN_PUBLISH_CRC: u32 = 0x7b6a_f484;

/// `journal::next_valid` skips offsets whose header is all zeros without
/// decoding them: that is only right while no kind is 0, so no all-zero
/// header can decode as a record whatever the salt.
#[test]
fn no_record_kind_is_zero() {
    assert_eq!(Kind::from_u8(0), None);
    for salt in [0, 1, 0x5eed_1234, u32::MAX] {
        assert!(
            !matches!(decode(salt, &[0u8; 64]), Decoded::Record { .. }),
            "salt {salt}"
        );
    }
}

#[test]
fn golden_bytes_publish() {
    let r = Record::Publish {
        msg: MsgId(0x0102),
        queues: Cow::Borrowed(&[QueueId(7)]),
        payload: b"hi",
    };
    let mut buf = Vec::new();
    encode(0, 5, &r, &mut buf);
    #[rustfmt::skip]
    let expected: Vec<u8> = vec![
        0, 0, 0, 0,                 // crc (checked below)
        22, 0, 0, 0,                // body_len = 12 + 8 + 2
        5, 0, 0, 0, 0, 0, 0, 0,     // lsn
        1,                          // kind = Publish
        0, 0, 0,                    // reserved
        0x02, 0x01, 0, 0, 0, 0, 0, 0, // msg
        1, 0, 0, 0,                 // queue_count
        7, 0, 0, 0, 0, 0, 0, 0,     // queue
        b'h', b'i',                 // payload
    ];
    assert_eq!(&buf[4..], &expected[4..]);
    assert_eq!(buf[0..4], crc32c::crc32c(&buf[4..]).to_le_bytes());
    // Pin the checksum itself so an accidental change of coverage shows.
    assert_eq!(
        u32::from_le_bytes(buf[0..4].try_into().unwrap()),
        GOLDEN_PUBLISH_CRC
    );
}

#[test]
fn golden_bytes_remove_and_meta() {
    let mut buf = Vec::new();
    encode(
        0,
        9,
        &Record::Remove {
            queue: QueueId(3),
            msgs: Cow::Borrowed(&[MsgId(4), MsgId(5)]),
        },
        &mut buf,
    );
    #[rustfmt::skip]
    let body: [u8; 28] = [
        3, 0, 0, 0, 0, 0, 0, 0,
        2, 0, 0, 0,
        4, 0, 0, 0, 0, 0, 0, 0,
        5, 0, 0, 0, 0, 0, 0, 0,
    ];
    assert_eq!(&buf[RECORD_HEADER_BYTES..], &body);
    assert_eq!(buf[OFF_KIND], 2);
    assert_eq!(buf[..4], [0xd9, 0x68, 0xd1, 0x8e]);
    let mut buf = Vec::new();
    encode(
        0,
        1,
        &Record::MetaPut {
            key: b"k",
            value: b"vv",
        },
        &mut buf,
    );
    assert_eq!(&buf[RECORD_HEADER_BYTES..], &[1, 0, 0, 0, b'k', b'v', b'v']);
    assert_eq!(buf[OFF_KIND], 3);
    assert_eq!(buf[..4], [0x0a, 0xa2, 0x63, 0x13]);
}

/// Encodes `r` with salt 0 and checks every byte against `expected`
/// (written out by hand from FORMAT.md), the checksum against an
/// independently computed value, and that it decodes back to `r`.
fn golden(lsn: u64, r: &Record<'_>, expected: &[u8], crc: u32) {
    let mut buf = Vec::new();
    encode(0, lsn, r, &mut buf);
    assert_eq!(&buf[..], expected, "{r:?}");
    assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), crc);
    assert!(matches!(decode(0, &buf), Decoded::Record { record, .. } if &record == r));
}

#[test]
fn golden_bytes_meta_delete() {
    #[rustfmt::skip]
    golden(11, &Record::MetaDelete { key: b"q.k" }, &[
        0xa4, 0xa0, 0xdf, 0xc4,       // crc32c
        3, 0, 0, 0,                   // body_len
        11, 0, 0, 0, 0, 0, 0, 0,      // lsn
        4,                            // kind = MetaDelete
        0, 0, 0,                      // reserved
        b'q', b'.', b'k',             // key (the whole body)
    ], 0xc4df_a0a4);
}

#[test]
fn golden_bytes_purge() {
    #[rustfmt::skip]
    golden(12, &Record::Purge { queue: QueueId(0x0304) }, &[
        0x83, 0x33, 0x8a, 0x4b,       // crc32c
        8, 0, 0, 0,                   // body_len
        12, 0, 0, 0, 0, 0, 0, 0,      // lsn
        5,                            // kind = Purge
        0, 0, 0,                      // reserved
        0x04, 0x03, 0, 0, 0, 0, 0, 0, // queue
    ], 0x4b8a_3383);
}

#[test]
fn golden_bytes_relocate() {
    #[rustfmt::skip]
    golden(13, &Record::Relocate {
        msg: MsgId(0x0102),
        queues: Cow::Borrowed(&[QueueId(7), QueueId(9)]),
        payload: b"hi",
    }, &[
        0xef, 0x03, 0x3d, 0x82,       // crc32c
        30, 0, 0, 0,                  // body_len = 12 + 2 × 8 + 2
        13, 0, 0, 0, 0, 0, 0, 0,      // lsn
        6,                            // kind = Relocate
        0, 0, 0,                      // reserved
        0x02, 0x01, 0, 0, 0, 0, 0, 0, // msg
        2, 0, 0, 0,                   // queue_count
        7, 0, 0, 0, 0, 0, 0, 0,       // queue
        9, 0, 0, 0, 0, 0, 0, 0,       // queue
        b'h', b'i',                   // payload
    ], 0x823d_03ef);
}

#[test]
fn golden_bytes_hole() {
    #[rustfmt::skip]
    golden(0, &Record::Hole { body_len: 4 }, &[
        0xce, 0x8d, 0x93, 0x9b,       // crc32c
        4, 0, 0, 0,                   // body_len
        0, 0, 0, 0, 0, 0, 0, 0,       // lsn = 0: unnumbered
        7,                            // kind = Hole
        0, 0, 0,                      // reserved
        0, 0, 0, 0,                   // body: zeros
    ], 0x9b93_8dce);
}

#[test]
fn golden_bytes_append_and_trim() {
    #[rustfmt::skip]
    golden(14, &Record::Append { queue: QueueId(7), offset: 0x0102, payload: b"hi" }, &[
        0xdc, 0xb2, 0xb5, 0xa6,       // crc32c
        18, 0, 0, 0,                  // body_len = 16 + 2
        14, 0, 0, 0, 0, 0, 0, 0,      // lsn
        8,                            // kind = Append
        0, 0, 0,                      // reserved
        7, 0, 0, 0, 0, 0, 0, 0,       // queue (the stream)
        0x02, 0x01, 0, 0, 0, 0, 0, 0, // offset
        b'h', b'i',                   // payload
    ], 0xa6b5_b2dc);
    #[rustfmt::skip]
    golden(15, &Record::Trim { queue: QueueId(7), below: 0x0a }, &[
        0x2b, 0x71, 0x6a, 0xb1,       // crc32c
        16, 0, 0, 0,                  // body_len
        15, 0, 0, 0, 0, 0, 0, 0,      // lsn
        9,                            // kind = Trim
        0, 0, 0,                      // reserved
        7, 0, 0, 0, 0, 0, 0, 0,       // queue
        0x0a, 0, 0, 0, 0, 0, 0, 0,    // below
    ], 0xb16a_712b);
}

/// The Publish golden of FORMAT.md under record salt 0xA1B2C3D4: only
/// the checksum changes, to `crc32c_append(salt, bytes[4..])`.
#[test]
fn golden_bytes_publish_salted() {
    let r = Record::Publish {
        msg: MsgId(0x0102),
        queues: Cow::Borrowed(&[QueueId(7)]),
        payload: b"hi",
    };
    let (mut plain, mut salted) = (Vec::new(), Vec::new());
    encode(0, 5, &r, &mut plain);
    encode(0xA1B2_C3D4, 5, &r, &mut salted);
    assert_eq!(plain[4..], salted[4..]);
    assert_eq!(
        u32::from_le_bytes(salted[..4].try_into().unwrap()),
        0x9d9c_02a5
    );
}

#[test]
fn salted_checksum_refuses_records_sealed_without_the_salt() {
    let r = Record::Purge { queue: QueueId(1) };
    let mut plain = Vec::new();
    encode(0, 7, &r, &mut plain);
    let mut salted = Vec::new();
    encode(0xDEAD_BEEF, 7, &r, &mut salted);
    assert_eq!(plain[4..], salted[4..], "only the checksum differs");
    assert_eq!(
        u32::from_le_bytes(salted[..4].try_into().unwrap()),
        crc32c::crc32c_append(0xDEAD_BEEF, &salted[4..])
    );
    assert!(matches!(
        decode(0xDEAD_BEEF, &salted),
        Decoded::Record { .. }
    ));
    assert!(matches!(
        decode(0xDEAD_BEEF, &plain),
        Decoded::Corrupt(Corruption::Checksum { .. })
    ));
    assert!(matches!(
        decode(0, &salted),
        Decoded::Corrupt(Corruption::Checksum { .. })
    ));
}

#[test]
fn every_kind_roundtrips() {
    roundtrip(1, &Record::MetaDelete { key: b"x" });
    roundtrip(
        2,
        &Record::Purge {
            queue: QueueId(u64::MAX),
        },
    );
    roundtrip(0, &Record::Hole { body_len: 33 });
    roundtrip(
        3,
        &Record::Relocate {
            msg: MsgId(1),
            queues: Cow::Borrowed(&[QueueId(1), QueueId(2)]),
            payload: &[],
        },
    );
}

#[test]
fn a_publish_naming_the_reserved_queue_id_is_unparseable() {
    // A checksum-valid record naming u64::MAX (the index's "several
    // queues" marker) once reached the index and broke it at the
    // next Remove of that message.
    let mut buf = Vec::new();
    let r = Record::Publish {
        msg: MsgId(5),
        queues: Cow::Borrowed(&[QueueId(1), QueueId(u64::MAX)]),
        payload: b"x",
    };
    encode(0, 1, &r, &mut buf);
    match decode(0, &buf) {
        Decoded::Unparseable { reason, .. } => assert!(reason.contains("u64::MAX"), "{reason}"),
        other => panic!("expected Unparseable, got {other:?}"),
    }
}

#[test]
fn short_input_is_incomplete_not_an_error() {
    let mut buf = Vec::new();
    encode(0, 1, &Record::MetaDelete { key: b"abc" }, &mut buf);
    for cut in 0..buf.len() {
        assert!(
            matches!(decode(0, &buf[..cut]), Decoded::Incomplete { .. }),
            "cut {cut}"
        );
    }
}

#[test]
fn valid_checksum_with_bad_body_is_unparseable() {
    let mut buf = Vec::new();
    encode(0, 1, &Record::Purge { queue: QueueId(1) }, &mut buf);
    buf[OFF_KIND] = 99;
    let crc = crc32c::crc32c(&buf[OFF_BODY_LEN..]); // salt 0
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(decode(0, &buf), Decoded::Unparseable { .. }));
}

fn arb_record() -> impl Strategy<Value = (u64, Vec<u8>, Record<'static>)> {
    (
        1..u64::MAX,
        0u8..8,
        any::<u64>(),
        proptest::collection::vec(any::<u64>(), 1..5),
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(lsn, kind, id, ids, payload, key)| {
            let queues: Vec<QueueId> = ids.iter().copied().map(QueueId).collect();
            let msgs: Vec<MsgId> = ids.iter().copied().map(MsgId).collect();
            // Leak keeps the strategy simple; test-only and bounded.
            let payload: &'static [u8] = Box::leak(payload.into_boxed_slice());
            let key: &'static [u8] = Box::leak(key.into_boxed_slice());
            let r = match kind {
                0 => Record::Publish {
                    msg: MsgId(id),
                    queues: Cow::Owned(queues),
                    payload,
                },
                1 => Record::Relocate {
                    msg: MsgId(id),
                    queues: Cow::Owned(queues),
                    payload,
                },
                2 => Record::Remove {
                    queue: QueueId(id),
                    msgs: Cow::Owned(msgs),
                },
                3 => Record::MetaPut {
                    key,
                    value: payload,
                },
                4 => Record::MetaDelete { key },
                5 => Record::Append {
                    queue: QueueId(id.min(u64::MAX - 1)),
                    offset: ids[0],
                    payload,
                },
                6 => Record::Trim {
                    queue: QueueId(id),
                    below: ids[0],
                },
                _ => Record::Purge { queue: QueueId(id) },
            };
            (lsn, Vec::new(), r)
        })
}

proptest! {
    #[test]
    fn encode_decode_roundtrip((lsn, _, r) in arb_record()) {
        roundtrip(lsn, &r);
    }

    #[test]
    fn any_single_bit_flip_is_detected((lsn, _, r) in arb_record(), bit in any::<usize>()) {
        let mut buf = Vec::new();
        encode(0, lsn, &r, &mut buf);
        let bit = bit % (buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
        let ok = matches!(decode(0, &buf), Decoded::Record { record, .. } if record == r);
        prop_assert!(!ok, "flip of bit {} went unnoticed", bit);
    }

    /// Mutate a record and re-seal its checksum, so the body parser (not
    /// the CRC) sees garbage: whatever it accepts must re-encode to the
    /// very bytes it consumed (no two encodings of one record).
    #[test]
    fn parser_accepts_only_canonical_encodings(
        (lsn, _, r) in arb_record(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let mut buf = Vec::new();
        encode(0, lsn, &r, &mut buf);
        for (at, b) in edits {
            let at = OFF_LSN + at % (buf.len() - OFF_LSN);
            buf[at] = b;
        }
        let crc = crc32c::crc32c(&buf[OFF_BODY_LEN..]); // salt 0
        buf[..4].copy_from_slice(&crc.to_le_bytes());
        if let Decoded::Record { lsn, record, len } = decode(0, &buf) {
            let mut again = Vec::new();
            encode(0, lsn, &record, &mut again);
            prop_assert_eq!(&again[..], &buf[..len]);
        }
    }

    /// Re-sealing changes nothing but the checksums: every record reads
    /// back under the new salt exactly as it was under the old one, and a
    /// torn record after them is where it stops, untouched.
    #[test]
    fn reseal_moves_every_record_to_the_new_salt(
        records in proptest::collection::vec(arb_record(), 1..6),
        from in any::<u32>(),
        to in any::<u32>(),
    ) {
        let mut buf = Vec::new();
        for (lsn, _, r) in &records {
            encode(from, *lsn, r, &mut buf);
        }
        let whole = buf.len();
        encode(from, 1, &Record::Purge { queue: QueueId(3) }, &mut buf);
        buf.truncate(whole + RECORD_HEADER_BYTES); // torn
        let before = buf.clone();
        prop_assert_eq!(reseal(from, to, &mut buf), whole);
        prop_assert_eq!(&buf[whole..], &before[whole..]);
        let mut at = 0;
        for (lsn, _, r) in &records {
            let mut want = Vec::new();
            encode(to, *lsn, r, &mut want);
            prop_assert_eq!(&buf[at..at + want.len()], &want[..]);
            at += want.len();
        }
    }

    /// A payload handed over in pieces is written as the same bytes as
    /// the whole payload in one slice, wherever it is cut.
    #[test]
    fn a_continued_payload_encodes_as_the_whole(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in (any::<usize>(), any::<usize>()),
        salt in any::<u32>(),
    ) {
        let (a, b) = (cuts.0 % (payload.len() + 1), cuts.1 % (payload.len() + 1));
        let (a, b) = (a.min(b), a.max(b));
        let queues = [QueueId(7), QueueId(9)];
        let whole = Record::Publish {
            msg: MsgId(3),
            queues: Cow::Borrowed(&queues),
            payload: &payload,
        };
        let head = Record::Publish {
            msg: MsgId(3),
            queues: Cow::Borrowed(&queues),
            payload: &payload[..a],
        };
        let (mut want, mut got) = (Vec::new(), Vec::new());
        encode(salt, 11, &whole, &mut want);
        encode_continued(salt, 11, &head, &[&payload[a..b], &payload[b..]], &mut got);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _decoded = decode(0, &bytes);
    }
}
