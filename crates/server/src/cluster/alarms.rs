//! A member's own alarms, as it reports them to the leader and shows them
//! on its follower HTTP side: its disk below the free space it must keep,
//! its Raft log's disk stalled, its Raft stopped (a log write failed).

use std::path::PathBuf;

use berth_cluster::{ClusterNode, Role};

/// What a member's alarms are measured against.
#[derive(Clone)]
pub struct Watched {
    /// The data directories and the free space each must keep
    /// (`limits.disk_free_bytes_min`; 0: no disk alarm).
    pub data_dirs: Vec<PathBuf>,
    pub disk_free_bytes_min: u64,
}

/// This member's alarms now, each one sentence; empty when all is well.
/// Reads the node's role and standing, never its whole status (which
/// lists these alarms).
#[must_use]
pub fn of(node: &ClusterNode, watched: &Watched) -> Vec<String> {
    let mut alarms = Vec::new();
    if watched.disk_free_bytes_min > 0 {
        match crate::disk::lowest_free_bytes(&watched.data_dirs) {
            Ok(free) if free < watched.disk_free_bytes_min => alarms.push(format!(
                "disk ({free} bytes free, limits.disk_free_bytes_min is {})",
                watched.disk_free_bytes_min
            )),
            Ok(_) => {}
            Err((dir, e)) => alarms.push(format!(
                "disk (cannot measure the free space of {}: {e})",
                dir.display()
            )),
        }
    }
    if node.fenced() {
        alarms.push("raft log disk stalled (an fdatasync ran past cluster.sync_stall_ms_max): this member neither votes nor leads until it answers".into());
    }
    if node.role() == Role::Stopped {
        alarms.push("raft stopped (a write to its log failed; see this member's log)".into());
    }
    alarms
}

/// Tells `node` how to list its alarms (for the leader's reports).
pub fn install(node: &std::sync::Arc<ClusterNode>, watched: Watched) {
    let weak = std::sync::Arc::downgrade(node);
    node.set_local_alarms(std::sync::Arc::new(move || {
        weak.upgrade()
            .map(|node| of(&node, &watched))
            .unwrap_or_default()
    }));
}
