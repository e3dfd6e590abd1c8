//! What each member tells the leader about itself: its alarms (a disk
//! below the free space it must keep, its log's disk stalled, its Raft
//! stopped), so that the leader's management API, health checks and
//! metrics show a follower's trouble, as RabbitMQ's `/api/nodes` and
//! alarms check show every node's.
//!
//! The application says what its alarms are ([`LocalAlarms`]); the leader
//! asks every other member once a second over the peer transport and
//! keeps the last answer.
//!
//! Invariants:
//! - A report older than [`REPORT_FRESH_MS`] is never shown: a member that
//!   stops answering is shown without a report (unknown), not as
//!   alarm-free.
//! - Answering costs a member no Raft work, and it answers while its Raft
//!   is stopped (that is when its report matters most).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::limits::REPORT_FRESH_MS;
use crate::types::NodeId;

/// A member's own alarms, each one sentence; empty when all is well.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberReport {
    pub alarms: Vec<String>,
}

/// How the application tells its alarms.
pub type LocalAlarms = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// This member's alarm source, and the reports the leader heard.
#[derive(Default)]
pub(crate) struct Reports {
    local: RwLock<Option<LocalAlarms>>,
    heard: Mutex<BTreeMap<NodeId, (MemberReport, Instant)>>,
}

impl Reports {
    pub(crate) fn set_local(&self, alarms: LocalAlarms) {
        *self.local.write() = Some(alarms);
    }

    /// This member's report, now.
    pub(crate) fn local(&self) -> MemberReport {
        let alarms = self.local.read().as_ref().map(|f| f()).unwrap_or_default();
        MemberReport { alarms }
    }

    /// Member `id`'s last report, if fresh.
    pub(crate) fn of(&self, id: NodeId) -> Option<MemberReport> {
        let heard = self.heard.lock();
        let (report, at) = heard.get(&id)?;
        (at.elapsed() < Duration::from_millis(REPORT_FRESH_MS)).then(|| report.clone())
    }

    pub(crate) fn heard(&self, id: NodeId, report: MemberReport) {
        let mut heard = self.heard.lock();
        let changed = heard.get(&id).is_none_or(|(r, _)| *r != report);
        if changed && !report.alarms.is_empty() {
            tracing::warn!(member = id, alarms = %report.alarms.join("; "), "a cluster member reports alarms");
        }
        heard.insert(id, (report, Instant::now()));
    }
}
