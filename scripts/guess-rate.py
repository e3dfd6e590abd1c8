#!/usr/bin/env python3
"""Measures password guessing against a fresh berth with its default
settings (docs/SECURITY.md): 50 parallel connections from 127.0.0.1 send
wrong passwords as fast as they are answered for 5 s, over AMQP (a new
connection per guess) and over HTTP basic auth (keep-alive); prints the
guesses answered with a verdict per second, once per run.

Run from the repository root with the test virtualenv:
  tests/python/.venv/bin/python scripts/guess-rate.py [BINARY] [RUNS]
"""
import base64
import http.client
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, "tests/python")
import amqp_wire as w  # noqa: E402

BINARY = sys.argv[1] if len(sys.argv) > 1 else "target/release/berth"
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CONNECTIONS = 50
SECONDS = 5.0


def guess_amqp(port):
    with w.RawConnection("127.0.0.1", port, timeout_s=15) as c:
        c.send(w.PROTOCOL_HEADER + w.method_frame(
            0, w.CONNECTION_START_OK,
            w.table({"product": "guesser"}) + w.shortstr("PLAIN")
            + w.longstr(b"\x00guest\x00wrong") + w.shortstr("en_US")))
        close = c.expect_connection_close(timeout_s=15)
        c.send(w.method_frame(0, w.CONNECTION_CLOSE_OK))
        return "Login was refused" in close.reply_text


def http_guesser(port):
    bad = "Basic " + base64.b64encode(b"guest:wrong").decode()
    local = threading.local()

    def guess():
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        try:
            local.conn.request("GET", "/api/overview", headers={"Authorization": bad})
            r = local.conn.getresponse()
            r.read()
        except (OSError, http.client.HTTPException):
            local.conn.close()
            del local.conn
            return False
        return r.status == 401
    return guess


def rate(guess):
    stop = threading.Event()
    answered = [0] * CONNECTIONS
    end = time.monotonic() + SECONDS

    def loop(i):
        while not stop.is_set():
            try:
                answered[i] += bool(guess()) and time.monotonic() <= end
            except OSError:
                time.sleep(0.05)
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(CONNECTIONS)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, end - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(20)
    return sum(answered) / SECONDS


def one_run():
    d = tempfile.mkdtemp(prefix="berth-guess-rate-")
    log = open(os.path.join(d, "log"), "wb")
    p = subprocess.Popen([BINARY, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen",
                          "127.0.0.1:0", "--data-dir", os.path.join(d, "data")],
                         stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
    try:
        for _ in range(600):  # up to 30 s for the ready line
            m = re.search(r"amqp=\S+:(\d+) http=\S+:(\d+)", open(os.path.join(d, "log")).read())
            if m:
                break
            time.sleep(0.05)
        amqp, web = int(m.group(1)), int(m.group(2))
        a = rate(lambda: guess_amqp(amqp))
        time.sleep(7)  # let the turns booked by 127.0.0.1 pass between the two
        h = rate(http_guesser(web))
        return a, h
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


results = [one_run() for _ in range(RUNS)]
for name, i in (("AMQP", 0), ("HTTP", 1)):
    xs = sorted(r[i] for r in results)
    print(f"{name}: {CONNECTIONS} connections, guesses answered per second over {SECONDS:.0f} s, "
          f"{RUNS} runs: min {xs[0]:.1f} / median {statistics.median(xs):.1f} / max {xs[-1]:.1f}")
