//! The static peer list (`cluster.peers`, `NAME@HOST:PORT` each) and the
//! numbers Raft knows members by.
//!
//! Invariants:
//! - A member's Raft id is a function of its name alone (FNV-1a, 64 bits),
//!   so every member computes the same ids from the same list, and a list
//!   whose names collide is refused rather than merged.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One member as the operator listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    /// Its cluster listener.
    pub addr: String,
}

/// A member's Raft id: FNV-1a of its name.
#[must_use]
pub fn raft_id(name: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name.bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Reads one `NAME@HOST:PORT`, saying what is wrong with a bad one.
pub fn parse(entry: &str) -> Result<Peer, String> {
    let Some((name, addr)) = entry.split_once('@') else {
        return Err("expected NAME@HOST:PORT, e.g. berth1@10.0.0.1:25672".into());
    };
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "the name {name:?} must be non-empty letters, digits, '-', '_' or '.'"
        ));
    }
    if addr.parse::<SocketAddr>().is_err() && !has_host_and_port(addr) {
        return Err(format!("{addr:?} is not HOST:PORT"));
    }
    Ok(Peer {
        name: name.to_owned(),
        addr: addr.to_owned(),
    })
}

fn has_host_and_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

/// The whole list: every entry valid, names and ids distinct.
pub fn parse_all(entries: &[String]) -> Result<Vec<Peer>, (String, String)> {
    let mut peers = Vec::new();
    let mut ids: BTreeMap<u64, String> = BTreeMap::new();
    // `a@h:1,b@h:2` in one value, as RabbitMQ's node lists are written,
    // is the same list as one member per value.
    for e in entries.iter().flat_map(|v| v.split(',')).map(str::trim) {
        if e.is_empty() {
            continue;
        }
        let e = &e.to_owned();
        let p = parse(e).map_err(|why| (e.clone(), why))?;
        if let Some(other) = ids.insert(raft_id(&p.name), p.name.clone()) {
            return Err((
                e.clone(),
                format!("the name {:?} is listed twice (or collides with {other:?}); give every member its own name", p.name),
            ));
        }
        peers.push(p);
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_list_is_read_and_bad_entries_say_why() {
        let ok = parse_all(&["a@127.0.0.1:1".into(), "b@host.example:2".into()]).unwrap();
        assert_eq!(ok[1].name, "b");
        assert_eq!(ok[1].addr, "host.example:2");
        assert!(parse("127.0.0.1:1").unwrap_err().contains("NAME@HOST:PORT"));
        assert!(parse("a@nohost").unwrap_err().contains("HOST:PORT"));
        assert!(parse("a b@h:1").unwrap_err().contains("name"));
        let twice = parse_all(&["a@h:1".into(), "a@h:2".into()]).unwrap_err();
        assert!(twice.1.contains("listed twice"), "{twice:?}");
        // One comma-separated value is the same list (it read as one peer
        // whose address was `h:1,b@h:2`, and the node was "not listed").
        let one = parse_all(&["a@127.0.0.1:1, b@host.example:2,c@h:3".into()]).unwrap();
        let names: Vec<&str> = one.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(one[0].addr, "127.0.0.1:1");
        let twice = parse_all(&["a@h:1,a@h:2".into()]).unwrap_err();
        assert!(twice.1.contains("listed twice"), "{twice:?}");
    }

    #[test]
    fn ids_depend_on_the_name_only() {
        assert_eq!(raft_id("berth1"), raft_id("berth1"));
        assert_ne!(raft_id("berth1"), raft_id("berth2"));
    }
}
