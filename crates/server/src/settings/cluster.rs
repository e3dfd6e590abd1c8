//! The settings of `[cluster]`: membership of a replicated cluster
//! (docs/CLUSTERING.md). Without `cluster.node_id` berth is one node.

use super::slot::{field, list, maybe, one, switch, Refusal};
use super::Setting;
use crate::cluster::peers;
use crate::config::Cluster;

pub(super) static CLUSTER: &[Setting] = &[
    Setting {
        key: "cluster.node_id",
        flag: "cluster-node-id",
        value_name: "NAME",
        default_note: "off: one node",
        doc: "This node's name in `cluster.peers`; setting it makes berth a member of a \
              replicated cluster (see [CLUSTERING.md](CLUSTERING.md)).",
        slot: &maybe(field!(cluster.node_id)),
    },
    Setting {
        key: "cluster.listen",
        flag: "cluster-listen",
        value_name: "ADDR:PORT",
        default_note: "",
        doc: "Where this member listens for the other members (Raft traffic, \
              authenticated with the cluster secret); port 0 picks a free one.",
        slot: &maybe(field!(cluster.listen)),
    },
    Setting {
        key: "cluster.peers",
        flag: "cluster-peer",
        value_name: "NAME@HOST:PORT",
        default_note: "",
        doc: "Every member, this one included: the static list a cluster forms from at \
              its first start (the member with the smallest id initialises it). Give one \
              member per flag, or several comma-separated in one value.",
        slot: &list(field!(cluster.peers), Vec::new).check(|p| {
            peers::parse_all(p)
                .map(|_| ())
                .map_err(|(value, why)| Refusal::new(value, why))
        }),
    },
    Setting {
        key: "cluster.secret_file",
        flag: "cluster-secret-file",
        value_name: "FILE",
        default_note: "",
        doc: "A file holding the shared secret (at least 16 bytes; the same file on every \
              member); a peer that cannot prove it knows it gets nothing.",
        slot: &maybe(field!(cluster.secret_file)),
    },
    Setting {
        key: "cluster.join",
        flag: "cluster-join",
        value_name: "",
        default_note: "off",
        doc: "This member joins a running cluster (add it there with `berth cluster add-node`) \
              and never forms a cluster of its own from `cluster.peers`.",
        slot: &switch(field!(cluster.join)),
    },
    Setting {
        key: "cluster.tls",
        flag: "cluster-tls",
        value_name: "",
        default_note: "off",
        doc: "Encrypts the traffic between members with mutual TLS: this member presents \
              `tls.cert_file` (key `tls.key_file`) and accepts and reaches only peers whose \
              certificate `cluster.tls_ca_file` signed, the certificate naming the host of \
              the peer's `cluster.peers` address. The secret is still proven inside TLS. \
              Every member must have it on or off alike. Without it, every frame between \
              members carries a MAC keyed from the secret (not encrypted).",
        slot: &switch(field!(cluster.tls)),
    },
    Setting {
        key: "cluster.tls_ca_file",
        flag: "cluster-tls-ca-file",
        value_name: "FILE",
        default_note: "`tls.ca_file`",
        doc: "The CA that signs members' certificates: with `cluster.tls` a peer is \
              accepted only with a certificate it signed. Give the cluster a CA of its own: \
              left unset, `tls.ca_file` is used, and any client certificate that CA signed \
              for a member's host name would pass the TLS step (the secret is still needed).",
        slot: &maybe(field!(cluster.tls_ca_file)),
    },
    Setting {
        key: "cluster.election_timeout_ms",
        flag: "cluster-election-timeout-ms",
        value_name: "MS",
        default_note: "",
        doc: "A follower that hears no leader for a random time between this and twice it \
              starts an election; a leader that no majority answered for this long stops \
              serving. A member whose process died is noticed at once, not after this.",
        slot: &one(field!(cluster.election_timeout_ms), || 1_000).check(|ms| {
            if *ms < 200 {
                return Err(Refusal::new(ms.to_string(), "must be at least 200"));
            }
            Ok(())
        }),
    },
    Setting {
        key: "cluster.sync_stall_ms_max",
        flag: "cluster-sync-stall-ms-max",
        value_name: "MS",
        default_note: "",
        doc: "A member whose Raft log fdatasync runs longer than this stops leading, \
              heartbeating and voting until its disk answers (a wedged disk must not keep \
              the leadership).",
        slot: &one(field!(cluster.sync_stall_ms_max), || 5_000).check(|ms| {
            if *ms == 0 {
                return Err(Refusal::new("0", "must be at least 1"));
            }
            Ok(())
        }),
    },
];

/// What only makes sense together: a member needs its listener, a
/// secret, and a peer list that names it.
pub(super) fn check_together(
    c: &Cluster,
    tls: &crate::config::Tls,
) -> Result<(), (&'static str, String, String)> {
    let Some(me) = &c.node_id else {
        if !c.peers.is_empty() || c.listen.is_some() {
            return Err((
                "cluster.node_id",
                String::new(),
                "cluster.peers or cluster.listen is set but not this node's name: set \
                 cluster.node_id (--cluster-node-id NAME) too"
                    .into(),
            ));
        }
        return Ok(());
    };
    let listed = peers::parse_all(&c.peers).unwrap_or_default();
    if !listed.iter().any(|p| &p.name == me) {
        return Err((
            "cluster.peers",
            c.peers.join(","),
            format!("must list this node ({me}) as {me}@HOST:PORT among every member"),
        ));
    }
    if c.listen.is_none() {
        return Err((
            "cluster.listen",
            String::new(),
            "a cluster member needs an address to listen on for its peers".into(),
        ));
    }
    let no_ca = c.tls_ca_file.is_none() && tls.ca_file.is_none();
    if c.tls && (tls.cert_file.is_none() || tls.key_file.is_none() || no_ca) {
        return Err((
            "cluster.tls",
            "true".into(),
            "needs tls.cert_file, tls.key_file and cluster.tls_ca_file (--tls-cert-file, \
             --tls-key-file, --cluster-tls-ca-file): the member's certificate and the CA that \
             signed every member's"
                .into(),
        ));
    }
    if c.secret_file.is_none() {
        return Err((
            "cluster.secret_file",
            String::new(),
            "a cluster member needs the shared secret (e.g. `head -c 32 /dev/urandom | base64 > \
             secret`, the same file on every member)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tls;

    fn member() -> Cluster {
        Cluster {
            node_id: Some("n1".into()),
            listen: Some("127.0.0.1:0".into()),
            peers: vec!["n1@127.0.0.1:1".into(), "n2@127.0.0.1:2".into()],
            secret_file: Some("secret".into()),
            ..Cluster::default()
        }
    }

    #[test]
    fn a_member_missing_a_companion_setting_is_told_which() {
        assert_eq!(check_together(&member(), &Tls::default()), Ok(()));
        let no_secret = Cluster {
            secret_file: None,
            ..member()
        };
        let e = check_together(&no_secret, &Tls::default()).unwrap_err();
        assert_eq!(e.0, "cluster.secret_file");
        let not_listed = Cluster {
            peers: vec!["n2@127.0.0.1:2".into()],
            ..member()
        };
        assert!(check_together(&not_listed, &Tls::default())
            .unwrap_err()
            .2
            .contains("n1@HOST:PORT"));
    }

    #[test]
    fn cluster_tls_needs_a_certificate_a_key_and_the_ca() {
        let tls_on = Cluster {
            tls: true,
            ..member()
        };
        let no_ca = Tls {
            cert_file: Some("c.pem".into()),
            key_file: Some("k.pem".into()),
            ..Tls::default()
        };
        let e = check_together(&tls_on, &no_ca).unwrap_err();
        assert_eq!(e.0, "cluster.tls");
        assert!(e.2.contains("cluster.tls_ca_file"), "{}", e.2);
        let own_ca = Cluster {
            tls_ca_file: Some("members-ca.pem".into()),
            ..tls_on.clone()
        };
        assert_eq!(check_together(&own_ca, &no_ca), Ok(()));
        let all = Tls {
            ca_file: Some("ca.pem".into()),
            ..no_ca
        };
        assert_eq!(check_together(&tls_on, &all), Ok(()));
    }
}
