//! Who a member is, beyond its name: a random member id created with its
//! cluster directory (`member.id`), the ids of the peers it has met
//! (`peers.known`), and the id of the cluster it belongs to
//! (`cluster.id`), all checked in every peer handshake.
//!
//! The cluster id is made once, by the member that forms the cluster (or,
//! in a cluster formed before ids existed, by its member with the smallest
//! node id), and learned by every other member at its first proven
//! handshake with one that has it. Members of two clusters that share a
//! secret (a copied configuration, a reused address) then refuse each
//! other, naming both ids, instead of mixing their logs.
//!
//! A member whose data directory was wiped (or replaced by an empty one)
//! comes back under its old name with an empty log and no vote: were it
//! let in, it would vote for any candidate, and a lagging one could win
//! without the entries the old member had acknowledged (confirmed
//! messages lost). Its new id gives it away: the others refuse it until
//! the operator removes it and adds it again as a fresh member
//! (docs/CLUSTERING.md, "Replacing a member's disk").
//!
//! Invariants:
//! - A peer's id is learned at its first proven handshake and written
//!   durably (temp file, fdatasync, rename, directory fsync) before the
//!   connection is used: a restart never forgets whom it met.
//! - A peer presenting another id than the one learned is refused, every
//!   time, until it leaves the membership (`forget_all_but`).
//! - A member's cluster id, once made or learned, is durable and never
//!   changes; a peer presenting another cluster id is refused, every time.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use rand::RngCore;

use crate::error::ClusterError;
use crate::types::NodeId;

pub const MEMBER_ID_FILE: &str = "member.id";
pub const KNOWN_FILE: &str = "peers.known";
pub const CLUSTER_ID_FILE: &str = "cluster.id";

/// A member's id: random, 128 bits, never reused.
pub type MemberId = u128;

/// A cluster's id: random, 128 bits, never 0 (0 stands for "not yet
/// known" in a handshake's proof).
pub type ClusterId = u128;

pub struct Identity {
    own: MemberId,
    dir: PathBuf,
    known: Mutex<BTreeMap<NodeId, MemberId>>,
    cluster: Mutex<Option<ClusterId>>,
}

fn random_id() -> u128 {
    loop {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        let id = u128::from_le_bytes(bytes);
        if id != 0 {
            return id;
        }
    }
}

/// The id in `dir/name` (32 hex digits), `None` if the file is absent.
fn read_id(dir: &Path, name: &str, what: &str) -> Result<Option<u128>, ClusterError> {
    let path = dir.join(name);
    match fs::read_to_string(&path) {
        Ok(text) => parse_id(&text)
            .map(Some)
            .ok_or_else(|| ClusterError::Undecodable {
                path,
                detail: format!("expected 32 hex digits ({what})"),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ClusterError::Io { path, source }),
    }
}

fn write_durably(dir: &Path, name: &str, contents: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_data()?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

fn parse_id(text: &str) -> Option<MemberId> {
    let t = text.trim();
    (t.len() == 32)
        .then(|| MemberId::from_str_radix(t, 16).ok())
        .flatten()
}

impl Identity {
    /// Reads this member's id (creating it if the directory has none) and
    /// the peers it has met.
    pub fn open(dir: &Path) -> Result<Self, ClusterError> {
        let own = match read_id(dir, MEMBER_ID_FILE, "this member's id")? {
            Some(id) => id,
            None => {
                let id = random_id();
                write_durably(dir, MEMBER_ID_FILE, &format!("{id:032x}\n")).map_err(|source| {
                    ClusterError::Io {
                        path: dir.join(MEMBER_ID_FILE),
                        source,
                    }
                })?;
                tracing::info!(member_id = %format!("{id:032x}"), "this member's id is new (a new data directory)");
                id
            }
        };
        let cluster = read_id(dir, CLUSTER_ID_FILE, "the id of this member's cluster")?;
        let known_path = dir.join(KNOWN_FILE);
        let mut known = BTreeMap::new();
        match fs::read_to_string(&known_path) {
            Ok(text) => {
                for (n, line) in text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                {
                    let parsed = line.split_once(' ').and_then(|(node, member)| {
                        Some((node.parse::<NodeId>().ok()?, parse_id(member)?))
                    });
                    let Some((node, member)) = parsed else {
                        return Err(ClusterError::Undecodable {
                            path: known_path,
                            detail: format!(
                                "line {}: expected `NODE_ID MEMBER_ID` (decimal, 32 hex digits)",
                                n + 1
                            ),
                        });
                    };
                    known.insert(node, member);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ClusterError::Io {
                    path: known_path,
                    source: e,
                })
            }
        }
        Ok(Self {
            own,
            dir: dir.to_path_buf(),
            known: Mutex::new(known),
            cluster: Mutex::new(cluster),
        })
    }

    /// The id of this member's cluster, once made or learned.
    #[must_use]
    pub fn cluster(&self) -> Option<ClusterId> {
        *self.cluster.lock()
    }

    /// Makes this member's cluster id, durably, unless it has one: by the
    /// member that forms the cluster, before it does.
    pub fn found_cluster(&self) -> io::Result<ClusterId> {
        let mut cluster = self.cluster.lock();
        if let Some(id) = *cluster {
            return Ok(id);
        }
        let id = random_id();
        write_durably(&self.dir, CLUSTER_ID_FILE, &format!("{id:032x}\n"))?;
        tracing::info!(cluster_id = %format!("{id:032x}"), "made this cluster's id");
        *cluster = Some(id);
        Ok(id)
    }

    /// Accepts a proven peer (node `node`) that belongs to cluster
    /// `theirs` if that is this member's cluster, or if either side does
    /// not know its cluster yet; learns it durably in the latter case.
    pub fn check_cluster(&self, node: NodeId, theirs: Option<ClusterId>) -> Result<(), String> {
        let mut ours = self.cluster.lock();
        match (*ours, theirs) {
            (Some(o), Some(t)) if o != t => Err(format!(
                "node {node} belongs to cluster {t:032x}, this member to cluster {o:032x}: \
                 members of two clusters share a cluster secret and met through an address \
                 one of them lists. Each member's cluster.peers must list only its own \
                 cluster's members; give each cluster its own cluster.secret_file"
            )),
            (None, Some(t)) => {
                write_durably(&self.dir, CLUSTER_ID_FILE, &format!("{t:032x}\n")).map_err(|e| {
                    format!("cannot record the cluster id in {CLUSTER_ID_FILE}: {e}")
                })?;
                tracing::info!(cluster_id = %format!("{t:032x}"), from = node, "learned this member's cluster id");
                *ours = Some(t);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    #[must_use]
    pub fn own(&self) -> MemberId {
        self.own
    }

    /// Whether node `node`'s member id has been learned.
    #[must_use]
    pub fn knows(&self, node: NodeId) -> bool {
        self.known.lock().contains_key(&node)
    }

    fn save(&self, known: &BTreeMap<NodeId, MemberId>) -> io::Result<()> {
        let text: String = known
            .iter()
            .map(|(node, member)| format!("{node} {member:032x}\n"))
            .collect();
        write_durably(&self.dir, KNOWN_FILE, &text)
    }

    /// Accepts `member` as node `node`'s id if it is the one met before
    /// (or the first), learning it durably; says why not otherwise.
    pub fn check(&self, node: NodeId, member: MemberId) -> Result<(), String> {
        let mut known = self.known.lock();
        match known.get(&node) {
            Some(m) if *m == member => Ok(()),
            Some(m) => Err(format!(
                "node {node} presents member id {member:032x}, but this cluster knows it as \
                 {m:032x}: its data directory is new or was replaced, and it is refused so \
                 that it cannot vote with an empty log. To rejoin it as a fresh member, run \
                 `berth cluster remove-node NAME` and then `berth cluster add-node \
                 NAME@HOST:PORT` against the leader (docs/CLUSTERING.md, \"Replacing a \
                 member's disk\")"
            )),
            None => {
                known.insert(node, member);
                self.save(&known).map_err(|e| {
                    known.remove(&node);
                    format!("cannot record node {node}'s member id in {KNOWN_FILE}: {e}")
                })
            }
        }
    }

    /// Forgets the ids of nodes no longer in the membership, so that a
    /// node removed and added again is met afresh.
    pub fn forget_all_but(&self, members: &BTreeSet<NodeId>) {
        let mut known = self.known.lock();
        let before = known.len();
        known.retain(|node, _| members.contains(node));
        if known.len() != before {
            if let Err(e) = self.save(&known) {
                tracing::warn!(error = %e, "cannot rewrite {KNOWN_FILE}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_gets_an_id_that_a_restart_keeps() {
        let dir = berth_testdir::TestDir::new("identity-own");
        let first = Identity::open(dir.path()).unwrap().own();
        assert_eq!(Identity::open(dir.path()).unwrap().own(), first);
        let other = berth_testdir::TestDir::new("identity-other");
        assert_ne!(Identity::open(other.path()).unwrap().own(), first);
    }

    #[test]
    fn a_peer_is_learned_once_and_another_id_under_its_node_is_refused_until_forgotten() {
        let dir = berth_testdir::TestDir::new("identity-known");
        let id = Identity::open(dir.path()).unwrap();
        id.check(7, 0xaa).unwrap();
        id.check(7, 0xaa).unwrap();
        // After a restart too.
        let id = Identity::open(dir.path()).unwrap();
        let e = id.check(7, 0xbb).unwrap_err();
        assert!(
            e.contains("remove-node") && e.contains("data directory"),
            "{e}"
        );
        id.check(8, 0xcc).unwrap();
        id.forget_all_but(&BTreeSet::from([8]));
        let id = Identity::open(dir.path()).unwrap();
        id.check(7, 0xbb).unwrap();
        assert!(id.check(8, 0xdd).is_err());
    }

    #[test]
    fn a_cluster_id_is_made_once_or_learned_once_and_another_is_refused() {
        let dir = berth_testdir::TestDir::new("identity-cluster");
        let id = Identity::open(dir.path()).unwrap();
        assert_eq!(id.cluster(), None);
        // Not knowing its cluster, a member accepts a peer that does not
        // either, and learns the first id a proven peer presents.
        id.check_cluster(2, None).unwrap();
        id.check_cluster(2, Some(0x51)).unwrap();
        assert_eq!(id.cluster(), Some(0x51));
        id.check_cluster(3, None).unwrap();
        let e = id.check_cluster(3, Some(0x52)).unwrap_err();
        assert!(e.contains("cluster.peers") && e.contains("secret"), "{e}");
        // Durably: after a restart too; and found_cluster keeps it.
        let id = Identity::open(dir.path()).unwrap();
        assert_eq!(id.cluster(), Some(0x51));
        assert_eq!(id.found_cluster().unwrap(), 0x51);
        assert!(id.check_cluster(3, Some(0x52)).is_err());

        let other = berth_testdir::TestDir::new("identity-cluster-found");
        let id = Identity::open(other.path()).unwrap();
        let made = id.found_cluster().unwrap();
        assert_ne!(made, 0);
        assert_eq!(id.found_cluster().unwrap(), made);
        assert_eq!(Identity::open(other.path()).unwrap().cluster(), Some(made));
        assert!(id.check_cluster(1, Some(made ^ 1)).is_err());
    }

    #[test]
    fn damaged_identity_files_are_refused_naming_the_file() {
        let dir = berth_testdir::TestDir::new("identity-damaged");
        fs::write(dir.path().join(MEMBER_ID_FILE), "zz").unwrap();
        let e = Identity::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains(MEMBER_ID_FILE), "{e}");
        fs::remove_file(dir.path().join(MEMBER_ID_FILE)).unwrap();
        fs::write(dir.path().join(KNOWN_FILE), "1 2 3\n").unwrap();
        let e = Identity::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains(KNOWN_FILE) && e.contains("line 1"), "{e}");
        fs::remove_file(dir.path().join(KNOWN_FILE)).unwrap();
        fs::write(dir.path().join(CLUSTER_ID_FILE), "not an id\n").unwrap();
        let e = Identity::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains(CLUSTER_ID_FILE), "{e}");
    }
}
