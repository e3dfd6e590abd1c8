"""Three members whose peers are DNS names form a cluster: the names
(as a StatefulSet's members have, berth-N.berth.NS.svc) resolve to
loopback addresses through /etc/hosts entries this test writes and
removes, each member listening on its own address. Then `berth health`
reports the leader and both followers, and a confirmed publish through
the leader commits on the majority."""

import os
import random
import shutil
import subprocess
import tempfile
import threading

import pika
import pytest

from helpers import BIN, free_port, ready_addrs, stop, wait_for

HOSTS = "/etc/hosts"


@pytest.fixture
def names():
    """Three names in /etc/hosts, each on a loopback address of its own."""
    marker = f"# berth-package-test {os.getpid()}"
    ns = f"t{os.getpid()}"
    base = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}"
    members = [(f"berth-{i}", f"berth-{i}.berth.{ns}.svc", f"{base}.{11 + i}") for i in range(3)]
    with open(HOSTS) as f:
        before = f.read()
    # Written in place: /etc/hosts may be a bind mount.
    with open(HOSTS, "a") as f:
        f.write("".join(f"{ip} {host} {marker}\n" for _, host, ip in members))
    try:
        yield members
    finally:
        with open(HOSTS) as f:
            lines = [line for line in f.read().splitlines(True) if marker not in line]
        with open(HOSTS, "w") as f:
            f.write("".join(lines))
        with open(HOSTS) as f:
            assert f.read() == before, "/etc/hosts not restored"


def test_members_named_by_dns_names_form_a_cluster(names):
    tmp = tempfile.mkdtemp(prefix="berth-pkg-dns-")
    procs, logs = [], []
    try:
        secret = os.path.join(tmp, "secret")
        with open(secret, "w") as f:
            f.write("a-secret-of-more-than-sixteen-bytes")
        ports = [free_port(ip) for _, _, ip in names]
        peers = [f"{n}@{host}:{port}" for (n, host, _), port in zip(names, ports)]
        for (name, _, ip), port in zip(names, ports):
            args = [
                BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                "--data-dir", os.path.join(tmp, name), "--cluster-node-id", name,
                "--cluster-listen", f"{ip}:{port}", "--cluster-secret-file", secret,
            ]
            for p in peers:
                args += ["--cluster-peer", p]
            proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            log = []
            logs.append(log)
            threading.Thread(target=lambda s=proc.stderr, l=log: l.extend(s), daemon=True).start()

        def addrs(i):
            line = next((l for l in logs[i] if "berth ready" in l), None)
            return line and ready_addrs(line)

        members = [wait_for(f"{names[i][0]} ready", lambda i=i: addrs(i), 30) for i in range(3)]
        # _leader answers the index as text, so that member 0 is truthy.
        leader = int(wait_for("a leader", lambda: _leader(logs), 30))

        def health(i):
            p = subprocess.run(
                [BIN, "health", "--ready", "--url", f"http://{members[i]['http']}"],
                capture_output=True, text=True, timeout=10,
            )
            return p.returncode, p.stdout.strip()

        leader_name = names[leader][0]
        for i in range(3):
            want = f"ok: {leader_name} leads" if i == leader else f"ok: {names[i][0]} follows {leader_name}"
            wait_for(f"{names[i][0]}: {want}", lambda i=i: health(i) == (0, want), 30, 0.2)

        conn = pika.BlockingConnection(
            pika.ConnectionParameters(*members[leader]["amqp"].rsplit(":", 1))
        )
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dns", durable=True)
        ch.basic_publish("", "dns", b"by name", pika.BasicProperties(delivery_mode=2))
        conn.close()
    except BaseException:
        for name, log in zip(names, logs):
            print(f"--- {name[0]}\n{''.join(log[-40:])}")
        raise
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


def _leader(logs):
    for i, log in enumerate(logs):
        if any("berth leader serving clients" in line for line in log):
            return str(i)
    return None
