#!/usr/bin/env python3
"""Failover time of a three-node cluster (berth or RabbitMQ), as a client
sees it: kill -9 of the node that leads a queue, then time until a publish
to that queue is confirmed again and until its depth is readable again.

Used by scripts/bench-cluster-vs-rabbitmq.sh; needs pika (the script runs
it from .cache/bench-venv). Each node is given as
    --node NAME,AMQP_PORT,HTTP_PORT,PID_FILE,START_COMMAND
where NAME is what the management API's queue `leader` field says for that
node (berth: its cluster.node_id; RabbitMQ: its Erlang node name) and
START_COMMAND brings it back after the kill (run with sh -c).

One kill, repeated --kills times:
 1. wait until the queue has all three members online (management API);
 2. the leader is the node the queue's `leader` field names (on berth the
    cluster leader, which also answers /api/health/checks/is-leader 200);
 3. --load-publishers connections to that node publish persistent 2 KB
    messages with confirms (one in flight each) for --load-s seconds, so
    the node is killed while it commits;
 4. t0 = just before kill -9 of the leader's pid;
 5. every --attempt-ms, two fresh attempts start, each on a new connection
    to the next surviving node in turn: one publishes one persistent
    message with confirms (mandatory); one reads the depth with a passive
    queue.declare, which counts only when it is at least the depth before
    the load plus every load message confirmed (RabbitMQ answers 0 while a
    quorum queue has no leader). `confirmed_s` is the first publish attempt's confirm,
    `depth_s` the first depth read, both measured from t0. Attempts run in
    threads of their own, so one that hangs does not delay the next;
 6. the killed node is started again.

The depth is read over AMQP (queue.declare passive returns message_count)
and not from the management API: RabbitMQ's API shows a quorum queue's
depth from statistics emitted every 5 s, which would measure the
statistics interval, not the failover.

Prints one line per kill, and a JSON line per kill to --out.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import base64

import pika

BODY = b"x" * 2048


def parse_node(text):
    name, amqp, http, pid_file, start = text.split(",", 4)
    return {"name": name, "amqp": int(amqp), "http": int(http), "pid_file": pid_file, "start": start}


def http_json(port, path, timeout_s=2.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.load(resp)


def queue_info(nodes, queue):
    """The queue's JSON from whichever node answers (a berth follower
    answers 503, a RabbitMQ node that is down does not answer)."""
    for n in nodes:
        try:
            return http_json(n["http"], f"/api/queues/%2f/{queue}")
        except Exception:
            continue
    return None


def params(node, timeout_s=5.0):
    return pika.ConnectionParameters(
        host="127.0.0.1", port=node["amqp"], credentials=pika.PlainCredentials("guest", "guest"),
        socket_timeout=timeout_s, blocked_connection_timeout=timeout_s, connection_attempts=1,
        stack_timeout=timeout_s, heartbeat=0)


def pid_of(node):
    with open(node["pid_file"]) as f:
        return int(f.read().strip())


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def declare(nodes, queue, queue_type):
    """Declares the queue through the first node that accepts (berth: the
    leader; RabbitMQ: n1, which then leads it: leaders are client-local)."""
    for n in nodes:
        try:
            conn = pika.BlockingConnection(params(n))
            ch = conn.channel()
            ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
            ch.queue_purge(queue)
            conn.close()
            return
        except Exception:
            continue
    raise SystemExit(f"no node accepted queue.declare {queue}")


def load(node, queue, stop, counts):
    try:
        conn = pika.BlockingConnection(params(node))
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        while not stop.is_set():
            ch.basic_publish("", queue, BODY, props)
            counts[0] += 1
    except Exception:
        pass  # the node was killed under us: that is the point


class FirstSuccess:
    def __init__(self, t0):
        self.t0 = t0
        self.lock = threading.Lock()
        self.elapsed_s = None
        self.detail = None
        self.done = threading.Event()

    def record(self, detail):
        with self.lock:
            if self.elapsed_s is None:
                self.elapsed_s = time.monotonic() - self.t0
                self.detail = detail
                self.done.set()


def publish_attempt(node, queue, result):
    conn = None
    try:
        conn = pika.BlockingConnection(params(node))
        ch = conn.channel()
        ch.confirm_delivery()
        # raises on nack or return; returns once the broker confirmed
        ch.basic_publish("", queue, BODY, pika.BasicProperties(delivery_mode=2), mandatory=True)
        result.record(node["name"])
    except Exception:
        pass
    finally:
        try:
            conn and conn.close()
        except Exception:
            pass


def depth_attempt(node, queue, result, depth_min, short_reads):
    conn = None
    try:
        conn = pika.BlockingConnection(params(node))
        ch = conn.channel()
        ok = ch.queue_declare(queue, passive=True)
        if ok.method.message_count < depth_min:
            # RabbitMQ answers 0 while the queue has no leader (its stat
            # call falls back to {ok, 0, 0}): not the depth, keep trying
            short_reads.append(ok.method.message_count)
            return
        result.record((node["name"], ok.method.message_count))
    except Exception:
        pass
    finally:
        try:
            conn and conn.close()
        except Exception:
            pass


def passive_depth(node, queue):
    conn = pika.BlockingConnection(params(node))
    depth = conn.channel().queue_declare(queue, passive=True).method.message_count
    conn.close()
    return depth


def wait_healthy(nodes, queue, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        q = queue_info(nodes, queue)
        if q and len(q.get("online") or []) == len(nodes) and q.get("leader"):
            return q
        time.sleep(0.25)
    raise SystemExit(f"queue {queue} did not get {len(nodes)} members online within {timeout_s} s")


def one_kill(args, nodes, kill_no):
    q = wait_healthy(nodes, args.queue, args.healthy_timeout_s)
    time.sleep(args.settle_s)
    q = wait_healthy(nodes, args.queue, args.healthy_timeout_s)
    leader = next(n for n in nodes if n["name"] == q["leader"])
    others = [n for n in nodes if n is not leader]
    pid = pid_of(leader)
    depth_before = passive_depth(leader, args.queue)
    stop = threading.Event()
    counts = [0]
    loaders = [threading.Thread(target=load, args=(leader, args.queue, stop, counts), daemon=True)
               for _ in range(args.load_publishers)]
    for t in loaders:
        t.start()
    time.sleep(args.load_s)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    stop.set()
    published = counts[0]  # each was confirmed before it was counted
    short_reads = []
    confirmed, depth = FirstSuccess(t0), FirstSuccess(t0)
    i = 0
    deadline = t0 + args.timeout_s
    while time.monotonic() < deadline and not (confirmed.done.is_set() and depth.done.is_set()):
        target = others[i % len(others)]
        i += 1
        if not confirmed.done.is_set():
            threading.Thread(target=publish_attempt, args=(target, args.queue, confirmed), daemon=True).start()
        if not depth.done.is_set():
            threading.Thread(target=depth_attempt, args=(target, args.queue, depth, depth_before + published, short_reads),
                             daemon=True).start()
        time.sleep(args.attempt_ms / 1000)
    for _ in range(100):
        if not alive(pid):
            break
        time.sleep(0.05)
    subprocess.run(["sh", "-c", leader["start"]], check=True)
    row = {"kind": args.kind, "kill": kill_no, "killed": leader["name"],
           "load_msgs_before_kill": published,
           "confirmed_s": confirmed.elapsed_s, "confirmed_on": confirmed.detail,
           "depth_s": depth.elapsed_s, "depth_on": depth.detail and depth.detail[0],
           "depth": depth.detail and depth.detail[1], "depth_min": depth_before + published,
           "short_reads": len(short_reads)}
    fmt = lambda v: "timeout" if v is None else f"{v:.3f} s"
    print(f"{args.kind} kill {kill_no}: killed {leader['name']} (pid {pid}) after {published} load msgs; "
          f"publish confirmed again after {fmt(confirmed.elapsed_s)} on {confirmed.detail}; "
          f"depth readable after {fmt(depth.elapsed_s)} on {depth.detail} (>= {depth_before + published} expected; "
          f"{len(short_reads)} smaller answers before)", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", required=True, help="label: berth or rabbitmq")
    ap.add_argument("--node", action="append", type=parse_node, required=True)
    ap.add_argument("--queue", default="failover")
    ap.add_argument("--queue-type", default="quorum")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--load-publishers", type=int, default=4)
    ap.add_argument("--load-s", type=float, default=3.0)
    ap.add_argument("--attempt-ms", type=float, default=20.0)
    ap.add_argument("--timeout-s", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--healthy-timeout-s", type=float, default=120.0)
    ap.add_argument("--out", help="append one JSON line per kill here")
    args = ap.parse_args()
    declare(args.node, args.queue, args.queue_type)
    for k in range(1, args.kills + 1):
        row = one_kill(args, args.node, k)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    wait_healthy(args.node, args.queue, args.healthy_timeout_s)


if __name__ == "__main__":
    main()
