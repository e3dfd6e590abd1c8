//! The seam between definitions and access control: users, vhosts,
//! permissions and topic permissions in a definitions file.

use berth_broker::Broker;

use crate::auth::definitions::{AccessDefinitions, Imported};
use serde_json::{Map, Value};

/// The access sections of an export: `users` (with their RabbitMQ password
/// hashes, so an import elsewhere keeps their passwords), `vhosts`,
/// `permissions` and `topic_permissions`.
pub(crate) fn export_access(broker: &Broker, out: &mut Map<String, Value>) {
    out.extend(crate::auth::definitions::export_access(broker));
}

/// Imports the access sections of `defs` (users with their RabbitMQ
/// password hashes, vhosts, permissions, topic permissions) through
/// [`crate::auth::definitions::import_access`], which checks everything
/// before it stores anything. Returns how many of each it stored, or why
/// the whole import is refused.
pub(crate) fn import_access(broker: &Broker, defs: &Value) -> Result<Imported, String> {
    let access: AccessDefinitions = serde_json::from_value(defs.clone())
        .map_err(|e| format!("definitions are not valid JSON for users/vhosts/permissions: {e}"))?;
    crate::auth::definitions::import_access(broker, &access).map_err(|e| e.to_string())
}
