//! The one function that applies a metadata command to the broker's state
//! ([`Broker::apply`]), and the replay of stored commands at startup.
//!
//! Invariants:
//! - `apply` changes memory only: the caller has made the command durable
//!   (runtime), or the journal gives it back (restore) — so the same
//!   command stream, replayed into a fresh broker, rebuilds the same
//!   definitions.
//! - `apply` is deterministic: its only inputs are the command, the
//!   broker's current definitions and `now` (the clock queues start
//!   their `x-expires` timer from).
//! - A command that cannot be applied changes nothing and says why; on
//!   replay it is reported and stays in the journal.

use std::sync::Arc;
use std::time::Instant;

use crate::access::AccessError;
use crate::meta::{key_kind, split_key, MetaCommand};
use crate::vhost::VHost;

use super::Broker;

/// A stored command with its key's parts (what a report names).
pub(crate) type Stored = (Vec<String>, MetaCommand);

impl Broker {
    /// Applies one metadata command to the broker's state (memory only;
    /// see the module doc).
    pub fn apply(&self, cmd: &MetaCommand, now: Instant) -> Result<(), String> {
        use MetaCommand as C;
        match cmd {
            C::PutVhost { name } => {
                let mut map = self.vhosts.write();
                map.entry(name.clone())
                    .or_insert_with(|| self.new_vhost(name));
            }
            C::DeleteVhost { name } => {
                self.vhosts.write().remove(name);
            }
            C::DefaultsCreated => {}
            C::PutUser(_)
            | C::DeleteUser { .. }
            | C::PutPermission(_)
            | C::DeletePermission { .. }
            | C::PutTopicPermission(_)
            | C::DeleteTopicPermission { .. } => self.access.apply(cmd)?,
            C::PutPolicy(p) => {
                let v = self
                    .vhost(&p.vhost)
                    .ok_or_else(|| format!("no vhost '{}'", p.vhost))?;
                let mut set = (*v.policies()).clone();
                set.map_mut(p.kind)
                    .insert(p.name.clone(), Arc::new((**p).clone()));
                v.set_policies(set, now);
            }
            C::DeletePolicy { kind, vhost, name } => {
                let v = self
                    .vhost(vhost)
                    .ok_or_else(|| format!("no vhost '{vhost}'"))?;
                let mut set = (*v.policies()).clone();
                set.map_mut(*kind).remove(name);
                v.set_policies(set, now);
            }
            C::PutExchange(x) => self.definitions_of(&x.vhost)?.apply_exchange(x)?,
            C::DeleteExchange { vhost, name } => self.definitions_of(vhost)?.forget_exchange(name),
            C::PutQueue(q) => {
                self.definitions_of(&q.vhost)?.apply_queue(q, now)?;
            }
            C::DeleteQueue { vhost, name } => self.definitions_of(vhost)?.forget_queue(name),
            C::PutBinding(b) => self.definitions_of(&b.vhost)?.apply_binding(b)?,
            C::DeleteBinding(b) => self.definitions_of(&b.vhost)?.forget_binding(b),
        }
        Ok(())
    }

    /// Makes a command durable, then applies it: how every runtime change
    /// of vhosts, users, permissions and policies is made. If the write
    /// fails nothing changes and the error says why.
    pub(crate) fn commit(&self, cmd: &MetaCommand) -> Result<(), AccessError> {
        self.dur.journal.record(cmd)?;
        self.apply(cmd, self.now()).map_err(AccessError::Invalid)
    }

    /// The vhost a stored exchange, queue or binding belongs to.
    fn definitions_of(&self, vhost: &str) -> Result<Arc<VHost>, String> {
        self.vhost(vhost)
            .ok_or_else(|| "vhost is not configured (add it to auth.vhosts)".to_owned())
    }
}

/// Decodes the stored entries whose key kind (first byte) is one of
/// `kinds`, in replay order (what a command needs comes first; see
/// [`MetaCommand::replay_rank`]). Entries that do not decode are
/// returned as reasons.
pub(crate) fn decode_stored(
    meta: &[(Vec<u8>, Vec<u8>)],
    kinds: &[u8],
) -> (Vec<Stored>, Vec<String>) {
    let mut skipped = Vec::new();
    let mut cmds: Vec<Stored> = meta
        .iter()
        .filter(|(k, _)| key_kind(k).is_some_and(|b| kinds.contains(&b)))
        .filter_map(|(k, v)| match MetaCommand::decode(k, Some(v)) {
            Ok(c) => Some((split_key(k), c)),
            Err(why) => {
                skipped.push(why);
                None
            }
        })
        .collect();
    cmds.sort_by_key(|(_, c)| c.replay_rank());
    (cmds, skipped)
}
