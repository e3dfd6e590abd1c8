#!/usr/bin/env python3
"""Delayed messages, berth vs what RabbitMQ 3.10 users run instead
(issue 19, docs/BENCHMARKS.md "Delayed messages vs RabbitMQ's workaround").

Debian's RabbitMQ 3.10.8 has no delayed-message plugin, so its users build
delays from TTL and dead-lettering. Three ways are measured in one run, on
one machine, alternating run by run:

  berth      a durable x-delayed-message exchange (x-delayed-type direct),
             each message with header x-delay, bound to the target queue
  rmq-queues RabbitMQ, one durable wait queue per distinct delay
             (x-message-ttl = that delay, dead-lettered to the target queue
             through the default exchange): the usual workaround
  rmq-msgttl RabbitMQ, one durable wait queue, per-message TTL
             (`expiration`), dead-lettered to the target queue: a message
             expires only at the head, so a long delay holds back shorter
             ones behind it (the issue's complaint); --msgttl to include it

Each run publishes N persistent messages with publisher confirms (at most
20,000 unconfirmed) and delays drawn from DISTINCT values spread evenly up
to SPREAD_S seconds (same seeded sequence for every broker), while one
consumer (autoack, its own process) reads the target queue. A message's
body is its due time (wall clock ms at publish + its delay); lateness =
arrival - due. Reported per run: confirmed publish rate, lateness
p50/p99/max, how many arrived early (< 0 ms: publish time is taken before
the publish is sent, so a broker cannot gain from client-side delay), and
the broker's RSS after publishing.

    tests/python/.venv/bin/python scripts/delayed-vs-rabbitmq.py \\
        [--messages N] [--spread-s 60] [--distinct 60] [--runs 3] [--msgttl]

Starts its own berth (target/release/berth or $BERTH_BIN) and a private
RabbitMQ (scripts/rabbitmq.sh) on free ports, stops both by pid."""
import argparse, multiprocessing, os, random, re, socket, statistics, struct, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import amqp_wire as w

ap = argparse.ArgumentParser()
ap.add_argument("--messages", type=int, default=1_000_000)
ap.add_argument("--spread-s", type=float, default=60)
ap.add_argument("--distinct", type=int, default=60)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--msgttl", action="store_true")
ap.add_argument("--only", choices=["berth", "rmq-queues", "rmq-msgttl"], action="append")
opt = ap.parse_args()
BIN = os.environ.get("BERTH_BIN", "target/release/berth")
INFLIGHT_MAX = 20_000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


def connect(port):
    c = w.RawConnection("127.0.0.1", port, timeout_s=60)
    c.handshake()
    c.channel_open(1)
    return c


def declare_queue(c, name, args):
    c.send(w.method_frame(1, w.QUEUE_DECLARE, struct.pack(">H", 0) + w.shortstr(name) + b"\x02" + w.table(args)))
    c.expect(w.QUEUE_DECLARE_OK)


def delete_queue(c, name):
    c.queue_delete(1, name)
    c.expect(w.QUEUE_DELETE_OK, timeout_s=120)


def consume(port, queue, n, timeout_s, out):
    """Reads n deliveries (autoack) and sends back their lateness in ms."""
    c = connect(port)
    c.basic_consume(1, queue, no_ack=True)
    c.expect(w.BASIC_CONSUME_OK)
    out.send("ready")
    late = []
    buf = bytearray(c.buf)
    deadline = time.monotonic() + timeout_s
    sock = c.sock
    sock.settimeout(5)
    while len(late) < n and time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not chunk:
            break
        now_ms = time.time() * 1000
        buf += chunk
        i = 0
        while len(buf) - i >= 8:
            ftype, _ch, size = struct.unpack_from(">BHI", buf, i)
            if len(buf) - i < 8 + size:
                break
            if ftype == w.FRAME_BODY:
                (due_ms,) = struct.unpack_from(">Q", buf, i + 7)
                late.append(now_ms - due_ms)
            i += 8 + size
        del buf[:i]
    c.close()
    out.send(late)


def run_one(kind, port, pid, tag, delays, http=None):
    n = len(delays)
    c = connect(port)
    target = f"target-{tag}"
    declare_queue(c, target, {})
    wait_queues = []
    if kind == "berth":
        ex = f"later-{tag}"
        c.send(w.method_frame(1, (40, 10), struct.pack(">H", 0) + w.shortstr(ex) + w.shortstr("x-delayed-message")
                              + b"\x02" + w.table({"x-delayed-type": "direct"})))
        c.expect((40, 11))
        c.send(w.method_frame(1, (50, 20), struct.pack(">H", 0) + w.shortstr(target) + w.shortstr(ex)
                              + w.shortstr("k") + b"\x00" + w.table({})))
        c.expect((50, 21))
    elif kind == "rmq-queues":
        for d in sorted(set(delays)):
            q = f"wait-{tag}-{d}"
            declare_queue(c, q, {"x-message-ttl": d, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": target})
            wait_queues.append(q)
    else:
        q = f"wait-{tag}"
        declare_queue(c, q, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target})
        wait_queues.append(q)
    parent, child = multiprocessing.Pipe()
    reader = multiprocessing.Process(target=consume, args=(port, target, n, opt.spread_s + 600, child))
    reader.start()
    assert parent.recv() == "ready"
    c.confirm_select(1)
    method_cache = {}

    def publish_frame(d, due_ms):
        body = struct.pack(">Q", due_ms)
        if kind == "berth":
            ex, key = f"later-{tag}", "k"
            props = struct.pack(">H", 0x3000) + w.table({"x-delay": d}) + b"\x02"
        elif kind == "rmq-queues":
            ex, key = "", f"wait-{tag}-{d}"
            props = struct.pack(">H", 0x1000) + b"\x02"
        else:
            ex, key = "", f"wait-{tag}"
            props = struct.pack(">H", 0x1100) + b"\x02" + w.shortstr(str(d))
        m = method_cache.get(key)
        if m is None:
            m = method_cache[key] = w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr(ex)
                                                   + w.shortstr(key) + b"\x00")
        return m + w.content_frames(1, body, frame_max=c.frame_max, properties=props)

    sent = 0
    # Confirms may come out of order (RabbitMQ sends a single ack for a
    # later tag before a multiple one for earlier tags): every tag up to
    # `watermark` is confirmed, and those in `above` beyond it.
    watermark, above = 0, set()

    def read_confirms(until):
        nonlocal watermark, above
        while watermark + len(above) < until:
            f = c.recv_method(timeout_s=120)
            if f.method_ids != (60, 80):
                raise SystemExit(f"{kind}: expected basic.ack, got {f.method_ids}")
            a = f.args()
            tag_, multiple = a.longlong(), a.octet() & 1
            if multiple:
                if tag_ > watermark:
                    watermark = tag_
                    above = {t for t in above if t > watermark}
            elif tag_ > watermark:
                above.add(tag_)

    t0 = time.monotonic()
    while sent < n:
        out = []
        now_ms = int(time.time() * 1000)
        for d in delays[sent:sent + 2000]:
            out.append(publish_frame(d, now_ms + d))
        sent += len(out)
        c.send(b"".join(out))
        read_confirms(sent - INFLIGHT_MAX)
    read_confirms(n)
    elapsed = time.monotonic() - t0
    rss = rss_mib(pid)
    late = parent.recv()
    reader.join(30)
    routed_late_ms = float("nan")
    if kind == "berth" and http:
        # berth's own figure: how late the latest message was *routed*
        # (the rest of the lateness above is delivery and the client).
        import json, urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{http}/api/exchanges/%2F/later-{tag}")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, timeout=30) as r:
            routed_late_ms = json.loads(r.read())["delayed_lateness_ms_max"]
    for q in wait_queues + [target]:
        delete_queue(c, q)
    if kind == "berth":
        c.send(w.method_frame(1, (40, 20), struct.pack(">H", 0) + w.shortstr(f"later-{tag}") + b"\x00"))
        c.expect((40, 21))
    c.close()
    late.sort()
    q = lambda p: late[min(len(late) - 1, int(p * len(late)))] if late else float("nan")
    return dict(kind=kind, rate=n / elapsed, received=len(late), p50=q(0.5), p99=q(0.99),
                max=late[-1] if late else float("nan"), early=sum(1 for x in late if x < 0), rss=rss,
                routed_late_ms=routed_late_ms)


def main():
    work = tempfile.mkdtemp(prefix="berth-delayed-vs-rmq-", dir="/var/tmp")
    kinds = opt.only or (["berth", "rmq-queues"] + (["rmq-msgttl"] if opt.msgttl else []))
    procs = {}
    try:
        if "berth" in kinds:
            bport, bhttp = free_port(), free_port()
            log = open(f"{work}/berth.log", "wb")
            p = subprocess.Popen([BIN, "serve", "--amqp-listen", f"127.0.0.1:{bport}", "--http-listen",
                                  f"127.0.0.1:{bhttp}", "--data-dir", f"{work}/berth"], stdout=log, stderr=log)
            procs["berth"] = (bport, p.pid, p, bhttp)
            for _ in range(3000):
                if re.search(r"amqp=", open(f"{work}/berth.log").read()):
                    break
                time.sleep(0.01)
        if any(k.startswith("rmq") for k in kinds):
            rport, rhttp = free_port(), free_port()
            subprocess.run(["scripts/rabbitmq.sh", "start", f"{work}/rabbitmq", str(rport), str(rhttp),
                            str(free_port()), str(free_port())], check=True)
            rpid = int(open(f"{work}/rabbitmq/rabbit.pid").read())
            procs["rmq"] = (rport, rpid, None, None)
        rng = random.Random(19)
        step_ms = int(opt.spread_s * 1000 / opt.distinct)
        delays = [rng.randint(1, opt.distinct) * step_ms for _ in range(opt.messages)]
        print(f"{opt.messages} persistent messages, {opt.distinct} distinct delays "
              f"{step_ms}..{step_ms * opt.distinct} ms, confirms, {opt.runs} runs each, alternating", flush=True)
        results = []
        for r in range(opt.runs):
            for kind in kinds:
                port, pid, _, http = procs["berth" if kind == "berth" else "rmq"]
                res = run_one(kind, port, pid, f"{r}", delays, http)
                results.append(res)
                print(f"run {r} {kind:10} publish {res['rate']:9,.0f} msg/s  received {res['received']}  "
                      f"lateness ms p50 {res['p50']:8.1f} p99 {res['p99']:8.1f} max {res['max']:8.1f}  "
                      f"early {res['early']}  RSS after publish {res['rss']:.0f} MiB"
                      + (f"  (berth: routed at most {res['routed_late_ms']} ms late)" if kind == "berth" else ""), flush=True)
        print("\nsummary: min / median / max over runs")
        for kind in kinds:
            rs = [x for x in results if x["kind"] == kind]
            for field, unit in (("rate", "msg/s"), ("p50", "ms"), ("p99", "ms"), ("max", "ms"), ("rss", "MiB")):
                v = sorted(x[field] for x in rs)
                print(f"  {kind:10} {field:4} {v[0]:12,.1f} {statistics.median(v):12,.1f} {v[-1]:12,.1f} {unit}")
        if "berth" in kinds and "rmq-queues" in kinds:
            print("same-run ratios berth / rmq-queues (per run):")
            for r in range(opt.runs):
                b = results[r * len(kinds) + kinds.index("berth")]
                q = results[r * len(kinds) + kinds.index("rmq-queues")]
                print(f"  run {r}: publish {b['rate'] / q['rate']:.2f}x, lateness p99 {q['p99'] / max(b['p99'], 0.1):.1f}x lower"
                      f" (berth {b['p99']:.1f} ms vs {q['p99']:.1f} ms)")
    finally:
        if "berth" in procs:
            procs["berth"][2].kill()
            procs["berth"][2].wait(10)
        if "rmq" in procs:
            subprocess.run(["scripts/rabbitmq.sh", "stop", f"{work}/rabbitmq"])
        if not os.environ.get("KEEP_WORK"):
            subprocess.run(["rm", "-rf", work])
        else:
            print("kept", work)


if __name__ == "__main__":
    main()
