#!/usr/bin/env python3
"""Times the management API and `berth status` against a fresh berth with 5,000
queues (docs/BENCHMARKS.md). Run from the repository root with the test
virtualenv: tests/python/.venv/bin/python scripts/mgmt-latency.py [QUEUES]
(BERTH_BIN=/path/to/berth to time another build)."""
import os, re, shutil, subprocess, tempfile, time, statistics, sys
sys.path.insert(0, "tests/python")
import pika, requests
d = tempfile.mkdtemp(prefix="berth-mgmt-latency-")
log = open(d + "/log", "wb")
BIN = os.environ.get("BERTH_BIN", "target/release/berth")
QUEUES = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
p = subprocess.Popen([BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir", d + "/data"], stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
try:
    for _ in range(200):  # up to 10 s for the ready line
        m = re.search(r"amqp=\S+:(\d+) http=\S+:(\d+)", open(d + "/log").read())
        if m: break
        time.sleep(0.05)
    amqp, http = int(m.group(1)), int(m.group(2))
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp, credentials=pika.PlainCredentials("guest", "guest")))
    ch = c.channel()
    for i in range(QUEUES):
        ch.queue_declare(f"q{i:05d}", durable=True)
        if i % 5 == 0:
            ch.basic_publish("", f"q{i:05d}", b"x" * 100)
    c.close()
    def timeit(fn, n):
        t = []
        for _ in range(n):
            t0 = time.perf_counter(); fn(); t.append((time.perf_counter() - t0) * 1000)
        t.sort()
        return f"min {t[0]:.1f} / median {statistics.median(t):.1f} / p99 {t[int(len(t)*0.99)-1]:.1f} / max {t[-1]:.1f} ms (n={n})"
    s = requests.Session(); s.auth = ("guest", "guest")
    base = f"http://127.0.0.1:{http}"
    print(f"{BIN}, {QUEUES} queues")
    print("GET /api/overview:", timeit(lambda: s.get(base + "/api/overview").raise_for_status(), 200))
    print("GET /metrics:", timeit(lambda: s.get(base + "/metrics").raise_for_status(), 200))
    print("GET /api/queues?page=1&page_size=20:", timeit(lambda: s.get(base + "/api/queues?page=1&page_size=20").raise_for_status(), 200))
    print("GET /api/queues?page=1&page_size=100:", timeit(lambda: s.get(base + "/api/queues?page=1&page_size=100").raise_for_status(), 200))
    print("GET /api/queues?page=1&page_size=100&sort=messages&sort_reverse=true:", timeit(lambda: s.get(base + "/api/queues?page=1&page_size=100&sort=messages&sort_reverse=true").raise_for_status(), 100))
    print("GET /metrics/per-object:", timeit(lambda: s.get(base + "/metrics/per-object").raise_for_status(), 100))
    print("berth status (process incl. startup):", timeit(lambda: subprocess.run([BIN, "status", "--url", f"http://guest:guest@127.0.0.1:{http}"], check=True, capture_output=True), 50))
finally:
    p.terminate(); p.wait(10)
    shutil.rmtree(d, ignore_errors=True)  # a data dir of 5,000 queues
