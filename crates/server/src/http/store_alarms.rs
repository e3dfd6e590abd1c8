//! The store's own alarms, for `/api/health/checks/alarms` (and so for
//! `berth status`): a log group that refuses writes, why, and what clears
//! it. Pure: store statistics in, the operator's sentence out.
//!
//! Invariants:
//! - Every group that refuses writes is named: a poisoned one (a failed
//!   fdatasync or write; only a restart clears it) and one waiting for disk
//!   space (clears by itself once space is freed).

use berth_store::GroupStats;

/// One sentence per group that refuses writes, each with its remedy.
pub(super) fn store_alarms(groups: &[GroupStats]) -> Vec<String> {
    let mut out = Vec::new();
    for g in groups {
        if let Some(cause) = &g.poisoned_by {
            out.push(format!(
                "log group {} is poisoned and refuses writes (nacks every publish to its queues) \
                 after: {cause}; check the disk (dmesg, SMART), then restart the broker \
                 (stop and start `berth serve`): recovery re-reads the group's files, keeps every \
                 confirmed message and takes writes again",
                g.group
            ));
        } else if let Some(why) = &g.no_space {
            out.push(format!(
                "disk full: {why} (until then every publish to its queues is nacked)"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisoned_and_full_groups_are_named_with_their_remedy() {
        let healthy = GroupStats::default();
        let poisoned = GroupStats {
            group: 3,
            poisoned: true,
            poisoned_by: Some("fdatasync /d/g/1.seg: EIO".into()),
            ..GroupStats::default()
        };
        let full = GroupStats {
            group: 5,
            no_space: Some("log group 5 has no space left".into()),
            ..GroupStats::default()
        };
        assert!(store_alarms(std::slice::from_ref(&healthy)).is_empty());
        let got = store_alarms(&[healthy, poisoned, full]);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].contains("log group 3 is poisoned")
                && got[0].contains("EIO")
                && got[0].contains("restart the broker"),
            "{}",
            got[0]
        );
        assert!(
            got[1].contains("disk full") && got[1].contains("log group 5"),
            "{}",
            got[1]
        );
    }

    /// The same from a store whose fdatasync really failed: the alarm
    /// names the group, the failed call and the restart that clears it.
    #[test]
    fn a_store_poisoned_by_a_failed_fsync_raises_the_alarm() {
        use berth_store::fault::FaultStorage;
        use berth_store::{MsgId, QueueId, Store, StoreConfig, Ticket};
        let fs = FaultStorage::new(7);
        let mut cfg = StoreConfig::new("/data");
        cfg.log_groups = 1;
        let (store, _) = Store::open_with(cfg, std::sync::Arc::new(fs.clone())).expect("open");
        assert!(store_alarms(&store.stats()).is_empty());
        fs.fail_syncs_after(Some(0));
        let (done, ticket) = Ticket::new();
        store.publish(
            MsgId(1),
            &[QueueId(1)],
            bytes::Bytes::from_static(b"x"),
            Some(done),
        );
        assert!(ticket.wait().is_err());
        let got = store_alarms(&store.stats());
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("log group 0 is poisoned")
                && got[0].contains("fdatasync")
                && got[0].contains("restart the broker"),
            "{}",
            got[0]
        );
    }
}
