#!/usr/bin/env python3
"""Memory given back (issue 20 goal 6, docs/BENCHMARKS.md): starts a fresh
berth, samples its RSS every 0.5 s, fills a backlog with `berth bench
pagesize` (N queues x M persistent messages of SIZE bytes, confirmed), which
then drains every queue and deletes it; keeps sampling for WAIT seconds and
reports RSS before the fill, at its peak, when the queues are gone, and
10/20/30 s later, against the goal (within 1.5x of before, 30 s after).

    scripts/memory-given-back.py [--queues 10] [--messages 100000] [--size 2048] [--wait 40]
    BERTH_BIN=/path/to/old/berth scripts/memory-given-back.py    # another build

Run it under `flock /tmp/berth-bench.lock` on a shared machine."""
import argparse, os, re, shutil, signal, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--queues", type=int, default=10)
ap.add_argument("--messages", type=int, default=100_000)
ap.add_argument("--size", type=int, default=2048)
ap.add_argument("--wait", type=float, default=40.0)
a = ap.parse_args()
BIN = os.environ.get("BERTH_BIN", "target/release/berth")
BENCH = os.environ.get("BENCH_BIN", "target/release/berth")
d = tempfile.mkdtemp(prefix="berth-memback-", dir="/var/tmp")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


log = open(d + "/log", "wb")
p = subprocess.Popen([BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                      "--data-dir", d + "/data"], stdout=log, stderr=log, env=dict(os.environ, NO_COLOR="1"))
samples = []  # (seconds since start, RSS KiB)
stop = threading.Event()
t0 = time.monotonic()


def sampler():
    while not stop.is_set():
        try:
            samples.append((time.monotonic() - t0, rss_kib(p.pid)))
        except OSError:
            return
        time.sleep(0.5)


try:
    m = None
    for _ in range(200):
        m = re.search(r"amqp=\S+:(\d+) http=\S+:(\d+)", open(d + "/log").read())
        if m:
            break
        time.sleep(0.05)
    if not m:
        sys.exit("berth did not start: " + open(d + "/log").read())
    amqp = int(m.group(1))
    threading.Thread(target=sampler, daemon=True).start()
    time.sleep(3)
    before = samples[-1][1]
    fill_start = time.monotonic() - t0
    gb = a.queues * a.messages * a.size / 1e9
    print(f"berth {BIN} pid {p.pid}; before the fill: {before / 1024:.1f} MiB; "
          f"filling {a.queues} x {a.messages} x {a.size} B = {gb:.2f} GB", flush=True)
    subprocess.run([BENCH, "bench", "pagesize", "--uri", f"amqp://guest:guest@127.0.0.1:{amqp}/%2f",
                    "--runs", "1", "--queues", str(a.queues), "--messages", str(a.messages),
                    "--sizes", str(a.size), "--warm", "--quiet", "--out", d + "/bench"],
                   check=True, stdout=subprocess.DEVNULL)
    gone = time.monotonic() - t0
    time.sleep(a.wait)
    stop.set()
    peak = max(r for _, r in samples)

    def at(offset):
        after = [r for t, r in samples if t >= gone + offset]
        return after[0] if after else samples[-1][1]

    print(f"peak {peak / 1024:.1f} MiB; queues drained and deleted at +{gone - fill_start:.1f} s "
          f"of the fill: {at(0) / 1024:.1f} MiB")
    for s in (10, 20, 30):
        print(f"  {s} s later: {at(s) / 1024:.1f} MiB ({at(s) / before:.2f}x before)")
    ok = at(30) <= 1.5 * before
    print(f"goal (30 s later within 1.5x of before, {1.5 * before / 1024:.1f} MiB): "
          f"{'met' if ok else 'NOT met'}")
    with open(d + "/rss.tsv", "w") as f:
        f.writelines(f"{t:.1f}\t{r}\n" for t, r in samples)
    print(f"samples: {d}/rss.tsv")
finally:
    stop.set()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    shutil.rmtree(d + "/data", ignore_errors=True)
