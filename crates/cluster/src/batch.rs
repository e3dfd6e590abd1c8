//! The bytes of one Raft entry: the commands gathered into it.
//!
//! `u32 LE count`, then per command `u32 LE length | bytes`. Decoding
//! checks every length against what remains, so a damaged entry is an
//! error, never a panic or a read past the end.

const COUNT_BYTES: usize = 4;
const LEN_BYTES: usize = 4;

pub(crate) fn encode<'a>(commands: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let count = commands.clone().count();
    let total: usize = commands.clone().map(|c| LEN_BYTES + c.len()).sum();
    let mut out = Vec::with_capacity(COUNT_BYTES + total);
    out.extend_from_slice(
        &u32::try_from(count)
            .expect("gathering is bounded far below 4G commands")
            .to_le_bytes(),
    );
    for c in commands {
        out.extend_from_slice(
            &u32::try_from(c.len())
                .expect("commands are bounded below 4 GiB")
                .to_le_bytes(),
        );
        out.extend_from_slice(c);
    }
    out
}

pub(crate) fn decode(entry: &[u8]) -> Result<Vec<&[u8]>, String> {
    let take = |rest: &mut &[u8]| -> Result<usize, String> {
        if rest.len() < 4 {
            return Err(format!(
                "{} bytes where a 4-byte length belongs",
                rest.len()
            ));
        }
        let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        *rest = &rest[4..];
        Ok(n)
    };
    let mut rest = entry;
    let count = take(&mut rest)?;
    let mut out = Vec::with_capacity(count.min(rest.len() / LEN_BYTES));
    for i in 0..count {
        let len = take(&mut rest)?;
        if rest.len() < len {
            return Err(format!(
                "command {i} of {count} claims {len} bytes, {} remain",
                rest.len()
            ));
        }
        out.push(&rest[..len]);
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes after the last of {count} commands",
            rest.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_come_back_in_order() {
        let cmds: Vec<&[u8]> = vec![b"a", b"", b"ccc"];
        let e = encode(cmds.iter().copied());
        assert_eq!(decode(&e).unwrap(), cmds);
    }

    #[test]
    fn every_cut_or_overlong_entry_is_an_error() {
        let e = encode([b"hello".as_slice(), b"world".as_slice()].into_iter());
        for cut in 0..e.len() {
            assert!(decode(&e[..cut]).is_err(), "cut at {cut} decoded");
        }
        let mut long = e.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        let mut huge = e;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }
}
