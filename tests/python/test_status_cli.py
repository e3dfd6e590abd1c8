"""`berth status` and `berth queues|exchanges|connections list` against a
running berth, through its management API."""

import json
import os
import subprocess

from conftest import ROOT
from test_management import Api, berth, conns  # noqa: F401 (fixtures)
from helpers import unique

CLI_TIMEOUT_S = 20


def _cli(berth, *args, columns=80):
    binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
    out = subprocess.run(
        [binary, *args, "--url", f"http://guest:guest@127.0.0.1:{berth.http_port}"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        env=dict(os.environ, COLUMNS=str(columns)))
    return out


def test_status_shows_totals_store_groups_and_top_queues(berth):
    api = Api(berth)
    q = unique("status")
    api.put("queues", "/", q, body={"durable": True})
    for _ in range(4):
        api.post("exchanges", "/", "amq.default", "publish",
                 body={"routing_key": q, "payload": "x", "payload_encoding": "string",
                       "properties": {"delivery_mode": 2}})
    try:
        out = _cli(berth, "status", "--filter", "^" + q + "$")
        assert out.returncode == 0, out.stderr
        assert "alarms: none" in out.stdout
        assert "store group 0:" in out.stdout
        row = [l for l in out.stdout.splitlines() if l.startswith(q[:20])]
        assert len(row) == 1 and row[0].split()[2] == "4", out.stdout
        assert all(len(l) <= 80 for l in out.stdout.splitlines()), out.stdout

        js = json.loads(_cli(berth, "status", "--json", "--filter", q).stdout)
        assert [i["name"] for i in js["queues"]["items"]] == [q]
        assert js["queues"]["items"][0]["messages_ready"] == 4
    finally:
        api.delete("queues", "/", q)


def test_lists_sort_filter_and_print_json(berth, conns):  # noqa: F811
    api = Api(berth)
    prefix = unique("lst")
    for i, n in enumerate(["a", "b", "c"]):
        api.put("queues", "/", f"{prefix}-{n}", body={"durable": False})
        for _ in range(i):
            api.post("exchanges", "/", "amq.default", "publish",
                     body={"routing_key": f"{prefix}-{n}", "payload": "x",
                           "payload_encoding": "string", "properties": {}})
    try:
        out = _cli(berth, "queues", "list", "--filter", prefix, "--sort", "messages",
                   "--reverse", "--json")
        assert out.returncode == 0, out.stderr
        assert [q["name"] for q in json.loads(out.stdout)] == \
            [f"{prefix}-c", f"{prefix}-b", f"{prefix}-a"]
        table = _cli(berth, "queues", "list", "--filter", prefix, "--vhost", "/").stdout
        assert table.splitlines()[0].split()[:3] == ["name", "vhost", "ready"]
        assert len(table.splitlines()) == 4

        conns()
        cs = json.loads(_cli(berth, "connections", "list", "--json").stdout)
        assert cs and cs[0]["user"] == "guest"
        xs = _cli(berth, "exchanges", "list", "--filter", "^amq\\.topic$").stdout
        assert "amq.topic" in xs and "topic" in xs.splitlines()[1]
    finally:
        for n in "abc":
            api.delete("queues", "/", f"{prefix}-{n}")


def test_status_without_a_broker_fails_with_a_clear_error():
    binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
    out = subprocess.run([binary, "status", "--url", "http://guest:guest@127.0.0.1:1"],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert out.returncode != 0
    assert "is berth running with --http-listen" in out.stderr
