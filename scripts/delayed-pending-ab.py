#!/usr/bin/env python3
"""Millions of pending durable delayed messages, two berth builds A/B
(issue 48; docs/BENCHMARKS.md "Millions of pending delayed messages").

Each run starts one build on free ports with a fresh data directory and
  1. publishes N persistent messages (BODY bytes, default 16) with
     confirms (at most ~20,000 in flight) to a durable x-delayed-message
     exchange, with x-delay 1 to 2 hours, so every one stays pending;
     RSS after (VmRSS of the broker);
  2. kill -9, drops the data directory's files from the page cache
     (posix_fadvise DONTNEED on each file: this run's files only, not the
     machine's cache), restarts: "cold restart" = spawn to the ready line,
     checked against messages_delayed = N; RSS and VmHWM after;
  3. firing lateness under a publishing load: RATE persistent messages a
     second for LOAD_S seconds, each with x-delay 0.5 to 3 s, to the same
     exchange (routed to queue `fire`, consumed with no-ack); lateness of
     each = when it arrived - (when it was sent + its x-delay), client
     clock, so it includes the publish and delivery path; p50/p99/max.
Runs alternate the builds (A, B; B, A; ...). Prints one line per run and,
per build, min/median/max of each figure.

    flock /tmp/berth-bench.lock nice -n 10 python3 scripts/delayed-pending-ab.py \\
        --bin OLD --bin NEW [--n 1000000] [--body 16] [--runs 3] [--rate 2000] [--load-s 15]

Needs N x (BODY + ~90) bytes of disk per run (removed after it).
"""
import argparse, json, os, random, re, signal, statistics, struct, subprocess, sys, tempfile, threading, time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import amqp_wire as w

ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append", required=True, help="a berth binary (give two for A/B)")
ap.add_argument("--n", type=int, default=1_000_000)
ap.add_argument("--body", type=int, default=16)
ap.add_argument("--runs", type=int, default=1, help="runs of each binary")
ap.add_argument("--rate", type=int, default=2000, help="load: delayed messages per second")
ap.add_argument("--load-s", type=float, default=15)
ap.add_argument("--dir", default="/var/tmp")
opt = ap.parse_args()


def start(d):
    seen = os.path.getsize(d + "/log") if os.path.exists(d + "/log") else 0
    log = open(d + "/log", "ab")
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                          "--data-dir", d + "/data"], stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
    while time.monotonic() - t0 < 600:
        text = open(d + "/log").read()
        m = re.search(r"amqp=\S+:(\d+) http=\S+:(\d+)", text[seen:])
        if m:
            return p, int(m.group(1)), int(m.group(2)), time.monotonic() - t0
        if p.poll() is not None:
            break
        time.sleep(0.005)
    raise SystemExit("berth did not start:\n" + open(d + "/log").read()[-4000:])


def status_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1])


def api(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def connect(port):
    c = w.RawConnection("127.0.0.1", port, timeout_s=120)
    c.handshake()
    c.channel_open(1)
    return c


def declare(c):
    decl = (struct.pack(">H", 0) + w.shortstr("later") + w.shortstr("x-delayed-message")
            + b"\x02" + w.table({"x-delayed-type": "direct"}))
    c.send(w.method_frame(1, (40, 10), decl)); c.expect((40, 11))
    for q in ("q", "fire"):
        c.send(w.method_frame(1, (50, 10), struct.pack(">H", 0) + w.shortstr(q) + b"\x02" + w.table({})))
        c.expect((50, 11))
        c.send(w.method_frame(1, (50, 20), struct.pack(">H", 0) + w.shortstr(q) + w.shortstr("later")
                              + w.shortstr(q) + b"\x00" + w.table({})))
        c.expect((50, 21))


def publish_frame(c, key, delay_ms, body):
    props = struct.pack(">H", 0x3000) + w.table({"x-delay": delay_ms}) + b"\x02"
    return (w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("later") + w.shortstr(key) + b"\x00")
            + w.content_frames(1, body, frame_max=c.frame_max, properties=props))


def fill(port):
    """Publishes N pending messages with confirms; returns msg/s."""
    c = connect(port)
    declare(c)
    c.confirm_select(1)
    rng = random.Random(48)
    # A pool of publishes (distinct delays), sent round-robin: Python
    # building each frame would be slower than the broker.
    pool = [publish_frame(c, "q", rng.randint(3_600_000, 7_200_000), b"x" * opt.body) for _ in range(4096)]
    t0 = time.monotonic()
    acked, sent = 0, 0
    while sent < opt.n:
        k = min(5000, opt.n - sent)
        c.send(b"".join(pool[(sent + i) % len(pool)] for i in range(k)))
        sent += k
        while acked < sent - 20_000:
            f = c.recv_method(timeout_s=120)
            a = f.args(); tag, multiple = a.longlong(), a.octet() & 1
            acked = tag if multiple else acked + 1
    while acked < opt.n:
        f = c.recv_method(timeout_s=120)
        a = f.args(); tag, multiple = a.longlong(), a.octet() & 1
        acked = tag if multiple else acked + 1
    rate = opt.n / (time.monotonic() - t0)
    c.close()
    return rate


def drop_cache(d):
    for root, _, files in os.walk(d + "/data"):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def lateness(port):
    """Sends RATE delayed messages a second for LOAD_S s; returns sorted
    lateness (ms) of those that arrived."""
    total = int(opt.rate * opt.load_s)
    sub = connect(port)
    sub.basic_consume(1, "fire", no_ack=True)
    sub.expect((60, 21))
    pub = connect(port)
    rng = random.Random(7)

    def send():
        t0 = time.monotonic()
        for i in range(total):
            ahead = t0 + i / opt.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            delay = rng.randint(500, 3000)
            body = struct.pack(">dI", time.time(), delay)
            pub.send(publish_frame(pub, "fire", delay, body))

    t = threading.Thread(target=send)
    t.start()
    late = []
    deadline = time.monotonic() + opt.load_s + 30
    while len(late) < total and time.monotonic() < deadline:
        f = sub.recv_frame(timeout_s=30)
        if f.type == w.FRAME_BODY:
            sent_s, delay = struct.unpack(">dI", f.payload[:12])
            late.append((time.time() - sent_s) * 1000 - delay)
    t.join()
    sub.close(); pub.close()
    return sorted(late), total


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


results = {b: [] for b in opt.bin}
order = []
for r in range(opt.runs):
    order += opt.bin if r % 2 == 0 else list(reversed(opt.bin))
for BIN in order:
    d = tempfile.mkdtemp(prefix="berth-delayed-pending-", dir=opt.dir)
    p = None
    try:
        p, amqp, http, _ = start(d)
        rate = fill(amqp)
        time.sleep(2)
        rss_fill = status_kib(p.pid, "VmRSS:")
        p.send_signal(signal.SIGKILL); p.wait(30)
        drop_cache(d)
        p, amqp, http, took = start(d)
        pending = api(http, "/api/exchanges/%2F/later")["messages_delayed"]
        assert pending == opt.n, f"{pending} pending after the restart, not {opt.n}"
        rss_restart = status_kib(p.pid, "VmRSS:")
        late, total = lateness(amqp)
        hwm = status_kib(p.pid, "VmHWM:")
        row = dict(publish_per_s=rate, rss_fill_mib=rss_fill / 1024, restart_s=took,
                   rss_restart_mib=rss_restart / 1024, hwm_mib=hwm / 1024,
                   late_p50_ms=pct(late, 0.5), late_p99_ms=pct(late, 0.99), late_max_ms=late[-1] if late else float("nan"),
                   fired=len(late) / total)
        results[BIN].append(row)
        print(BIN, " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    finally:
        if p:
            p.kill(); p.wait(30)
        subprocess.run(["rm", "-rf", d])

print(f"\nN={opt.n} body={opt.body} B, load {opt.rate}/s for {opt.load_s} s; min / median / max per build")
for b, rows in results.items():
    print(b)
    for k in rows[0]:
        xs = sorted(r[k] for r in rows)
        print(f"  {k:16} {xs[0]:12.3f} {statistics.median(xs):12.3f} {xs[-1]:12.3f}")
