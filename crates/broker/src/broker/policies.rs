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
use crate::durable::split_key;
use crate::policy::{policy_from_meta, policy_key, policy_value, Policy, PolicyKind};

use super::Broker;

impl Broker {
    /// Creates or replaces a policy (validated by [`Policy::new`]) and puts
    /// it in force on the vhost's queues and exchanges.
    pub fn set_policy(&self, policy: Policy) -> Result<(), AccessError> {
        let _g = self.vhost_changes.lock();
        let Some(v) = self.vhost(&policy.vhost) else {
            return Err(AccessError::NotFound(format!(
                "no vhost '{}'",
                policy.vhost
            )));
        };
        self.dur.journal.put_meta(
            &policy_key(policy.kind, &policy.vhost, &policy.name),
            &policy_value(&policy),
        )?;
        let mut set = (*v.policies()).clone();
        set.map_mut(policy.kind)
            .insert(policy.name.clone(), std::sync::Arc::new(policy));
        v.set_policies(set, self.now());
        Ok(())
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
        let mut set = (*v.policies()).clone();
        if !set.map(kind).contains_key(name) {
            return Err(AccessError::NotFound(format!(
                "no policy '{name}' in vhost '{vhost}'"
            )));
        }
        self.dur
            .journal
            .delete_meta(&policy_key(kind, vhost, name))?;
        set.map_mut(kind).remove(name);
        v.set_policies(set, self.now());
        Ok(())
    }

    /// Restores stored policies (after the vhosts, before their queues);
    /// returns what could not be used, with why.
    pub(super) fn restore_policies(&self, meta: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
        let mut skipped = Vec::new();
        for (key, value) in meta {
            if !matches!(key.first(), Some(b'y' | b'o')) || key.get(1) != Some(&0) {
                continue;
            }
            let parts = split_key(key);
            let p = match policy_from_meta(&parts, value) {
                Ok(p) => p,
                Err(e) => {
                    skipped.push(format!("{parts:?}: {e}"));
                    continue;
                }
            };
            let Some(v) = self.vhost(&p.vhost) else {
                skipped.push(format!("{parts:?}: no vhost '{}'", p.vhost));
                continue;
            };
            let mut set = (*v.policies()).clone();
            set.map_mut(p.kind)
                .insert(p.name.clone(), std::sync::Arc::new(p));
            v.set_policies(set, self.now());
        }
        skipped
    }

    /// A vhost is being deleted: its policies go with it (durably).
    pub(super) fn delete_vhost_policies(&self, v: &crate::vhost::VHost) -> Result<(), AccessError> {
        let set = v.policies();
        for kind in [PolicyKind::Policy, PolicyKind::Operator] {
            for name in set.map(kind).keys() {
                self.dur
                    .journal
                    .delete_meta(&policy_key(kind, &v.name, name))?;
            }
        }
        Ok(())
    }
}
