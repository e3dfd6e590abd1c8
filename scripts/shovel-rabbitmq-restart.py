#!/usr/bin/env python3
"""Moves N messages (default 100,000) from a RabbitMQ 3.10 queue to a berth
queue and N more from berth to RabbitMQ with two shovels run by berth
(ack-mode on-confirm), and mid-way restarts RabbitMQ (`--fault
rabbitmq-restart`, the default) or kills berth with SIGKILL and starts it
again on the same data directory (`--fault berth-kill9`). Then drains both
destination queues and prints, per direction, what was sent, received,
missing and duplicated, and how long the move took. Exits 1 if any id is
missing. Not part of scripts/test.sh (about a minute); docs/SHOVELS.md.

  tests/python/.venv/bin/python scripts/shovel-rabbitmq-restart.py [--n 100000]
      [--fault rabbitmq-restart|berth-kill9]

Uses target/release/berth (or $BERTH_BIN) and scripts/rabbitmq.sh; every
process it starts is stopped by pid or by its own stop command, and its
directories are removed."""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pika
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RABBITMQ = os.path.join(ROOT, "scripts", "rabbitmq.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Berth:
    def __init__(self, d):
        self.dir, self.amqp, self.http = d, free_port(), free_port()
        self.proc = None

    def start(self):
        binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
        log = open(os.path.join(self.dir, "berth.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "serve", "--amqp-listen", f"127.0.0.1:{self.amqp}",
             "--http-listen", f"127.0.0.1:{self.http}", "--data-dir",
             os.path.join(self.dir, "data")],
            stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if re.search(rb"berth ready", open(os.path.join(self.dir, "berth.log"), "rb").read()
                         .split(b"---restart---")[-1]):
                return
            time.sleep(0.05)
        raise SystemExit("berth did not start")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        with open(os.path.join(self.dir, "berth.log"), "ab") as f:
            f.write(b"\n---restart---\n")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def uri(self):
        return f"amqp://guest:guest@127.0.0.1:{self.amqp}/%2f"


def connect(uri):
    for _ in range(100):
        try:
            return pika.BlockingConnection(pika.URLParameters(uri + "?heartbeat=0"))
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.2)
    raise SystemExit(f"cannot connect to {uri}")


def publish_ids(uri, queue, n, batch=1000):
    conn = connect(uri)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.tx_select()
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
        if (i + 1) % batch == 0:
            ch.tx_commit()
    ch.tx_commit()
    conn.close()


def count(uri, queue):
    try:
        conn = connect(uri)
        try:
            return conn.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            if conn.is_open:
                conn.close()
    except pika.exceptions.ChannelClosedByBroker:
        return 0


def drain_ids(uri, queue):
    conn = connect(uri)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2000)
    got = []
    for method, _p, body in ch.consume(queue, inactivity_timeout=2.0):
        if method is None:
            break
        got.append(int(body))
        ch.basic_ack(method.delivery_tag, multiple=False)
    conn.close()
    return got


def report(what, got, n):
    missing = set(range(n)) - set(got)
    dups = len(got) - len(set(got))
    print(f"{what}: {n} sent, {len(got)} received, {len(missing)} missing, {dups} duplicates")
    return not missing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--fault", choices=["rabbitmq-restart", "berth-kill9"],
                    default="rabbitmq-restart")
    a = ap.parse_args()
    n = a.n
    top = tempfile.mkdtemp(prefix="berth-shovel-100k-")
    rdir = os.path.join(top, "rabbitmq")
    bdir = os.path.join(top, "berth")
    os.makedirs(bdir)
    rports = [str(free_port()) for _ in range(4)]
    berth = Berth(bdir)
    ok = False
    try:
        subprocess.run([RABBITMQ, "start", rdir, *rports], check=True, timeout=180)
        berth.start()
        ruri = f"amqp://guest:guest@127.0.0.1:{rports[0]}/%2f"
        t = time.time()
        publish_ids(ruri, "r2b-src", n)
        publish_ids(berth.uri(), "b2r-src", n)
        print(f"published {n} to each side in {time.time() - t:.1f} s")
        api = f"http://127.0.0.1:{berth.http}/api/parameters/shovel/%2f/"
        for name, value in [
            ("in", {"src-uri": ruri, "src-queue": "r2b-src",
                    "dest-uri": berth.uri(), "dest-queue": "r2b-dst"}),
            ("out", {"src-uri": berth.uri(), "src-queue": "b2r-src",
                     "dest-uri": ruri, "dest-queue": "b2r-dst"})]:
            r = requests.put(api + name, json={"value": value}, auth=("guest", "guest"),
                             timeout=10)
            assert r.status_code == 201, r.text
        started = time.time()
        while count(berth.uri(), "r2b-dst") < n * 3 // 10:
            time.sleep(0.2)
        print(f"30% moved in {time.time() - started:.1f} s; fault: {a.fault}")
        if a.fault == "rabbitmq-restart":
            subprocess.run([RABBITMQ, "stop", rdir], check=True, timeout=120)
            subprocess.run([RABBITMQ, "start", rdir, *rports], check=True, timeout=180)
        else:
            berth.kill9()
            berth.start()
        shovels = f"http://127.0.0.1:{berth.http}/api/shovels"

        def running():
            got = requests.get(shovels, auth=("guest", "guest"), timeout=10).json()
            return all(s["state"] == "running" for s in got)
        deadline = time.time() + 600
        while time.time() < deadline:
            if (running() and count(ruri, "r2b-src") == 0 and count(berth.uri(), "b2r-src") == 0
                    and count(berth.uri(), "r2b-dst") >= n and count(ruri, "b2r-dst") >= n):
                break
            time.sleep(0.5)
        print(f"moved both ways, shovels running again, {time.time() - started:.1f} s "
              "after the shovels were defined (including the fault)")
        status = requests.get(shovels, auth=("guest", "guest"), timeout=10).json()
        print("states:", {s["name"]: (s["state"], s.get("reason", "")) for s in status})
        ok = report("RabbitMQ -> berth", drain_ids(berth.uri(), "r2b-dst"), n)
        ok = report("berth -> RabbitMQ", drain_ids(ruri, "b2r-dst"), n) and ok
    finally:
        berth.stop()
        subprocess.run([RABBITMQ, "stop", rdir], timeout=120)
        shutil.rmtree(top, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
