"""The management HTTP API, driven with `requests` and Debian's
`rabbitmqadmin` against a berth started with `--http-listen 127.0.0.1:0`:
RabbitMQ's JSON shapes, status codes, pagination and filtering, messages
through the API, bindings, closing connections, health checks."""

import json
import os
import shutil
import subprocess
import time
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
import requests

from conftest import BerthProcess, external_uri
from helpers import unique

AUTH = ("guest", "guest")
RABBITMQADMIN = "/usr/bin/rabbitmqadmin"
RABBITMQADMIN_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def berth():
    if external_uri():
        pytest.skip("starts its own berth with --http-listen")
    proc = BerthProcess(["--http-listen", "127.0.0.1:0"])
    try:
        assert proc.broker.http_port, "ready line names the HTTP port"
        yield proc.broker
    finally:
        proc.stop()


class Api:
    def __init__(self, broker):
        self.base = f"http://127.0.0.1:{broker.http_port}/api"

    def url(self, *parts):
        return "/".join([self.base, *(quote(p, safe="") for p in parts)])

    def get(self, *parts, **params):
        return requests.get(self.url(*parts), params=params, auth=AUTH, timeout=10)

    def put(self, *parts, body=None):
        return requests.put(self.url(*parts), json=body or {}, auth=AUTH, timeout=10)

    def post(self, *parts, body=None):
        return requests.post(self.url(*parts), json=body or {}, auth=AUTH, timeout=10)

    def delete(self, *parts, headers=None, **params):
        return requests.delete(self.url(*parts), params=params, auth=AUTH, headers=headers,
                               timeout=10)


@pytest.fixture
def api(berth):
    return Api(berth)


@pytest.fixture
def conns(berth):
    """pika connections to this module's berth, closed at teardown."""
    opened = []

    def open_one():
        c = berth.connect()
        opened.append(c)
        return c
    yield open_one
    for c in opened:
        if c.is_open:
            c.close()


def test_api_requires_basic_auth_of_a_configured_user(berth, api):
    assert requests.get(api.url("overview"), timeout=10).status_code == 401
    r = requests.get(api.url("overview"), auth=("guest", "wrong"), timeout=10)
    assert r.status_code == 401
    assert api.get("overview").json()["product_name"] == "berth"


def test_queue_put_get_publish_get_purge_delete(api):
    q = unique("q")
    assert api.put("queues", "/", q, body={"durable": True}).status_code == 201
    assert api.put("queues", "/", q, body={"durable": True}).status_code == 204
    r = api.put("queues", "/", q, body={"durable": False})
    assert r.status_code == 400 and "inequivalent arg 'durable'" in r.json()["reason"]

    info = api.get("queues", "/", q).json()
    assert (info["name"], info["vhost"], info["durable"], info["messages"]) == (q, "/", True, 0)

    r = api.post("exchanges", "/", "amq.default", "publish",
                 body={"routing_key": q, "payload": "hello", "payload_encoding": "string",
                       "properties": {"delivery_mode": 2, "headers": {"h": "v"}}})
    assert r.status_code == 200 and r.json() == {"routed": True}
    r = api.post("exchanges", "/", "amq.default", "publish",
                 body={"routing_key": "nowhere-" + q, "payload": "x",
                       "payload_encoding": "string", "properties": {}})
    assert r.json() == {"routed": False}
    info = api.get("queues", "/", q).json()
    assert info["messages"] == 1 and info["messages_ready"] == 1
    stats = info["message_stats"]
    assert stats["publish"] == 1 and "rate" in stats["publish_details"]

    got = api.post("queues", "/", q, "get",
                   body={"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}).json()
    assert len(got) == 1
    m = got[0]
    assert (m["payload"], m["payload_encoding"], m["routing_key"], m["redelivered"]) == \
        ("hello", "string", q, False)
    assert m["properties"]["delivery_mode"] == 2 and m["properties"]["headers"] == {"h": "v"}
    # Requeued, and flagged redelivered, as RabbitMQ does.
    again = api.post("queues", "/", q, "get",
                     body={"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"}).json()
    assert again[0]["redelivered"] is True and again[0]["payload_encoding"] == "base64"
    assert api.get("queues", "/", q).json()["messages"] == 0

    api.post("exchanges", "/", "amq.default", "publish",
             body={"routing_key": q, "payload": "x", "payload_encoding": "string",
                   "properties": {}})
    r = api.delete("queues", "/", q, **{"if-empty": "true"})
    assert r.status_code == 400 and "not empty" in r.json()["reason"]
    assert api.delete("queues", "/", q, "contents").status_code == 204
    assert api.get("queues", "/", q).json()["messages"] == 0
    assert api.delete("queues", "/", q, **{"if-empty": "true"}).status_code == 204
    assert api.get("queues", "/", q).status_code == 404
    assert api.delete("queues", "/", q).status_code == 404
    assert api.get("queues", "no-such-vhost").status_code == 404


def test_pagination_regex_filter_sort_and_columns(api):
    prefix = unique("page")
    names = [f"{prefix}-{i:02d}" for i in range(25)]
    for n in names:
        assert api.put("queues", "/", n, body={"durable": False}).status_code == 201
    try:
        r = api.get("queues", "/", page=2, page_size=10, name=f"^{prefix}-", use_regex="true")
        body = r.json()
        assert (body["page"], body["page_size"], body["page_count"]) == (2, 10, 3)
        assert body["filtered_count"] == 25 and body["item_count"] == 10
        assert body["total_count"] >= 25
        assert [q["name"] for q in body["items"]] == names[10:20]

        body = api.get("queues", "/", page=1, page_size=5, name=prefix, sort="name",
                       sort_reverse="true").json()
        assert [q["name"] for q in body["items"]] == names[::-1][:5]

        # A regex that matches nothing; a substring filter is not a regex.
        assert api.get("queues", "/", page=1, name=f"^{prefix}-9",
                       use_regex="true").json()["filtered_count"] == 0
        assert api.get("queues", "/", page=1, name=f"^{prefix}").json()["filtered_count"] == 0

        items = api.get("queues", "/", page=1, name=prefix,
                        columns="name,message_stats.publish_details.rate").json()["items"]
        assert set(items[0]) <= {"name", "message_stats"}
        assert set(items[0]["message_stats"]) <= {"publish_details"}

        lean = api.get("queues", "/", page=1, name=prefix, disable_stats="true",
                       enable_queue_totals="true").json()["items"][0]
        assert "message_stats" not in lean and "messages_ready" in lean

        assert api.get("queues", "/", page=9, page_size=10, name=prefix).status_code == 400
        assert api.get("queues", page=1, page_size=501).status_code == 400
        assert api.get("queues", "/", name="(", use_regex="true").status_code == 400
    finally:
        for n in names:
            api.delete("queues", "/", n)


def test_exchanges_and_bindings_through_the_api(api):
    x, x2, q = unique("x"), unique("x2"), unique("q")
    assert api.put("exchanges", "/", x, body={"type": "topic", "durable": True}).status_code == 201
    assert api.put("exchanges", "/", x2, body={"type": "fanout"}).status_code == 201
    r = api.put("exchanges", "/", x, body={"type": "direct"})
    assert r.status_code == 400
    assert api.get("exchanges", "/", x).json()["type"] == "topic"
    assert api.get("exchanges", "/", "amq.default").json()["name"] == ""
    assert api.put("queues", "/", q, body={"durable": False}).status_code == 201
    try:
        r = api.post("bindings", "/", "e", x, "q", q, body={"routing_key": "a.*", "arguments": {}})
        assert r.status_code == 201
        assert r.headers["Location"].endswith("/a.%2A") or r.headers["Location"].endswith("/a.*") \
            or "a." in r.headers["Location"]
        listed = api.get("bindings", "/", "e", x, "q", q).json()
        assert [(b["routing_key"], b["properties_key"]) for b in listed] == [("a.*", "a.%2A")]
        assert any(b["source"] == "" and b["destination"] == q
                   for b in api.get("queues", "/", q, "bindings").json())
        assert api.post("exchanges", "/", x, "publish",
                        body={"routing_key": "a.b", "payload": "m", "payload_encoding": "string",
                              "properties": {}}).json() == {"routed": True}

        assert api.post("bindings", "/", "e", x, "e", x2, body={"routing_key": "z"}).status_code == 201
        assert [b["destination"] for b in api.get("exchanges", "/", x, "bindings", "source").json()] \
            == [q, x2]
        assert api.delete("exchanges", "/", x, **{"if-unused": "true"}).status_code == 400

        assert api.delete("bindings", "/", "e", x, "q", q, "a.%2A").status_code == 204
        assert api.get("bindings", "/", "e", x, "q", q).json() == []
        assert api.post("exchanges", "/", x, "publish",
                        body={"routing_key": "a.b", "payload": "m", "payload_encoding": "string",
                              "properties": {}}).json() == {"routed": False}
        assert api.delete("bindings", "/", "e", x, "e", x2, "z").status_code == 204
        assert api.post("bindings", "/", "e", x, "q", "missing-" + q, body={}).status_code == 404
    finally:
        api.delete("queues", "/", q)
        assert api.delete("exchanges", "/", x).status_code == 204
        api.delete("exchanges", "/", x2)
    assert api.get("exchanges", "/", x).status_code == 404


def test_connections_listed_and_closed_with_320_and_the_x_reason_text(berth, api):
    conn = berth.connect(client_properties={"connection_name": "mgmt-test"})
    try:
        conn.channel()
        mine = [c for c in api.get("connections").json()
                if c["client_properties"].get("connection_name") == "mgmt-test"]
        assert len(mine) == 1
        c = mine[0]
        assert (c["user"], c["vhost"], c["channels"], c["protocol"]) == \
            ("guest", "/", 1, "AMQP 0-9-1")
        assert api.get("connections", c["name"]).json()["name"] == c["name"]
        chans = api.get("connections", c["name"], "channels").json()
        assert [ch["number"] for ch in chans] == [1]
        assert any(ch["connection_details"]["name"] == c["name"]
                   for ch in api.get("channels").json())

        r = api.delete("connections", c["name"], headers={"X-Reason": "closed by test"})
        assert r.status_code == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.2)
        assert info.value.reply_code == 320
        assert info.value.reply_text == "CONNECTION_FORCED - closed by test"
        deadline = time.monotonic() + 5
        while api.get("connections", c["name"]).status_code != 404:
            assert time.monotonic() < deadline, "closed connection still listed"
            time.sleep(0.05)
    finally:
        if conn.is_open:
            conn.close()
    assert api.delete("connections", "no such connection").status_code == 404


def test_consumers_are_listed(berth, api, conns):
    q = unique("q")
    ch = conns().channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume(q, lambda *a: None, consumer_tag="ctag-" + q)
    listed = [c for c in api.get("consumers", "/").json() if c["queue"]["name"] == q]
    assert [(c["consumer_tag"], c["prefetch_count"], c["ack_required"]) for c in listed] == \
        [("ctag-" + q, 7, True)]


def test_health_checks(berth, api):
    assert api.get("aliveness-test", "/").json() == {"status": "ok"}
    assert api.get("health", "checks", "alarms").json() == {"status": "ok"}
    assert api.get("health", "checks", "local-alarms").json() == {"status": "ok"}
    assert api.get("health", "checks", "virtual-hosts").json() == {"status": "ok"}
    assert api.get("health", "checks", "port-listener", str(berth.port)).status_code == 200
    r = api.get("health", "checks", "port-listener", "1")
    assert r.status_code == 503 and r.json()["status"] == "failed"
    nodes = api.get("nodes").json()
    assert len(nodes) == 1 and nodes[0]["running"] is True
    assert api.get("nodes", nodes[0]["name"]).json()["name"] == nodes[0]["name"]


def test_message_counters_for_keda(berth, api, conns):
    q = unique("q")
    ch = conns().channel()
    ch.queue_declare(q, auto_delete=False)
    try:
        for i in range(5):
            ch.basic_publish("", q, b"m")
        for _ in range(3):
            method, _, _ = ch.basic_get(q)
            ch.basic_ack(method.delivery_tag)
        deadline = time.monotonic() + 5
        while True:
            stats = api.get("queues", "/", q).json()["message_stats"]
            if stats["ack"] == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (5, 3, 3)
        for k in ("publish_details", "deliver_get_details", "ack_details"):
            assert isinstance(stats[k]["rate"], float)
    finally:
        ch.queue_delete(q)


# --------------------------------------------------------------------------
# rabbitmqadmin (Debian's rabbitmq-server package)
# --------------------------------------------------------------------------
@pytest.fixture
def admin(berth):
    if not os.access(RABBITMQADMIN, os.X_OK) or not shutil.which("python3"):
        pytest.fail(f"{RABBITMQADMIN} missing: scripts/test.sh installs rabbitmq-server")

    def run(*args):
        out = subprocess.run(
            ["python3", RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(berth.http_port),
             "-u", "guest", "-p", "guest", "-f", "raw_json", *args],
            capture_output=True, text=True, timeout=RABBITMQADMIN_TIMEOUT_S)
        assert out.returncode == 0, f"rabbitmqadmin {args}: {out.stdout}{out.stderr}"
        return out.stdout
    return run


def test_rabbitmqadmin_declares_binds_publishes_gets_lists_and_deletes(admin, api, conns):
    q, x = unique("adm-q"), unique("adm-x")
    admin("declare", "queue", f"name={q}", "durable=true")
    admin("declare", "exchange", f"name={x}", "type=direct")
    admin("declare", "binding", f"source={x}", f"destination={q}", "routing_key=k")
    try:
        assert q in [i["name"] for i in json.loads(admin("list", "queues"))]
        assert x in [i["name"] for i in json.loads(admin("list", "exchanges"))]
        assert any(b["source"] == x and b["destination"] == q
                   for b in json.loads(admin("list", "bindings")))
        admin("publish", f"exchange={x}", "routing_key=k", "payload=via-admin")
        admin("publish", "routing_key=" + q, "payload=via-default")
        got = json.loads(admin("get", f"queue={q}", "count=2", "ackmode=ack_requeue_false"))
        assert [m["payload"] for m in got] == ["via-admin", "via-default"]
        conns()
        assert [c["user"] for c in json.loads(admin("list", "connections"))] == ["guest"]
        admin("purge", "queue", f"name={q}")
        admin("delete", "binding", f"source={x}", "destination_type=queue",
              f"destination={q}", "properties_key=k")
        assert api.get("bindings", "/", "e", x, "q", q).json() == []
    finally:
        admin("delete", "queue", f"name={q}")
        admin("delete", "exchange", f"name={x}")
    assert api.get("queues", "/", q).status_code == 404


def test_openapi_describes_the_served_routes(api):
    doc = requests.get(api.url("openapi.json"), timeout=10).json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    assert set(paths["/api/queues/{vhost}/{name}"]) == {"get", "put", "delete"}
    assert "post" in paths["/api/exchanges/{vhost}/{name}/publish"]
    # Nothing described that is not served: every argument-free GET answers.
    for path, ops in paths.items():
        if "{" not in path and "get" in ops:
            url = api.base[:-len("/api")] + path
            assert requests.get(url, auth=AUTH, timeout=10).status_code == 200, path


def test_rabbitmqadmin_declares_lists_and_deletes_a_policy(admin, api):
    name = unique("adm-pol")
    admin("declare", "policy", f"name={name}", "pattern=^adm-pol-never$",
          'definition={"max-length": 7, "dead-letter-exchange": "dlx"}', "priority=3",
          "apply-to=queues")
    try:
        listed = {p["name"]: p for p in json.loads(admin("list", "policies"))}
        assert listed[name]["definition"] == {"max-length": 7, "dead-letter-exchange": "dlx"}
        assert (listed[name]["priority"], listed[name]["apply-to"]) == (3, "queues")
    finally:
        admin("delete", "policy", f"name={name}")
    assert name not in [p["name"] for p in json.loads(admin("list", "policies"))]
