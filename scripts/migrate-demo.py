#!/usr/bin/env python3
"""Runs the steps of docs/MIGRATING.md against a private RabbitMQ 3.10 node
(scripts/rabbitmq.sh) and a berth (target/release/berth or $BERTH_BIN):
an application's queues move from RabbitMQ to berth with a definitions
export/import and one shovel per queue while its producer keeps
publishing, its consumer and then its producer switch, nothing is left
behind; then the same back to RabbitMQ. Prints each step and checks that
every message id was consumed (duplicates counted). About a minute.

  tests/python/.venv/bin/python scripts/migrate-demo.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pika
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module  # noqa: E402

lib = import_module("shovel-rabbitmq-restart")
ROOT, RABBITMQ = lib.ROOT, lib.RABBITMQ
AUTH = ("guest", "guest")
QUEUES = ["orders.eu", "jobs"]


def api(port, method, path, **kw):
    r = requests.request(method, f"http://127.0.0.1:{port}/api/{path}", auth=AUTH,
                         timeout=30, **kw)
    if r.status_code >= 400:
        raise SystemExit(f"{method} {path}: {r.status_code} {r.text}")
    return r


class App:
    """The application: a producer numbering its messages and a consumer
    collecting the numbers, each pointed at one broker at a time."""

    def __init__(self):
        self.next_id = 0
        self.got = []

    def produce(self, uri, n):
        conn = lib.connect(uri)
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(n):
            q = QUEUES[self.next_id % 2]
            rk = "order.eu.created" if q == "orders.eu" else "jobs"
            x = "orders" if q == "orders.eu" else ""
            ch.basic_publish(x, rk, str(self.next_id).encode(),
                             pika.BasicProperties(delivery_mode=2))
            self.next_id += 1
        conn.close()

    def consume(self, uri):
        for q in QUEUES:
            self.got.extend(lib.drain_ids(uri, q))


def step(text):
    print(f"--- {text}", flush=True)


def move(app, src_port, src_uri, dest_port, dest_uri, berth_http, shovel_on_dest):
    step("1. export the definitions from the old broker")
    defs = api(src_port, "GET", "definitions").json()
    defs["parameters"] = [p for p in defs.get("parameters", [])
                          if p.get("component") != "shovel"]
    step("2. import them into the new broker")
    r = api(dest_port, "POST", "definitions", json=defs)
    print("   ", r.json() if r.text else r.status_code)
    step("3. one shovel per queue, run by berth, old queue -> same queue on the new broker")
    queues = [q["name"] for q in api(src_port, "GET", "queues/%2f").json()
              if not q.get("exclusive") and not q["name"].startswith("amq.")]
    for q in queues:
        api(berth_http, "PUT", f"parameters/shovel/%2f/migrate-{q}",
            json={"value": {"src-uri": src_uri, "src-queue": q,
                            "dest-uri": dest_uri, "dest-queue": q}})
    deadline = time.time() + 30
    while time.time() < deadline:
        states = [s["state"] for s in api(berth_http, "GET", "shovels").json()]
        if states and all(s == "running" for s in states):
            break
        time.sleep(0.2)
    print("    shovels:", [(s["name"], s["state"]) for s in api(berth_http, "GET", "shovels").json()])
    step("4. switch the consumers to the new broker (producers still on the old)")
    app.produce(src_uri, 1000)
    time.sleep(1)
    app.consume(dest_uri)
    step("5. switch the producers to the new broker")
    app.produce(dest_uri, 1000)
    step("6. check nothing is left on the old broker, then delete the shovels")
    deadline = time.time() + 30
    while time.time() < deadline:
        left = {q: lib.count(src_uri, q) for q in queues}
        if not any(left.values()):
            break
        time.sleep(0.5)
    print("    left on the old broker:", left)
    for q in queues:
        api(berth_http, "DELETE", f"parameters/shovel/%2f/migrate-{q}")
    app.consume(dest_uri)


def main():
    top = tempfile.mkdtemp(prefix="berth-migrate-")
    rdir, bdir = os.path.join(top, "rabbitmq"), os.path.join(top, "berth")
    os.makedirs(bdir)
    rports = [str(lib.free_port()) for _ in range(4)]
    rhttp = int(rports[1])
    berth = lib.Berth(bdir)
    try:
        subprocess.run([RABBITMQ, "start", rdir, *rports], check=True, timeout=180)
        berth.start()
        ruri = f"amqp://guest:guest@127.0.0.1:{rports[0]}/%2f"
        step("0. the application on RabbitMQ: exchange orders -> orders.eu, queue jobs")
        api(rhttp, "PUT", "exchanges/%2f/orders", json={"type": "topic", "durable": True})
        api(rhttp, "PUT", "queues/%2f/orders.eu", json={"durable": True})
        api(rhttp, "PUT", "queues/%2f/jobs", json={"durable": True})
        api(rhttp, "POST", "bindings/%2f/e/orders/q/orders.eu", json={"routing_key": "order.eu.#"})
        app = App()
        app.produce(ruri, 5000)
        print("    5000 messages waiting on RabbitMQ")
        step("RabbitMQ -> berth")
        move(app, rhttp, ruri, berth.http, berth.uri(), berth.http, True)
        ok = lib.report("    after the move to berth", app.got, app.next_id)
        step("berth -> RabbitMQ (back)")
        app.produce(berth.uri(), 2000)
        move(app, berth.http, berth.uri(), rhttp, ruri, berth.http, False)
        ok = lib.report("    after the move back to RabbitMQ", app.got, app.next_id) and ok
    finally:
        berth.stop()
        subprocess.run([RABBITMQ, "stop", rdir], timeout=120)
        shutil.rmtree(top, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
