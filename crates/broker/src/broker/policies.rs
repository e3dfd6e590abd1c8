//! Policies across the broker: set, delete and restore them durably, and
//! hand each vhost its new set (see `vhost/policies.rs`).
//!
//! Invariants:
//! - A change returns only once it is durable, and is put in force only
//!   after the write succeeded (what a client was told is what a restart
//!   restores).
//! - Changes are serialised with vhost additions and deletions, so a policy
//!   never outlives its vhost in the store.

use crate::access::AccessError;
use crate::meta::MetaCommand;
use crate::policy::{Policy, PolicyKind};

use super::Broker;

impl Broker {
    /// Creates or replaces a policy (validated by [`Policy::new`]) and puts
    /// it in force on the vhost's queues and exchanges.
    pub fn set_policy(&self, policy: Policy) -> Result<(), AccessError> {
        let _g = self.vhost_changes.lock();
        if self.vhost(&policy.vhost).is_none() {
            return Err(AccessError::NotFound(format!(
                "no vhost '{}'",
                policy.vhost
            )));
        }
        self.commit(&MetaCommand::PutPolicy(Box::new(policy)))
    }

    /// Deletes a policy; what it set reverts to the declared arguments (or
    /// to another matching policy).
    pub fn delete_policy(
        &self,
        kind: PolicyKind,
        vhost: &str,
        name: &str,
    ) -> Result<(), AccessError> {
        let _g = self.vhost_changes.lock();
        let Some(v) = self.vhost(vhost) else {
            return Err(AccessError::NotFound(format!("no vhost '{vhost}'")));
        };
        if !v.policies().map(kind).contains_key(name) {
            return Err(AccessError::NotFound(format!(
                "no policy '{name}' in vhost '{vhost}'"
            )));
        }
        self.commit(&MetaCommand::DeletePolicy {
            kind,
            vhost: vhost.to_owned(),
            name: name.to_owned(),
        })
    }

    /// A vhost is being deleted (it already left the map): its policies
    /// go with it (durably).
    pub(super) fn delete_vhost_policies(&self, v: &crate::vhost::VHost) -> Result<(), AccessError> {
        let set = v.policies();
        for kind in [PolicyKind::Policy, PolicyKind::Operator] {
            for name in set.map(kind).keys() {
                self.dur.journal.record(&MetaCommand::DeletePolicy {
                    kind,
                    vhost: v.name.clone(),
                    name: name.clone(),
                })?;
            }
        }
        Ok(())
    }
}
