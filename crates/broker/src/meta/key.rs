//! The metadata key namespace's one encoding of a key's parts (a kind
//! letter, then names) into bytes and back (docs/FORMAT.md, "Metadata
//! keys").
//!
//! Invariants:
//! - Unambiguous for any names: a key whose parts hold no zero byte is
//!   its parts joined with a zero byte (what berth has always written, so
//!   old stores read unchanged); a key with a zero byte in some part is
//!   [`LENGTH_PREFIXED`] followed by each part as a big-endian `u32`
//!   length and its bytes. The first byte tells them apart: a joined key
//!   starts with its kind letter, never with `0xFF` (no UTF-8 text does).
//! - One key per command: [`split`] refuses a length-prefixed key none of
//!   whose parts holds a zero byte, since [`join`] never writes one (a
//!   second spelling of the same key would escape "last write wins").

/// First byte of a length-prefixed key.
pub(super) const LENGTH_PREFIXED: u8 = 0xFF;

/// Bytes of a part's length in a length-prefixed key.
const PART_LEN_BYTES: usize = 4;

/// The key made of `parts`.
pub(super) fn join(parts: &[&[u8]]) -> Vec<u8> {
    if !parts.iter().any(|p| p.contains(&0)) {
        return parts.join(&0u8);
    }
    let len: usize = parts.iter().map(|p| PART_LEN_BYTES + p.len()).sum();
    let mut key = Vec::with_capacity(1 + len);
    key.push(LENGTH_PREFIXED);
    for p in parts {
        // A name longer than 4 GiB cannot reach here: every name is a
        // shortstr and a binding's arguments fit in one frame.
        let n = u32::try_from(p.len()).expect("a key part is shorter than 4 GiB");
        key.extend_from_slice(&n.to_be_bytes());
        key.extend_from_slice(p);
    }
    key
}

/// The parts of `key` (text as UTF-8, invalid bytes replaced), or why it
/// is not a key [`join`] writes.
pub(super) fn split(key: &[u8]) -> Result<Vec<String>, String> {
    let text = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let Some(mut rest) = key.strip_prefix(&[LENGTH_PREFIXED]) else {
        return Ok(key.split(|b| *b == 0).map(text).collect());
    };
    let mut parts = Vec::new();
    let mut zero_byte_seen = false;
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<PART_LEN_BYTES>() else {
            return Err(format!(
                "length-prefixed key ends inside the length of part {}",
                parts.len() + 1
            ));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len > tail.len() {
            return Err(format!(
                "length-prefixed key ends inside part {} ({len} bytes declared, {} left)",
                parts.len() + 1,
                tail.len()
            ));
        }
        let (part, tail) = tail.split_at(len);
        zero_byte_seen |= part.contains(&0);
        parts.push(text(part));
        rest = tail;
    }
    if !zero_byte_seen {
        return Err(
            "length-prefixed key without a zero byte in any part (berth writes such keys zero-joined)"
                .to_owned(),
        );
    }
    Ok(parts)
}

/// The kind letter a key starts with (its first part), in either spelling,
/// without decoding the rest.
pub(super) fn kind(key: &[u8]) -> Option<u8> {
    match key.strip_prefix(&[LENGTH_PREFIXED]) {
        None => key.first().copied(),
        Some(rest) => match rest {
            [0, 0, 0, 1, kind, ..] => Some(*kind),
            _ => None,
        },
    }
}
