//! The seam between definitions and access control: users, vhosts,
//! permissions and topic permissions in a definitions file. Issue 8 (users,
//! runtime vhosts, permissions) replaces these two functions; until then
//! vhosts come from the configuration and the other sections are reported
//! as not imported.

use berth_broker::Broker;
use serde_json::{json, Map, Value};

/// The access sections of an export: `vhosts` (the configured ones);
/// `users`, `permissions` and `topic_permissions` empty, since berth's
/// configured users have no RabbitMQ password hash to export yet.
pub(crate) fn export_access(broker: &Broker, out: &mut Map<String, Value>) {
    let mut names: Vec<&str> = broker.vhosts().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    out.insert(
        "vhosts".into(),
        Value::Array(names.iter().map(|n| json!({"name": n})).collect()),
    );
    for k in ["users", "permissions", "topic_permissions"] {
        out.insert(k.into(), json!([]));
    }
}

/// Imports the access sections of `defs`; returns what was not imported,
/// one line per object, saying why.
pub(crate) fn import_access(broker: &Broker, defs: &Value) -> Vec<String> {
    let mut skipped = Vec::new();
    for v in defs["vhosts"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("");
        if broker.vhost(name).is_none() {
            skipped.push(format!(
                "vhost '{name}': creating vhosts at runtime is not supported yet; add it to auth.vhosts in berth.toml"
            ));
        }
    }
    for (section, what) in [
        ("users", "user"),
        ("permissions", "permission"),
        ("topic_permissions", "topic permission"),
    ] {
        for item in defs[section].as_array().into_iter().flatten() {
            let name = item["user"]
                .as_str()
                .or(item["name"].as_str())
                .unwrap_or("?");
            skipped.push(format!(
                "{what} for '{name}': importing {section} is not supported yet; configure users in auth.users in berth.toml"
            ));
        }
    }
    skipped
}
