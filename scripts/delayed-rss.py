#!/usr/bin/env python3
"""Memory per pending delayed message (docs/DELAYED.md, docs/BENCHMARKS.md):
starts a fresh berth, publishes N persistent messages with random delays
(10 to 20 minutes, so all stay pending) to a durable x-delayed-message
exchange with publisher confirms, and reports the broker's RSS before and
after, per message; then kill -9, restart, and the restart time and RSS
with them pending. Run from the repository root with the test virtualenv:
    tests/python/.venv/bin/python scripts/delayed-rss.py [N] [--queue] [--keep]"""
import json, os, random, re, signal, struct, subprocess, sys, tempfile, time, urllib.request
sys.path.insert(0, "tests/python")
import amqp_wire as w

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
# --queue: the same messages to a durable queue, not delayed (the baseline
# a queued message costs, for comparison).
TO_QUEUE = "--queue" in sys.argv
# --keep: after publishing, keep the broker running (its AMQP port and pid
# printed as `keep amqp=PORT pid=PID`) until this script is stopped, so a
# benchmark of other queues can run beside the pending messages
# (scripts/delayed-beside.sh).
KEEP = "--keep" in sys.argv
BIN = os.environ.get("BERTH_BIN", "target/release/berth")
d = tempfile.mkdtemp(prefix="berth-delayed-rss-")


def start():
    log = open(d + "/log", "wb")
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                          "--data-dir", d + "/data"], stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
    for _ in range(6000):
        m = re.search(r"amqp=\S+:(\d+) http=\S+:(\d+)", open(d + "/log").read())
        if m:
            return p, int(m.group(1)), int(m.group(2)), time.monotonic() - t0
        time.sleep(0.01)
    raise SystemExit("berth did not start:\n" + open(d + "/log").read())


def rss_kib(pid, field="VmRSS:"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1])


def api(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


p, amqp, http, _ = start()
try:
    c = w.RawConnection("127.0.0.1", amqp, timeout_s=60)
    c.handshake()
    c.channel_open(1)
    args = struct.pack(">H", 0)
    decl = (struct.pack(">H", 0) + w.shortstr("later") + w.shortstr("x-delayed-message")
            + b"\x02" + w.table({"x-delayed-type": "direct"}))
    c.send(w.method_frame(1, (40, 10), decl)); c.expect((40, 11))
    bits = 0x02  # durable
    c.send(w.method_frame(1, (50, 10), struct.pack(">H", 0) + w.shortstr("q") + bytes([bits]) + w.table({})))
    c.expect((50, 11))
    c.send(w.method_frame(1, (50, 20), struct.pack(">H", 0) + w.shortstr("q") + w.shortstr("later")
                          + w.shortstr("k") + b"\x00" + w.table({})))
    c.expect((50, 21))
    c.confirm_select(1)
    time.sleep(1)
    before = rss_kib(p.pid)
    rng = random.Random(19)
    t0 = time.monotonic()
    acked, sent, out = 0, 0, []
    while sent < N:
        for _ in range(min(5000, N - sent)):
            props = struct.pack(">H", 0x3000) + w.table({"x-delay": rng.randint(600_000, 1_200_000)}) + b"\x02"
            body = b"%016d" % sent
            ex, key = ("", "q") if TO_QUEUE else ("later", "k")
            out.append(w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr(ex) + w.shortstr(key) + b"\x00")
                       + w.content_frames(1, body, frame_max=c.frame_max, properties=props))
            sent += 1
        c.send(b"".join(out)); out = []
        while acked < sent - 20_000:  # keep at most ~20k in flight
            f = c.recv_method(timeout_s=60)
            a = f.args(); tag, multiple = a.longlong(), a.octet() & 1
            acked = tag if multiple else acked + 1
    while acked < N:
        f = c.recv_method(timeout_s=60)
        a = f.args(); tag, multiple = a.longlong(), a.octet() & 1
        acked = tag if multiple else acked + 1
    elapsed = time.monotonic() - t0
    time.sleep(2)
    after = rss_kib(p.pid)
    ex = api(http, "/api/exchanges/%2F/later")
    if TO_QUEUE:
        ex["messages_delayed"] = f"0 (to queue q: {api(http, '/api/queues/%2F/q')['messages']})"
    print(f"{N} pending delayed persistent messages (16-byte bodies), all confirmed: "
          f"publish {N / elapsed:,.0f} msg/s ({elapsed:.1f} s)")
    print(f"messages_delayed={ex['messages_delayed']}  RSS before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB: "
          f"+{(after - before) / 1024:.1f} MiB = {(after - before) * 1024 / N:.0f} bytes per pending message "
          f"(RssAnon {rss_kib(p.pid, 'RssAnon:') / 1024:.1f} MiB, RssFile {rss_kib(p.pid, 'RssFile:') / 1024:.1f} MiB)")
    c.close()
    if KEEP:
        # Leave the broker running with its pending messages, for a
        # benchmark of other queues beside them; stopped by SIGTERM/SIGINT.
        print(f"keep amqp={amqp} pid={p.pid}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while p.poll() is None:
            time.sleep(1)
        raise SystemExit("berth exited while kept")
    p.send_signal(signal.SIGKILL); p.wait(10)
    p, amqp, http, took = start()
    ex = api(http, "/api/exchanges/%2F/later")
    print(f"after kill -9: restart to ready {took:.2f} s, messages_delayed={ex['messages_delayed']}, "
          f"RSS {rss_kib(p.pid) / 1024:.1f} MiB (RssAnon {rss_kib(p.pid, 'RssAnon:') / 1024:.1f} MiB)")
finally:
    p.kill(); p.wait(10)
    subprocess.run(["rm", "-rf", d])
