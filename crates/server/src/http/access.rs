//! The seam between definitions and access control: users, vhosts,
//! permissions and topic permissions in a definitions file.

use berth_broker::Broker;

use crate::auth::definitions::AccessDefinitions;
use serde_json::{json, Map, Value};

/// The access sections of an export: `vhosts` (the configured ones);
/// `users`, `permissions` and `topic_permissions` empty, since berth's
/// configured users have no RabbitMQ password hash to export yet.
pub(crate) fn export_access(broker: &Broker, out: &mut Map<String, Value>) {
    let vhosts = broker.vhosts();
    let mut names: Vec<&str> = vhosts.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    out.insert(
        "vhosts".into(),
        Value::Array(names.iter().map(|n| json!({"name": n})).collect()),
    );
    for k in ["users", "permissions", "topic_permissions"] {
        out.insert(k.into(), json!([]));
    }
}

/// Imports the access sections of `defs` (users with their RabbitMQ
/// password hashes, vhosts, permissions, topic permissions) through
/// [`crate::auth::definitions::import_access`], which checks everything
/// before it stores anything. Returns what was not imported (nothing, when
/// it succeeds), or why the whole import is refused.
pub(crate) fn import_access(broker: &Broker, defs: &Value) -> Result<Vec<String>, String> {
    let access: AccessDefinitions = serde_json::from_value(defs.clone())
        .map_err(|e| format!("definitions are not valid JSON for users/vhosts/permissions: {e}"))?;
    crate::auth::definitions::import_access(broker, &access).map_err(|e| e.to_string())?;
    Ok(Vec::new())
}
