"""Definitions in RabbitMQ's format (import of a real RabbitMQ 3.10.8
export, export/import round trip, `--load-definitions` at startup),
Prometheus metrics under rabbitmq_prometheus's names (parsed with
prometheus_client's parser)."""

import json
import os

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import BerthProcess, external_uri
from test_management import Api, AUTH

HERE = os.path.dirname(os.path.abspath(__file__))
# Exported from a private RabbitMQ 3.10.8 (scripts/rabbitmq.sh) after
# declaring these objects through its API; see tests/python/README.md.
RABBITMQ_EXPORT = os.path.join(HERE, "fixtures", "rabbitmq-3.10-definitions.json")


@pytest.fixture
def fresh_berth():
    """A berth of its own (imports change the broker for good)."""
    if external_uri():
        pytest.skip("starts its own berth with --http-listen")
    started = []

    def start(*flags):
        p = BerthProcess(["--http-listen", "127.0.0.1:0", *flags])
        started.append(p)
        return p.broker
    yield start
    for p in started:
        p.stop()


def _load_export():
    with open(RABBITMQ_EXPORT) as f:
        return json.load(f)


def _check_imported_objects(api, berth):
    q = api.get("queues", "/", "orders.eu").json()
    assert q["durable"] is True
    assert q["arguments"] == {"x-dead-letter-exchange": "dlx", "x-max-length": 1000,
                              "x-message-ttl": 60000}
    assert api.get("queues", "/", "jobs").json()["type"] == "quorum"
    assert api.get("exchanges", "/", "audit").json()["arguments"] == {"alternate-exchange": "dlx"}
    # The objects behave: a message to orders routes to orders.eu, and
    # through the exchange-to-exchange binding to audit's alternate, dlx.
    r = api.post("exchanges", "/", "orders", "publish",
                 body={"routing_key": "order.eu.created", "payload": "o1",
                       "payload_encoding": "string", "properties": {}})
    assert r.json() == {"routed": True}
    assert api.get("queues", "/", "orders.eu").json()["messages"] == 1
    assert api.get("queues", "/", "dead-letters").json()["messages"] == 1


def test_a_rabbitmq_3_10_export_imports_and_reports_what_it_did_not(fresh_berth):
    berth = fresh_berth()
    api = Api(berth)
    r = api.post("definitions", body=_load_export())
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["imported"] == {"queues": 3, "exchanges": 3, "bindings": 3, "policies": 1,
                                  "shovels": 0, "users": 2, "vhosts": 1, "permissions": 2,
                                  "topic_permissions": 0}
    skipped = "\n".join(report["not_imported"])
    # Nothing dropped silently: the vhost limit and the global parameter
    # are each named; users, permissions and the policy are imported.
    for what in ("parameters 'limits'",
                 "global_parameters 'internal_cluster_id'"):
        assert what in skipped, skipped
    assert "user" not in skipped and "permission for" not in skipped, skipped
    ops = api.get("users", "ops")
    assert ops.status_code == 200 and ops.json()["tags"] in (["administrator"], "administrator"), ops.text
    _check_imported_objects(api, berth)


def test_load_definitions_at_startup_and_export_round_trip(fresh_berth, tmp_path):
    berth = fresh_berth("--load-definitions", RABBITMQ_EXPORT)
    api = Api(berth)
    _check_imported_objects(api, berth)
    exported = api.get("definitions").json()
    names = sorted(q["name"] for q in exported["queues"])
    assert names == ["dead-letters", "jobs", "orders.eu"]
    assert sorted(e["name"] for e in exported["exchanges"]) == ["audit", "dlx", "orders"]
    assert {(b["source"], b["destination"], b["destination_type"], b["routing_key"])
            for b in exported["bindings"]} == {
        ("orders", "orders.eu", "queue", "order.eu.*"),
        ("dlx", "dead-letters", "queue", ""),
        ("orders", "audit", "exchange", "#")}
    assert exported["policies"] == _load_export()["policies"]
    per_vhost = api.get("definitions", "/").json()
    assert "vhost" not in per_vhost["queues"][0]

    # What berth exports, another berth imports, per vhost too.
    other = Api(fresh_berth())
    r = other.post("definitions", "/", body=per_vhost)
    assert r.status_code == 200 and r.json()["imported"]["bindings"] == 3
    assert r.json()["imported"]["policies"] == 1
    assert other.get("policies", "/", "ttl-all").json()["definition"] == {"message-ttl": 30000}
    assert other.get("exchanges", "/", "audit").json()["type"] == "headers"


def test_a_broken_definitions_file_stops_startup_with_a_clear_error(tmp_path):
    if external_uri():
        pytest.skip("starts its own berth")
    bad = tmp_path / "defs.json"
    bad.write_text("{not json")
    with pytest.raises(RuntimeError) as info:
        BerthProcess(["--load-definitions", str(bad)])
    assert "cannot load definitions from" in str(info.value)
    assert "not valid JSON" in str(info.value)


def test_an_import_the_broker_refuses_is_a_400_naming_the_object(fresh_berth):
    api = Api(fresh_berth())
    defs = {"queues": [{"name": "amq.nope", "vhost": "/", "durable": True,
                        "auto_delete": False, "arguments": {}}]}
    r = api.post("definitions", body=defs)
    assert r.status_code == 400 and "queue 'amq.nope'" in r.json()["reason"]


def _scrape(berth, path):
    r = requests.get(f"http://127.0.0.1:{berth.http_port}{path}", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _value(family, **labels):
    return [s.value for s in family.samples
            if all(s.labels.get(k) == v for k, v in labels.items())]


def test_prometheus_metrics_parse_and_carry_the_series_grafana_joins_on(fresh_berth):
    berth = fresh_berth()
    api = Api(berth)
    for q in ("m1", "m2"):
        api.put("queues", "/", q, body={"durable": True})
        for _ in range(3):
            api.post("exchanges", "/", "amq.default", "publish",
                     body={"routing_key": q, "payload": "x", "payload_encoding": "string",
                           "properties": {"delivery_mode": 2}})
    agg = _scrape(berth, "/metrics")
    ident = agg["rabbitmq_identity_info"].samples[0].labels
    assert ident["rabbitmq_node"] and ident["rabbitmq_cluster"]
    assert "rabbitmq_build_info" in agg
    assert _value(agg["rabbitmq_queue_messages_ready"]) == [6]
    assert _value(agg["rabbitmq_queue_messages_unacked"]) == [0]
    assert _value(agg["rabbitmq_queues"]) == [2]
    for name in ("rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers"):
        assert name in agg, name
    # prometheus_client names counter families without `_total`.
    for name in ("rabbitmq_global_messages_received", "rabbitmq_global_messages_delivered",
                 "rabbitmq_global_messages_acknowledged"):
        assert agg[name].type == "counter", name
    assert sum(_value(agg["berth_store_fsyncs"])) >= 1
    assert len(agg["berth_store_bytes_written"].samples) >= 1

    per = _scrape(berth, "/metrics/per-object")
    assert _value(per["rabbitmq_queue_messages_ready"], vhost="/", queue="m1") == [3]
    assert _value(per["rabbitmq_queue_messages_ready"], vhost="/", queue="m2") == [3]
    assert "rabbitmq_identity_info" in per
