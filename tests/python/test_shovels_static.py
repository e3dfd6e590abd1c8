"""Static shovels (docs/SHOVELS.md, "Static shovels"): `[shovels.NAME]`
tables of berth.toml, started with berth; listed by /api/shovels with
"type": "static" and no vhost (to administrators only), never a runtime
parameter, not deletable or restartable through the API (404, as
RabbitMQ); a bad one stops berth at start with the key named."""

import os

import pytest
import requests

from helpers import wait_until
from test_shovels import (berths, check_every_id, count, drain_ids,  # noqa: F401 (fixture)
                          publish_ids, shovel_state)
from conftest import BerthProcess


def write_config(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def static_config(src, name="moveit", extra_source="", extra_destination=""):
    return f"""
[shovels.{name}]
ack_mode = "on_confirm"
reconnect_delay = 1

[shovels.{name}.source]
uris = ["{src.uri()}"]
queue = "st-a"
prefetch_count = 100
{extra_source}

[shovels.{name}.destination]
uris = ["{src.uri()}"]
publish_fields = {{ exchange = "", routing_key = "st-b" }}
add_forward_headers = true
{extra_destination}
"""


def test_a_static_shovel_runs_is_listed_as_static_and_cannot_be_deleted_by_the_api(
        berths, tmp_path):  # noqa: F811
    src = berths()
    with src.connect() as conn:
        conn.channel().queue_declare("st-b", durable=True)
        publish_ids(conn, "st-a", range(1000))
    config = write_config(tmp_path / "berth.toml", static_config(src))
    runner = berths("--config", str(config))
    assert wait_until(lambda: (shovel_state(runner, "moveit") or {}).get("state") == "running",
                      timeout_s=15), runner.api("GET", "shovels").json()
    s = shovel_state(runner, "moveit")
    assert s["type"] == "static" and "vhost" not in s, s
    conn = src.connect()
    assert wait_until(lambda: count(conn, "st-b") == 1000, timeout_s=15), count(conn, "st-b")
    ch = conn.channel()
    _m, props, _b = ch.basic_get("st-b")
    hop = props.headers["x-shovelled"][0]
    assert hop["shovel-type"] == "static" and hop["shovel-name"] == "moveit", hop
    assert "shovel-vhost" not in hop, hop
    ch.close()
    check_every_id(drain_ids(conn, "st-b"), 1000, "static shovel")
    # Not a runtime parameter: not listed, not exported, not in a vhost.
    assert runner.api("GET", "parameters/shovel").json() == []
    assert runner.api("GET", "shovels/%2f").json() == []
    assert runner.api("GET", "definitions").json().get("parameters", []) == []
    # The API cannot delete or restart it (RabbitMQ: 404), nor put over it.
    assert runner.api("DELETE", "parameters/shovel/%2f/moveit").status_code == 404
    assert runner.api("DELETE", "shovels/vhost/%2f/moveit/restart").status_code == 404
    assert runner.api("GET", "shovels/vhost/%2f/moveit").status_code == 404
    assert shovel_state(runner, "moveit")["state"] == "running"
    # Administrators only (it belongs to no vhost), as in RabbitMQ.
    assert runner.api("PUT", "users/watcher", json={"password": "pw", "tags": "monitoring"}
                      ).status_code in (201, 204)
    assert runner.api("PUT", "permissions/%2f/watcher",
                      json={"configure": ".*", "write": ".*", "read": ".*"}
                      ).status_code in (201, 204)
    seen = requests.get(f"http://127.0.0.1:{runner.http}/api/shovels", auth=("watcher", "pw"),
                        timeout=10)
    assert seen.status_code == 200 and seen.json() == [], seen.text
    # From the config file at each start, never from shovels.json.
    runner.stop()
    saved = os.path.join(runner.data_dir, "shovels.json")
    assert not os.path.exists(saved) or "moveit" not in open(saved).read()
    runner.start()
    assert wait_until(lambda: (shovel_state(runner, "moveit") or {}).get("state") == "running",
                      timeout_s=15)
    publish_ids(conn, "st-a", range(10))
    assert wait_until(lambda: count(conn, "st-b") == 10, timeout_s=15)
    conn.close()


@pytest.mark.parametrize("text, named", [
    ("[shovels.bad.source]\nuris = \"amqp://h\"\nqueue = \"q\"\nprefetch_count = 0\n"
     "[shovels.bad.destination]\nuris = \"amqp://h\"\n",
     "shovels.bad.source.prefetch_count must be an integer from 1 to 65535"),
    ("[shovels.bad.source]\nuris = \"amqp://h\"\nqueue = \"q\"\n"
     "[shovels.bad.destination]\nuris = \"amqp://h\"\ndeclarations = []\n",
     "shovels.bad.destination.declarations is not supported by berth yet"),
    ("[shovels.bad.source]\nuris = \"amqp://h\"\nqueue = \"q\"\n"
     "[shovels.bad.destination]\nuris = \"amqps://h?cacertfile=/nonexistent/ca.pem\"\n",
     "shovels.bad.destination.uris: cacertfile /nonexistent/ca.pem: cannot read"),
])
def test_a_bad_static_shovel_stops_berth_at_start_naming_the_key(tmp_path, text, named):
    config = write_config(tmp_path / "berth.toml", text)
    with pytest.raises(RuntimeError) as info:
        BerthProcess(["--config", str(config)])
    assert named in str(info.value), str(info.value)[-2000:]
