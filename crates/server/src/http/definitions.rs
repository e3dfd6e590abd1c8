//! Definitions in RabbitMQ's format: `GET/POST /api/definitions` and
//! `/api/definitions/{vhost}`, and the same import for
//! `berth serve --load-definitions FILE`.
//!
//! Invariants:
//! - An import never drops anything silently: every object it does not
//!   import (an unsupported section, a parameter other than a shovel, a
//!   vhost berth lacks) is
//!   listed in the answer's `not_imported` and logged.
//! - Exports leave out what an import cannot recreate: exclusive queues,
//!   the default and `amq.*` exchanges, the default exchange's implicit
//!   bindings.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_broker::policy::PolicyKind;
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare, VHost};
use berth_broker::Broker;
use serde_json::{json, Map, Value};

use crate::shovel::Shovels;

use super::access::{export_access, import_access_json};
use super::bindings::vhost_bindings;
use super::queues::{sorted_queues, API_CONNECTION_ID};
use super::{bad_request, json_table, table_json, vhost_or_404, AdminAuthed, HttpState};

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    pub queues: usize,
    pub exchanges: usize,
    pub bindings: usize,
    /// Users, vhosts, permissions and topic permissions (whole imports
    /// only).
    pub access: super::access::Imported,
    pub policies: usize,
    pub shovels: usize,
    /// One line per object not imported, saying why.
    pub not_imported: Vec<String>,
}

fn vhost_objects(v: &VHost, with_vhost: bool) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let strip = |mut x: Value| {
        if !with_vhost {
            if let Some(m) = x.as_object_mut() {
                m.remove("vhost");
            }
        }
        x
    };
    let queues = sorted_queues(v)
        .iter()
        .filter(|q| q.exclusive_owner.is_none())
        .map(|q| {
            strip(json!({
                "name": q.name, "vhost": v.name, "durable": q.durable,
                "auto_delete": q.auto_delete, "arguments": table_json(&q.arguments),
            }))
        })
        .collect();
    let mut es = v.exchanges();
    es.sort_by(|a, b| a.name.cmp(&b.name));
    let exchanges = es
        .iter()
        .filter(|e| !e.name.is_empty() && !e.name.starts_with("amq."))
        .map(|e| {
            strip(json!({
                "name": e.name, "vhost": v.name, "type": e.type_name(),
                "durable": e.durable, "auto_delete": e.auto_delete,
                "internal": e.internal, "arguments": table_json(&e.arguments),
            }))
        })
        .collect();
    let bindings = vhost_bindings(v)
        .into_iter()
        .filter(|b| b["source"] != "")
        .map(|mut b| {
            if let Some(m) = b.as_object_mut() {
                m.remove("properties_key");
            }
            strip(b)
        })
        .collect();
    (queues, exchanges, bindings)
}

fn header() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("rabbit_version".into(), json!("3.10.0"));
    m.insert("rabbitmq_version".into(), json!("3.10.0"));
    m.insert("product_name".into(), json!("berth"));
    m.insert("product_version".into(), json!(env!("CARGO_PKG_VERSION")));
    m
}

/// `GET /api/definitions` (administrator only, as in RabbitMQ: it carries
/// password hashes).
pub(super) async fn export_all(State(st): State<HttpState>, _: AdminAuthed) -> Response {
    let mut out = header();
    out.extend(export_access(&st.shared.broker));
    let (mut qs, mut es, mut bs) = (Vec::new(), Vec::new(), Vec::new());
    for v in super::sorted_vhosts(&st) {
        let (q, e, b) = vhost_objects(&v, true);
        qs.extend(q);
        es.extend(e);
        bs.extend(b);
    }
    let parameters = shovel_parameters(&st, None);
    out.insert("parameters".into(), Value::Array(parameters));
    out.insert("global_parameters".into(), json!([]));
    out.insert(
        "policies".into(),
        Value::Array(super::policies::all_json(
            &st.shared.broker,
            PolicyKind::Policy,
        )),
    );
    out.insert("queues".into(), Value::Array(qs));
    out.insert("exchanges".into(), Value::Array(es));
    out.insert("bindings".into(), Value::Array(bs));
    Json(Value::Object(out)).into_response()
}

pub(super) async fn export_vhost(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(vhost): Path<String>,
) -> Response {
    let v = match vhost_or_404(&st, &vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut out = header();
    let (q, e, b) = vhost_objects(&v, false);
    out.insert(
        "parameters".into(),
        Value::Array(shovel_parameters(&st, Some(&vhost))),
    );
    let mut policies: Vec<Value> = v
        .policies()
        .policies
        .values()
        .map(|p| super::policies::policy_json(p))
        .collect();
    for p in &mut policies {
        // A per-vhost export's objects carry no vhost.
        p.as_object_mut().map(|m| m.remove("vhost"));
    }
    out.insert("policies".into(), Value::Array(policies));
    out.insert("queues".into(), Value::Array(q));
    out.insert("exchanges".into(), Value::Array(e));
    out.insert("bindings".into(), Value::Array(b));
    Json(Value::Object(out)).into_response()
}

/// The shovels as RabbitMQ's `parameters` entries (without `vhost` in a
/// per-vhost export).
fn shovel_parameters(st: &HttpState, only_vhost: Option<&str>) -> Vec<Value> {
    let Some(shovels) = &st.shared.shovels else {
        return Vec::new();
    };
    (shovels.list(only_vhost).iter())
        // A static shovel is the config file's, not a runtime parameter.
        .filter(|l| l.def.kind == crate::shovel::definition::Kind::Dynamic)
        .map(|l| {
            let mut p = super::shovels::parameter_json(&l.def);
            if only_vhost.is_some() {
                p.as_object_mut().map(|m| m.remove("vhost"));
            }
            p
        })
        .collect()
}

fn bool_of(x: &Value, key: &str, default: bool) -> bool {
    match &x[key] {
        Value::Bool(b) => *b,
        Value::String(s) => s == "true",
        _ => default,
    }
}

fn str_of<'a>(x: &'a Value, key: &str) -> &'a str {
    x[key].as_str().unwrap_or("")
}

/// Imports `defs` (RabbitMQ's definitions format). `only_vhost` is the
/// vhost of a per-vhost import, whose objects carry no `vhost`. Stops at
/// the first object the broker refuses (as RabbitMQ does), saying which.
pub fn import(
    broker: &Broker,
    shovels: Option<&Shovels>,
    defs: &Value,
    only_vhost: Option<&str>,
) -> Result<ImportReport, String> {
    if !defs.is_object() {
        return Err("definitions must be a JSON object".into());
    }
    let mut report = ImportReport::default();
    if only_vhost.is_none() {
        report.access = import_access_json(broker, defs)?;
    }
    import_policies(broker, defs, only_vhost, &mut report)?;
    for p in defs["global_parameters"].as_array().into_iter().flatten() {
        report.not_imported.push(format!(
            "global_parameters '{}': not supported yet",
            str_of(p, "name"),
        ));
    }
    import_topology(broker, defs, only_vhost, &mut report)?;
    // After the topology: a shovel starts at once and may need its queues.
    import_parameters(broker, shovels, defs, only_vhost, &mut report)?;
    for line in &report.not_imported {
        tracing::warn!("definitions: not imported: {line}");
    }
    Ok(report)
}

/// The `policies` and `operator_policies` sections of [`import`].
fn import_policies(
    broker: &Broker,
    defs: &Value,
    only_vhost: Option<&str>,
    report: &mut ImportReport,
) -> Result<(), String> {
    for (section, kind) in [
        ("policies", PolicyKind::Policy),
        ("operator_policies", PolicyKind::Operator),
    ] {
        for p in defs[section].as_array().into_iter().flatten() {
            let (name, vhost) = (
                str_of(p, "name"),
                only_vhost.unwrap_or_else(|| str_of(p, "vhost")),
            );
            let what = || format!("{section} '{name}' in vhost '{vhost}'");
            if broker.vhost(vhost).is_none() {
                report
                    .not_imported
                    .push(format!("{}: vhost does not exist", what()));
                continue;
            }
            let policy = super::policies::from_json(kind, vhost, name, p)
                .map_err(|e| format!("{}: {}", what(), e.trim()))?;
            broker
                .set_policy(policy)
                .map_err(|e| format!("{}: {e}", what()))?;
            report.policies += 1;
        }
    }
    Ok(())
}

/// The `parameters` section of [`import`]: shovels are imported (and
/// started), every other component is listed as not imported.
fn import_parameters(
    broker: &Broker,
    shovels: Option<&Shovels>,
    defs: &Value,
    only_vhost: Option<&str>,
    report: &mut ImportReport,
) -> Result<(), String> {
    for p in defs["parameters"].as_array().into_iter().flatten() {
        let (component, name, vhost) = (
            str_of(p, "component"),
            str_of(p, "name"),
            only_vhost.unwrap_or_else(|| str_of(p, "vhost")),
        );
        let what = || format!("parameters '{name}' in vhost '{vhost}' (component '{component}')");
        if component != "shovel" {
            report
                .not_imported
                .push(format!("{}: not supported yet", what()));
            continue;
        }
        let Some(shovels) = shovels else {
            report.not_imported.push(format!(
                "{}: shovels are not supported on a cluster member yet",
                what()
            ));
            continue;
        };
        if broker.vhost(vhost).is_none() {
            report
                .not_imported
                .push(format!("{}: vhost does not exist", what()));
            continue;
        }
        let def = crate::shovel::definition::parse(vhost, name, &p["value"])
            .map_err(|e| format!("{}: {}", what(), e.trim()))?;
        crate::shovel::check_files(&def).map_err(|e| format!("{}: {e}", what()))?;
        shovels.put(def).map_err(|e| format!("{}: {e}", what()))?;
        report.shovels += 1;
    }
    Ok(())
}

/// The `exchanges`, `queues` and `bindings` sections of [`import`], in
/// that order (a binding needs both its ends).
fn import_topology(
    broker: &Broker,
    defs: &Value,
    only_vhost: Option<&str>,
    report: &mut ImportReport,
) -> Result<(), String> {
    let vhost_of = |x: &Value| -> Result<Option<Arc<VHost>>, String> {
        let name = only_vhost.unwrap_or_else(|| str_of(x, "vhost"));
        Ok(broker.vhost(name))
    };
    let now = Instant::now();
    for e in defs["exchanges"].as_array().into_iter().flatten() {
        let name = str_of(e, "name");
        let Some(v) = vhost_of(e)? else {
            report.not_imported.push(format!(
                "exchange '{name}': vhost '{}' does not exist",
                str_of(e, "vhost")
            ));
            continue;
        };
        let d = ExchangeDeclare {
            kind: str_of(e, "type").to_owned(),
            passive: false,
            durable: bool_of(e, "durable", true),
            auto_delete: bool_of(e, "auto_delete", false),
            internal: bool_of(e, "internal", false),
            arguments: json_table(&e["arguments"]).map_err(|why| {
                format!("exchange '{name}' in vhost '{}': arguments: {why}", v.name)
            })?,
        };
        v.declare_exchange(name, &d).map_err(|err| {
            format!(
                "exchange '{name}' in vhost '{}': {}",
                v.name,
                err.reply_text()
            )
        })?;
        report.exchanges += 1;
    }
    for q in defs["queues"].as_array().into_iter().flatten() {
        let name = str_of(q, "name");
        let Some(v) = vhost_of(q)? else {
            report.not_imported.push(format!(
                "queue '{name}': vhost '{}' does not exist",
                str_of(q, "vhost")
            ));
            continue;
        };
        let d = QueueDeclare {
            passive: false,
            durable: bool_of(q, "durable", true),
            exclusive: false,
            auto_delete: bool_of(q, "auto_delete", false),
            arguments: json_table(&q["arguments"])
                .map_err(|why| format!("queue '{name}' in vhost '{}': arguments: {why}", v.name))?,
        };
        v.declare_queue(API_CONNECTION_ID, name, &d, now)
            .map_err(|err| format!("queue '{name}' in vhost '{}': {}", v.name, err.reply_text()))?;
        report.queues += 1;
    }
    for b in defs["bindings"].as_array().into_iter().flatten() {
        let (source, dest, key) = (
            str_of(b, "source"),
            str_of(b, "destination"),
            str_of(b, "routing_key"),
        );
        let Some(v) = vhost_of(b)? else {
            report.not_imported.push(format!(
                "binding '{source}' -> '{dest}': vhost '{}' does not exist",
                str_of(b, "vhost")
            ));
            continue;
        };
        let args = json_table(&b["arguments"]).map_err(|why| {
            format!(
                "binding '{source}' -> '{dest}' in vhost '{}': arguments: {why}",
                v.name
            )
        })?;
        let bound = if str_of(b, "destination_type") == "exchange" {
            v.bind_exchange(dest, source, key, &args)
        } else {
            v.bind_queue(API_CONNECTION_ID, dest, source, key, &args)
        };
        bound.map_err(|err| {
            format!(
                "binding '{source}' -> '{dest}' ('{key}') in vhost '{}': {}",
                v.name,
                err.reply_text()
            )
        })?;
        report.bindings += 1;
    }
    Ok(())
}

fn answer(r: Result<ImportReport, String>) -> Response {
    match r {
        Ok(r) => Json(json!({
            "imported": {
                "queues": r.queues, "exchanges": r.exchanges, "bindings": r.bindings,
                "policies": r.policies, "shovels": r.shovels,
                "users": r.access.users, "vhosts": r.access.vhosts,
                "permissions": r.access.permissions,
                "topic_permissions": r.access.topic_permissions,
            },
            "not_imported": r.not_imported,
        }))
        .into_response(),
        Err(e) => bad_request(e),
    }
}

pub(super) async fn import_all(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Json(defs): Json<Value>,
) -> Response {
    answer(import(
        &st.shared.broker,
        st.shared.shovels.as_deref(),
        &defs,
        None,
    ))
}

pub(super) async fn import_vhost(
    State(st): State<HttpState>,
    _: AdminAuthed,
    Path(vhost): Path<String>,
    Json(defs): Json<Value>,
) -> Response {
    if let Err(r) = vhost_or_404(&st, &vhost) {
        return r;
    }
    answer(import(
        &st.shared.broker,
        st.shared.shovels.as_deref(),
        &defs,
        Some(&vhost),
    ))
}
