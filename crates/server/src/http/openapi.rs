//! `GET /api/openapi.json`: an OpenAPI 3.0 description of exactly the
//! routes berth serves. [`ROUTES`] is checked against the router's paths
//! by a unit test, so the description cannot drift from the code.

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

/// Path, methods, summary.
const ROUTES: &[(&str, &[&str], &str)] = &[
    ("/api/overview", &["get"], "Totals, rates and listeners"),
    ("/api/nodes", &["get"], "The node"),
    ("/api/nodes/{name}", &["get"], "The node by name"),
    ("/api/vhosts", &["get"], "Virtual hosts"),
    (
        "/api/aliveness-test/{vhost}",
        &["get"],
        "Publish and get a test message",
    ),
    (
        "/api/health/checks/alarms",
        &["get"],
        "503 while a resource alarm is on",
    ),
    (
        "/api/health/checks/is-leader",
        &["get"],
        "200 on a cluster's leader (and a single node), 503 naming the leader elsewhere (no auth)",
    ),
    (
        "/api/health/checks/local-alarms",
        &["get"],
        "503 while a resource alarm is on",
    ),
    (
        "/api/health/checks/port-listener/{port}",
        &["get"],
        "503 if nothing listens on the port",
    ),
    (
        "/api/health/checks/virtual-hosts",
        &["get"],
        "Virtual hosts are running",
    ),
    ("/api/queues", &["get"], "Queues (list parameters)"),
    (
        "/api/queues/{vhost}",
        &["get"],
        "Queues of a vhost (list parameters)",
    ),
    (
        "/api/queues/{vhost}/{name}",
        &["get", "put", "delete"],
        "A queue: read, declare, delete (if-empty, if-unused)",
    ),
    ("/api/queues/{vhost}/{name}/contents", &["delete"], "Purge"),
    (
        "/api/queues/{vhost}/{name}/get",
        &["post"],
        "Get messages (count, ackmode, encoding, truncate)",
    ),
    (
        "/api/queues/{vhost}/{name}/bindings",
        &["get"],
        "Bindings to the queue",
    ),
    ("/api/exchanges", &["get"], "Exchanges (list parameters)"),
    (
        "/api/exchanges/{vhost}",
        &["get"],
        "Exchanges of a vhost (list parameters)",
    ),
    (
        "/api/exchanges/{vhost}/{name}",
        &["get", "put", "delete"],
        "An exchange: read, declare, delete (if-unused)",
    ),
    (
        "/api/exchanges/{vhost}/{name}/publish",
        &["post"],
        "Publish; answers routed",
    ),
    (
        "/api/exchanges/{vhost}/{name}/bindings/source",
        &["get"],
        "Bindings from the exchange",
    ),
    (
        "/api/exchanges/{vhost}/{name}/bindings/destination",
        &["get"],
        "Bindings to the exchange",
    ),
    ("/api/bindings", &["get"], "Bindings (list parameters)"),
    ("/api/bindings/{vhost}", &["get"], "Bindings of a vhost"),
    (
        "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
        &["get", "post"],
        "Bindings between two objects (kind q or e); POST binds",
    ),
    (
        "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
        &["get", "delete"],
        "One binding by properties key",
    ),
    (
        "/api/definitions",
        &["get", "post"],
        "Export or import definitions (RabbitMQ's format)",
    ),
    (
        "/api/definitions/{vhost}",
        &["get", "post"],
        "Export or import one vhost's definitions",
    ),
    ("/api/policies", &["get"], "Policies of every vhost"),
    ("/api/policies/{vhost}", &["get"], "Policies of a vhost"),
    (
        "/api/policies/{vhost}/{name}",
        &["get", "put", "delete"],
        "Get, create or replace, delete one",
    ),
    (
        "/api/operator-policies",
        &["get"],
        "Operator policies of every vhost",
    ),
    (
        "/api/operator-policies/{vhost}",
        &["get"],
        "Operator policies of a vhost",
    ),
    (
        "/api/operator-policies/{vhost}/{name}",
        &["get", "put", "delete"],
        "Get, create or replace, delete one",
    ),
    (
        "/api/connections",
        &["get"],
        "Connections (list parameters)",
    ),
    (
        "/api/connections/{name}",
        &["get", "delete"],
        "A connection; DELETE closes it with 320 and the X-Reason header",
    ),
    (
        "/api/connections/{name}/channels",
        &["get"],
        "Channels of a connection",
    ),
    (
        "/api/vhosts/{vhost}/connections",
        &["get"],
        "Connections to a vhost",
    ),
    ("/api/channels", &["get"], "Channels (list parameters)"),
    (
        "/api/vhosts/{vhost}/channels",
        &["get"],
        "Channels in a vhost",
    ),
    ("/api/consumers", &["get"], "Consumers"),
    ("/api/consumers/{vhost}", &["get"], "Consumers in a vhost"),
    ("/api/openapi.json", &["get"], "This description"),
    (
        "/api/parameters",
        &["get"],
        "Runtime parameters (shovels only so far)",
    ),
    ("/api/parameters/shovel", &["get"], "Dynamic shovel definitions"),
    (
        "/api/parameters/shovel/{vhost}",
        &["get"],
        "Dynamic shovel definitions of a vhost",
    ),
    (
        "/api/parameters/shovel/{vhost}/{name}",
        &["get", "put", "delete"],
        "A dynamic shovel: read, declare ({\"value\": {...}}), delete",
    ),
    ("/api/shovels", &["get"], "Shovels' states"),
    ("/api/shovels/{vhost}", &["get"], "Shovels' states in a vhost"),
    (
        "/api/shovels/vhost/{vhost}/{name}",
        &["get"],
        "One shovel's state",
    ),
    (
        "/api/shovels/vhost/{vhost}/{name}/restart",
        &["delete"],
        "Restart a shovel",
    ),
    (
        "/api/berth/store/compact",
        &["post"],
        "Compact the store now; answers the segment bytes freed (administrator)",
    ),
    (
        "/api/berth/store/backup",
        &["post"],
        "Back the store up into {\"dir\": absolute path on the broker's machine}, \
         its cut taken with every log group paused (administrator)",
    ),
    (
        "/api/berth/cluster",
        &["get"],
        "The cluster as this member sees it: role, term, leader, each member's log position and lag",
    ),
    (
        "/api/berth/cluster/members",
        &["post"],
        "Add a member {\"peer\": \"NAME@HOST:PORT\"} (administrator; leader only)",
    ),
    (
        "/api/berth/cluster/members/{name}",
        &["delete"],
        "Remove a member (administrator; leader only)",
    ),
    (
        "/metrics",
        &["get"],
        "Prometheus metrics, queues aggregated (no auth)",
    ),
    (
        "/metrics/per-object",
        &["get"],
        "Prometheus metrics per queue (no auth)",
    ),
];

fn parameters(path: &str) -> Value {
    let names: Vec<&str> = path
        .split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect();
    Value::Array(
        names
            .iter()
            .map(|n| json!({"name": n, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect(),
    )
}

/// The description as JSON.
pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for (path, methods, summary) in ROUTES {
        let mut ops = Map::new();
        for m in *methods {
            let mut op = json!({
                "summary": summary,
                "parameters": parameters(path),
                "responses": {"200": {"description": "OK"}, "404": {"description": "Object Not Found"}},
            });
            if !path.starts_with("/metrics") && *path != "/api/openapi.json" {
                op["security"] = json!([{"basic": []}]);
            }
            ops.insert((*m).to_owned(), op);
        }
        paths.insert((*path).to_owned(), Value::Object(ops));
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "berth management API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The subset of RabbitMQ's management HTTP API that berth implements (see docs/MANAGEMENT.md).",
        },
        "components": {"securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "paths": paths,
    })
}

pub(super) async fn openapi() -> Response {
    Json(document()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The router's path literals, read from its source.
    fn router_paths() -> BTreeSet<String> {
        let src = include_str!("../http.rs");
        let body = &src[src.find("pub fn router").expect("router")..];
        let body = &body[..body.find("\n}\n").expect("end of router")];
        body.split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| s.starts_with('/'))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_description_lists_exactly_the_routed_paths() {
        let described: BTreeSet<String> = ROUTES.iter().map(|(p, _, _)| (*p).to_owned()).collect();
        assert_eq!(described, router_paths());
    }
}
