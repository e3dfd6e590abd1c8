"""Dynamic shovels (docs/SHOVELS.md): the `/api/parameters/shovel` API and
its validation, `/api/shovels` states, shovels kept across a restart and in
definitions export/import, berth -> berth with kill -9 of the berth that
runs the shovel (on-confirm: every id arrives, duplicates counted), and
RabbitMQ 3.10 -> berth and berth -> RabbitMQ (scripts/rabbitmq.sh).

Each test starts the brokers it needs on ports of its own: a shovel's URI
names a port, and a restarted berth must listen on it again."""

import json
import os
import socket
import subprocess
import time
from urllib.parse import quote

import pika
import pytest
import requests

from conftest import ROOT, BerthProcess, external_uri, remove_test_dir, scratch_dir
from helpers import wait_until

AUTH = ("guest", "guest")

pytestmark = pytest.mark.skipif(external_uri() is not None,
                                reason="starts its own brokers on ports of its own")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Berth:
    """A berth on fixed AMQP and HTTP ports with a data directory that
    outlives the process (so it can be killed and started again)."""

    def __init__(self, data_dir, flags=()):
        self.data_dir = data_dir
        self.amqp = free_port()
        self.http = free_port()
        self.flags = list(flags)
        self.proc = None

    def start(self):
        self.proc = BerthProcess(["--amqp-listen", f"127.0.0.1:{self.amqp}",
                                  "--http-listen", f"127.0.0.1:{self.http}", *self.flags],
                                 data_dir=self.data_dir)
        return self

    def kill9(self):
        self.proc.proc.kill()
        self.proc.proc.wait()
        self.proc.stop()

    def stop(self):
        if self.proc:
            self.proc.stop()

    def uri(self, vhost="/"):
        return f"amqp://guest:guest@127.0.0.1:{self.amqp}/{quote(vhost, safe='')}"

    def connect(self):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqp, "/", pika.PlainCredentials("guest", "guest"),
            heartbeat=0, socket_timeout=10))

    def api(self, method, path, **kw):
        return requests.request(method, f"http://127.0.0.1:{self.http}/api/{path}",
                                auth=AUTH, timeout=10, **kw)


@pytest.fixture
def berths():
    """Starts berths (`berths()`), each with its own data directory; all
    are stopped and their directories removed at the end."""
    made = []
    with scratch_dir("berth-shovel-") as d:
        def make(*flags):
            b = Berth(os.path.join(d, f"data{len(made)}"), flags)
            made.append(b)
            return b.start()
        yield make
        for b in made:
            b.stop()


def put_shovel(berth, name, value, vhost="/"):
    return berth.api("PUT", f"parameters/shovel/{quote(vhost, safe='')}/{name}",
                     json={"value": value})


def shovel_state(berth, name):
    for s in berth.api("GET", "shovels").json():
        if s["name"] == name:
            return s
    return None


def publish_ids(conn, queue, ids, batch=1000):
    """Publishes persistent messages with bodies `ids` to `queue` in
    transactions of `batch` (a commit-ok means they are stored)."""
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.tx_select()
    for i, n in enumerate(ids, 1):
        ch.basic_publish("", queue, str(n).encode(), pika.BasicProperties(delivery_mode=2))
        if i % batch == 0:
            ch.tx_commit()
    ch.tx_commit()
    ch.close()


def count(conn, queue):
    """Messages in `queue` (0 while it does not exist yet)."""
    ch = conn.channel()
    try:
        n = ch.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    ch.close()
    return n


def drain_ids(conn, queue):
    """Every body in `queue` (as ints), consumed and acknowledged."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=1.0):
        if method is None:
            break
        got.append(int(body))
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    ch.close()
    return got


def check_every_id(got, n, what):
    missing = set(range(n)) - set(got)
    duplicates = len(got) - len(set(got))
    print(f"{what}: {n} sent, {len(got)} received, {len(missing)} missing, "
          f"{duplicates} duplicates")
    assert not missing, f"{what}: {len(missing)} ids lost, e.g. {sorted(missing)[:5]}"
    assert set(got) <= set(range(n))
    return duplicates


# --------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------
def test_invalid_definitions_are_400s_that_say_what_is_wrong(berths):
    b = berths()
    ok = {"src-uri": b.uri(), "src-queue": "a", "dest-uri": b.uri(), "dest-queue": "b"}
    cases = [
        ({**ok, "dest-queu": "x"}, "dest-queu is not a shovel field"),
        ({k: v for k, v in ok.items() if k != "src-uri"}, "src-uri is required"),
        ({**ok, "src-exchange": "x"}, "Cannot specify 'src-exchange' and 'src-queue'"),
        ({**ok, "ack-mode": "later"}, "ack-mode must be"),
        ({**ok, "src-prefetch-count": 0}, "from 1 to 65535"),
        ({**ok, "src-uri": "amqps://h"}, "verify_peer (the default) needs cacertfile"),
        ({**ok, "src-uri": "amqp://"}, "names no host"),
        ({**ok, "src-protocol": "amqp10"}, "AMQP 1.0"),
        ({**ok, "dest-publish-properties": {}}, "not supported by berth yet"),
    ]
    for value, why in cases:
        r = put_shovel(b, "s", value)
        assert r.status_code == 400, (value, r.text)
        assert why in r.json()["reason"], (why, r.json())
    r = b.api("PUT", "parameters/shovel/%2f/s", json=ok)
    assert r.status_code == 400 and "inside \"value\"" in r.json()["reason"], r.text
    r = b.api("PUT", "parameters/shovel/%2f/s", data="{not json")
    assert r.status_code == 400
    assert put_shovel(b, "s", ok, vhost="nope").status_code == 404
    assert b.api("GET", "parameters/shovel").json() == []
    assert b.api("DELETE", "parameters/shovel/%2f/s").status_code == 404


def test_a_shovel_is_listed_exported_kept_across_a_restart_and_deleted(berths):
    b = berths()
    value = {"src-uri": b.uri(), "src-queue": "keep-a", "dest-uri": [b.uri()],
             "dest-queue": "keep-b", "reconnect-delay": 2}
    assert put_shovel(b, "keep", value).status_code == 201
    assert put_shovel(b, "keep", value).status_code == 204
    param = {"vhost": "/", "component": "shovel", "name": "keep", "value": value}
    assert b.api("GET", "parameters/shovel/%2f/keep").json() == param
    assert b.api("GET", "parameters/shovel/%2f").json() == [param]
    assert b.api("GET", "parameters").json() == [param]
    assert wait_until(lambda: shovel_state(b, "keep")["state"] == "running")
    s = shovel_state(b, "keep")
    assert s["src_queue"] == "keep-a" and s["dest_queue"] == "keep-b"
    assert "guest:guest" not in json.dumps(s), "a status never shows a password"
    defs = b.api("GET", "definitions").json()
    assert defs["parameters"] == [param]
    # Kept on disk: a restarted berth runs it again.
    b.stop()
    b.start()
    assert b.api("GET", "parameters/shovel/%2f/keep").json() == param
    assert wait_until(lambda: shovel_state(b, "keep")["state"] == "running", timeout_s=10)
    assert b.api("DELETE", "shovels/vhost/%2f/keep/restart").status_code == 204
    assert wait_until(lambda: shovel_state(b, "keep")["state"] == "running", timeout_s=10)
    assert b.api("DELETE", "shovels/vhost/%2f/nope/restart").status_code == 404
    assert b.api("DELETE", "parameters/shovel/%2f/keep").status_code == 204
    assert b.api("GET", "shovels").json() == []
    # Imported from definitions (as RabbitMQ exports it), into another berth.
    other = berths()
    r = other.api("POST", "definitions", json=defs)
    assert r.status_code == 200, r.text
    assert r.json()["imported"]["shovels"] == 1
    assert other.api("GET", "parameters/shovel/%2f/keep").json() == param
    b.stop()
    other.stop()
    other.start()
    assert other.api("GET", "parameters/shovel/%2f/keep").json() == param
    # A vhost's shovels go with it, as its parameters do in RabbitMQ.
    assert other.api("PUT", "vhosts/v2").status_code == 201
    assert put_shovel(other, "in-v2", value, vhost="v2").status_code == 201
    assert other.api("DELETE", "vhosts/v2").status_code == 204
    assert other.api("GET", "parameters/shovel").json() == [param]


def test_failing_shovels_report_why_and_do_not_hold_up_the_others(berths):
    b = berths()
    closed = free_port()
    good = {"src-uri": b.uri(), "src-queue": "ok-a", "dest-uri": b.uri(), "dest-queue": "ok-b"}
    bad = {
        "unreachable": {**good, "src-uri": f"amqp://guest:guest@127.0.0.1:{closed}/%2f"},
        "bad-login": {**good, "dest-uri": f"amqp://guest:wrong@127.0.0.1:{b.amqp}/%2f"},
        "no-exchange": {**good, "src-queue": None, "src-exchange": "missing-x"},
    }
    for name, value in bad.items():
        value = {k: v for k, v in value.items() if v is not None}
        assert put_shovel(b, name, value).status_code == 201
    assert put_shovel(b, "good", good).status_code == 201
    reasons = {"unreachable": "cannot connect", "bad-login": "destination",
               "no-exchange": "missing-x"}

    def all_reported():
        states = {s["name"]: s for s in b.api("GET", "shovels").json()}
        return states["good"]["state"] == "running" and all(
            states[n]["state"] == "terminated" and why in states[n]["reason"]
            for n, why in reasons.items())
    assert wait_until(all_reported, timeout_s=10), b.api("GET", "shovels").json()
    conn = b.connect()
    publish_ids(conn, "ok-a", range(100))
    assert wait_until(lambda: count(conn, "ok-b") == 100, timeout_s=10)
    # They keep retrying: the unreachable one runs once its source is there.
    src = berths()
    fixed = {**good, "src-uri": src.uri()}
    assert put_shovel(b, "unreachable", fixed).status_code == 204
    assert wait_until(lambda: shovel_state(b, "unreachable")["state"] == "running",
                      timeout_s=10)
    conn.close()


def test_src_delete_after_queue_length_moves_the_backlog_then_deletes_itself(berths):
    b = berths()
    conn = b.connect()
    publish_ids(conn, "dal-a", range(500))
    value = {"src-uri": b.uri(), "src-queue": "dal-a", "dest-uri": b.uri(),
             "dest-queue": "dal-b", "src-delete-after": "queue-length",
             "add-forward-headers": True, "dest-add-timestamp-header": True}
    assert put_shovel(b, "once", value).status_code == 201
    assert wait_until(lambda: b.api("GET", "shovels").json() == [], timeout_s=10)
    assert b.api("GET", "parameters/shovel/%2f/once").status_code == 404
    assert count(conn, "dal-b") == 500
    ch = conn.channel()
    _m, props, _b = ch.basic_get("dal-b", auto_ack=True)
    hop = props.headers["x-shovelled"][0]
    assert hop["shovel-name"] == "once" and hop["src-queue"] == "dal-a"
    assert hop["dest-queue"] == "dal-b" and hop["shovel-type"] == "dynamic"
    assert abs(props.headers["x-shovelled-timestamp"] - time.time()) < 60
    conn.close()


def test_exchange_ends_and_the_other_ack_modes_move_every_message(berths):
    b = berths()
    conn = b.connect()
    ch = conn.channel()
    ch.queue_declare("am-b", durable=True)
    ch.queue_bind("am-b", "amq.direct", "am-b")
    # on-publish, queue -> exchange with a routing key of its own.
    assert put_shovel(b, "to-x", {
        "src-uri": b.uri(), "src-queue": "am-a", "dest-uri": b.uri(),
        "dest-exchange": "amq.direct", "dest-exchange-key": "am-b",
        "ack-mode": "on-publish"}).status_code == 201
    # no-ack, exchange (a server-named queue bound with the key) -> queue.
    assert put_shovel(b, "from-x", {
        "src-uri": b.uri(), "src-exchange": "amq.topic", "src-exchange-key": "t.#",
        "dest-uri": b.uri(), "dest-queue": "am-c", "ack-mode": "no-ack"}).status_code == 201
    assert wait_until(lambda: all(s["state"] == "running"
                                  for s in b.api("GET", "shovels").json()), timeout_s=10)
    s = shovel_state(b, "from-x")
    assert s["src_exchange"] == "amq.topic" and s["src_exchange_key"] == "t.#"
    publish_ids(conn, "am-a", range(1000))
    ch.confirm_delivery()
    for i in range(1000):
        ch.basic_publish("amq.topic", "t.x" if i % 2 else "u.x", str(i).encode())
    assert wait_until(lambda: count(conn, "am-b") == 1000 and count(conn, "am-c") == 500,
                      timeout_s=10), (count(conn, "am-b"), count(conn, "am-c"))
    check_every_id(drain_ids(conn, "am-b"), 1000, "on-publish, queue -> exchange")
    assert sorted(drain_ids(conn, "am-c")) == list(range(1, 1000, 2))
    conn.close()


# --------------------------------------------------------------------------
# Moving messages
# --------------------------------------------------------------------------
N_BERTH = 10_000


@pytest.mark.parametrize("killed", ["destination", "source"])
def test_berth_to_berth_on_confirm_loses_nothing_across_kill_9(berths, killed):
    """The shovel runs on the destination berth; kill -9 of it (the shovel
    and its destination) or of the source berth mid-way, then a restart:
    every id arrives, duplicates are counted."""
    src, dest = berths(), berths()
    with src.connect() as conn:
        publish_ids(conn, "move", range(N_BERTH))
    value = {"src-uri": src.uri(), "src-queue": "move", "dest-uri": dest.uri(),
             "dest-queue": "moved", "src-prefetch-count": 500}
    assert put_shovel(dest, "move", value).status_code == 201
    conn = dest.connect()
    assert wait_until(lambda: count(conn, "moved") >= N_BERTH // 4, timeout_s=20)
    conn.close()
    victim = dest if killed == "destination" else src
    victim.kill9()
    victim.start()
    conn = dest.connect()
    with src.connect() as sconn:
        # Not asserted: a lost message shows as a missing id below.
        wait_until(lambda: count(conn, "moved") >= N_BERTH
                   and count(sconn, "move") == 0, timeout_s=30)
    assert shovel_state(dest, "move")["state"] == "running"
    got = drain_ids(conn, "moved")
    conn.close()
    check_every_id(got, N_BERTH, f"berth -> berth, kill -9 of the {killed} mid-way")


@pytest.fixture(scope="module")
def rabbitmq():
    """A private RabbitMQ 3.10 node (scripts/rabbitmq.sh): (amqp port,
    http port)."""
    with scratch_dir("berth-shovel-rabbitmq-") as d:
        amqp, http, dist, epmd = (free_port() for _ in range(4))
        script = os.path.join(ROOT, "scripts", "rabbitmq.sh")
        subprocess.run([script, "start", d, str(amqp), str(http), str(dist), str(epmd)],
                       check=True, timeout=120)
        try:
            yield amqp
        finally:
            subprocess.run([script, "stop", d], timeout=60)


def test_rabbitmq_to_berth_and_berth_to_rabbitmq(berths, rabbitmq):
    n = 2_000
    b = berths()
    rmq_uri = f"amqp://guest:guest@127.0.0.1:{rabbitmq}/%2f"
    rmq = pika.BlockingConnection(pika.URLParameters(rmq_uri))
    publish_ids(rmq, "from-rabbit", range(n))
    with b.connect() as conn:
        publish_ids(conn, "from-berth", range(n))
    assert put_shovel(b, "in", {"src-uri": rmq_uri, "src-queue": "from-rabbit",
                                "dest-uri": b.uri(), "dest-queue": "in"}).status_code == 201
    assert put_shovel(b, "out", {"src-uri": b.uri(), "src-queue": "from-berth",
                                 "dest-uri": rmq_uri, "dest-queue": "out"}).status_code == 201
    conn = b.connect()
    assert wait_until(lambda: count(conn, "in") == n and count(rmq, "out") == n,
                      timeout_s=30), (count(conn, "in"), count(rmq, "out"))
    check_every_id(drain_ids(conn, "in"), n, "RabbitMQ -> berth")
    check_every_id(drain_ids(rmq, "out"), n, "berth -> RabbitMQ")
    assert count(rmq, "from-rabbit") == 0 and count(conn, "from-berth") == 0
    conn.close()
    rmq.close()
