"""Reshaping a store at startup (issue 10) through the real binary: a store
of 2 log groups with durable queues, several thousand persistent messages
(most paged out of memory), some unacked when the broker is killed, users,
vhosts, permissions, exchanges and bindings; refused without --reshape;
reshaped to 6 groups, onto two data directories, and back to 2 groups;
every message intact and in per-queue order, every definition intact.
The free-space check is tested on a small tmpfs (needs root; skipped
otherwise). Time budget: about 30 s.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request

import pika
import pytest

from conftest import ROOT, BerthProcess, external_uri, scratch_dir

QUEUES = 8
PER_QUEUE = 500
UNACKED = 50
BASE_FLAGS = ["--http-listen", "127.0.0.1:0", "--queue-resident-messages-max", "100",
              "--segment-size-bytes", str(256 << 10)]
REFUSAL_TIMEOUT_S = 30


def body(q, i):
    return f"q{q} m{i:05d} ".encode() * 20


def api(b, method, path, doc=None):
    req = urllib.request.Request(f"http://127.0.0.1:{b.http_port}{path}", method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    data = None
    if doc is not None:
        data = json.dumps(doc).encode()
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=10) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused(*flags):
    """Runs berth expecting it to refuse to start; returns its output."""
    binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
    r = subprocess.run([binary, "serve", "--amqp-listen", "127.0.0.1:0", *flags],
                       stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=REFUSAL_TIMEOUT_S, env=dict(os.environ, NO_COLOR="1"))
    out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    assert r.returncode == 1, (r.returncode, out)
    return out


def fill(b):
    st, _ = api(b, "PUT", "/api/vhosts/reshape-vh")
    assert st in (201, 204), st
    st, _ = api(b, "PUT", "/api/users/reshaper", {"password": "s3cret", "tags": ""})
    assert st in (201, 204), st
    st, _ = api(b, "PUT", "/api/permissions/reshape-vh/reshaper",
                {"configure": "^rs-.*", "write": ".*", "read": ".*"})
    assert st in (201, 204), st
    conn = b.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("rs-x", "topic", durable=True)
    for q in range(QUEUES):
        ch.queue_declare(f"rs-q{q}", durable=True)
        ch.queue_bind(f"rs-q{q}", "rs-x", f"k.{q}.#")
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(PER_QUEUE):
        for q in range(QUEUES):
            ch.basic_publish("rs-x", f"k.{q}.m", body(q, i), persistent)
    # Unacked at the crash: delivered to a consumer that never acks.
    ch.basic_qos(prefetch_count=UNACKED)
    got = []
    ch.basic_consume("rs-q0", lambda c, m, p, bd: got.append(bd))
    while len(got) < UNACKED:
        conn.process_data_events(time_limit=1)
    assert got == [body(0, i) for i in range(UNACKED)]
    return conn


def check_everything(b):
    conn = b.connect()
    ch = conn.channel()
    for q in range(QUEUES):
        got = []
        while True:
            m, _p, bd = ch.basic_get(f"rs-q{q}")
            if m is None:
                break
            got.append(bd)
            ch.basic_ack(m.delivery_tag)
        assert got == [body(q, i) for i in range(PER_QUEUE)], f"queue rs-q{q}"
    # Exchanges and bindings still route.
    ch.confirm_delivery()
    ch.basic_publish("rs-x", "k.3.again", b"routed", pika.BasicProperties(delivery_mode=2))
    m, _p, bd = ch.basic_get("rs-q3", auto_ack=True)
    assert bd == b"routed"
    conn.close()
    # The user, its vhost and permissions.
    st, perm = api(b, "GET", "/api/permissions/reshape-vh/reshaper")
    assert st == 200 and perm["configure"] == "^rs-.*", (st, perm)
    c = pika.BlockingConnection(pika.ConnectionParameters(
        b.host, b.port, "reshape-vh", pika.PlainCredentials("reshaper", "s3cret"),
        connection_attempts=1, socket_timeout=10))
    c.channel().queue_declare("rs-mine")
    c.close()


def test_reshape_to_6_groups_onto_two_dirs_and_back_keeps_every_message_and_definition():
    if external_uri():
        pytest.skip("needs berths of its own")
    with scratch_dir("berth-reshape-") as base:
        a, b_dir = os.path.join(base, "a"), os.path.join(base, "b")
        proc = BerthProcess([*BASE_FLAGS, "--log-groups", "2"], data_dir=a)
        try:
            conn = fill(proc.broker)
            proc.proc.kill()  # a crash with deliveries unacked
            proc.proc.wait()
        finally:
            proc.stop()
        del conn

        out = refused("--data-dir", a, "--log-groups", "6", *BASE_FLAGS)
        assert "store.log_groups 2 on disk, 6 configured" in out, out
        assert "--reshape" in out and "bytes free" in out, out
        assert not os.path.exists(os.path.join(a, "reshape-staging"))

        steps = [["--log-groups", "6"],
                 ["--log-groups", "6", "--data-dir", b_dir],
                 ["--log-groups", "2", "--data-dir", b_dir]]
        for extra in steps:
            proc = BerthProcess([*BASE_FLAGS, *extra, "--reshape"], data_dir=a)
            try:
                log = open(proc.log_path, errors="replace").read()
                assert "reshaped the store" in log, log
                conn = proc.broker.connect()
                for q in range(QUEUES):
                    n = conn.channel().queue_declare(f"rs-q{q}", durable=True).method.message_count
                    assert n == PER_QUEUE, (extra, q, n)
                conn.close()
            finally:
                proc.stop()
        assert len([n for n in os.listdir(a) if n.startswith("reshape-old-")]) == 3
        # The shape now matches: no reshape, no --reshape needed.
        proc = BerthProcess([*BASE_FLAGS, "--log-groups", "2", "--data-dir", b_dir], data_dir=a)
        try:
            assert "reshap" not in open(proc.log_path, errors="replace").read()
            check_everything(proc.broker)
        finally:
            proc.stop()


FS_BYTES = 16 << 20


@pytest.fixture
def small_fs():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tempfile.mkdtemp(prefix="berth-reshape-fs-")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", d], check=True)
        yield d
    finally:
        # What was on the tmpfs goes with it: nothing to keep.
        subprocess.run(["umount", "-l", d], check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_reshape_without_the_free_space_is_refused_before_writing(small_fs):
    if external_uri():
        pytest.skip("needs a berth of its own on a small filesystem")
    data = os.path.join(small_fs, "data")
    flags = ["--log-groups", "2", "--disk-free-bytes-min", str(1 << 20),
             "--segment-size-bytes", str(1 << 20)]
    proc = BerthProcess(flags, data_dir=data)
    try:
        conn = proc.broker.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("rs-full", durable=True)
        for i in range(1100):  # about 9 MiB on a 16 MiB filesystem
            ch.basic_publish("", "rs-full", body(0, i) * 40, pika.BasicProperties(delivery_mode=2))
        conn.close()
    finally:
        proc.stop()
    before = sorted(os.listdir(data))
    out = refused("--data-dir", data, "--log-groups", "4", "--reshape",
                  "--disk-free-bytes-min", str(1 << 20))
    assert "refused before writing anything" in out and "bytes free" in out, out
    assert sorted(os.listdir(data)) == before
    proc = BerthProcess(flags, data_dir=data)
    try:
        conn = proc.broker.connect()
        n = conn.channel().queue_declare("rs-full", durable=True).method.message_count
        assert n == 1100
        conn.close()
    finally:
        proc.stop()
