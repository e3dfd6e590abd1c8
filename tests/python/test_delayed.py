"""Delayed exchanges (`x-delayed-message`, docs/DELAYED.md), black-box:
delays of 0 / 100 ms / 2 s, a long delay published first never holds back
a short one, every `x-delayed-type`, the arguments' errors, mandatory, and
10,000 pending persistent delayed messages through kill -9 and a restart:
every one routed once, none early, lateness reported."""

import json
import os
import time
import urllib.request

import struct

import pika
import pytest

import amqp_wire as w
from conftest import BerthProcess, external_uri, scratch_dir
from helpers import channel_error, drain, unique

PRECONDITION_FAILED = 406


def delayed_props(delay_ms, persistent=False, headers=None):
    h = dict(headers or {})
    if delay_ms is not None:
        h["x-delay"] = delay_ms
    return pika.BasicProperties(headers=h, delivery_mode=2 if persistent else 1)


def declare_delayed(ch, name, routes_as, durable=False):
    ch.exchange_declare(name, "x-delayed-message", durable=durable,
                        arguments={"x-delayed-type": routes_as})


def receive(conn, ch, queue, count, timeout_s):
    """(body, monotonic receive time) of `count` messages, or fewer at the
    timeout."""
    got = []

    def on_message(c, method, _props, body):
        got.append((body, time.monotonic()))
        c.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.01)
    ch.basic_cancel(tag)
    return got


def test_delays_come_due_in_order_of_due_time_not_of_publishing(conn, ch, names, berth_only):
    x, q = names.exchange("delayed"), names.queue()
    declare_delayed(ch, x, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k")
    ch.confirm_delivery()
    sent = {}
    for body, delay in ((b"2s", 2000), (b"100ms", 100), (b"none", None),
                        (b"zero", 0), (b"negative", -100)):
        sent[body] = (time.monotonic(), delay or 0)
        ch.basic_publish(x, "k", body, delayed_props(delay))
    got = receive(conn, ch, q, 5, timeout_s=10)
    bodies = [b for b, _ in got]
    assert bodies == [b"none", b"zero", b"negative", b"100ms", b"2s"], bodies
    for body, at in got:
        published, delay = sent[body]
        assert at - published >= delay / 1000.0, f"{body!r} came early"
    assert got[3][1] - sent[b"100ms"][0] < 1.5, "the short delay was held back"


@pytest.mark.parametrize("routes_as", ["direct", "fanout", "topic", "headers"])
def test_a_due_message_routes_as_its_delayed_type(conn, ch, names, routes_as, berth_only):
    x, hit, miss = names.exchange("delayed"), names.queue("hit"), names.queue("miss")
    declare_delayed(ch, x, routes_as)
    for q in (hit, miss):
        ch.queue_declare(q)
    bind = {
        "direct": ((hit, "a", None), (miss, "b", None)),
        "fanout": ((hit, "", None),),
        "topic": ((hit, "a.*", None), (miss, "b.#", None)),
        "headers": ((hit, "", {"x-match": "all", "kind": "yes"}),
                    (miss, "", {"x-match": "all", "kind": "no"})),
    }[routes_as]
    for q, key, args in bind:
        ch.queue_bind(q, x, key, arguments=args)
    key = {"direct": "a", "fanout": "any", "topic": "a.b", "headers": ""}[routes_as]
    ch.confirm_delivery()
    ch.basic_publish(x, key, b"m", delayed_props(150, headers={"kind": "yes"}))
    assert drain(ch, hit) == [], "held until due"
    time.sleep(0.4)
    assert drain(ch, hit) == [b"m"]
    assert drain(ch, miss) == []


def test_delayed_exchange_arguments_fail_as_the_plugin_fails(conn, names, berth_only):
    x = names.exchange("delayed")
    ch = conn.channel()
    with channel_error(PRECONDITION_FAILED, text="x-delayed-type"):
        ch.exchange_declare(x, "x-delayed-message")
    ch = conn.channel()
    with channel_error(PRECONDITION_FAILED, text="x-delayed-type"):
        ch.exchange_declare(x, "x-delayed-message",
                            arguments={"x-delayed-type": "x-consistent-hash"})
    ch = conn.channel()
    declare_delayed(ch, x, "topic")
    declare_delayed(ch, x, "topic")  # the same again is fine
    with channel_error(PRECONDITION_FAILED, text="x-delayed-type"):
        declare_delayed(ch, x, "direct")


def test_a_delayed_mandatory_message_is_not_returned(conn, ch, names, berth_only):
    """docs/DELAYED.md: a held message is not known to be unroutable when it
    is published, so it is never returned (as with the plugin)."""
    x = names.exchange("delayed")
    declare_delayed(ch, x, "direct")
    ch.confirm_delivery()
    # pika raises UnroutableError for a returned message in confirm mode.
    ch.basic_publish(x, "nowhere", b"m", delayed_props(50), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, "nowhere", b"now", delayed_props(None), mandatory=True)


def api(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if path.startswith("/api") else body.decode()


def api_post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                 data=json.dumps(body).encode())
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, json.loads(r.read())


PENDING = 10_000


def publish_delayed_confirmed(broker, exchange, key, messages, timeout_s=60):
    """Publishes (body, delay_ms) persistent messages pipelined on a raw
    confirming channel; returns once every one is confirmed (acked)."""
    c = w.RawConnection(broker.host, broker.port)
    try:
        c.handshake()
        c.channel_open(1)
        c.confirm_select(1)
        out = b""
        for body, delay in messages:
            props = struct.pack(">H", 0x3000) + w.table({"x-delay": delay}) + b"\x02"
            out += (w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr(exchange)
                                   + w.shortstr(key) + b"\x00")
                    + w.content_frames(1, body, frame_max=c.frame_max, properties=props))
            if len(out) > 1 << 16:
                c.send(out)
                out = b""
        c.send(out)
        acked = 0
        deadline = time.monotonic() + timeout_s
        while acked < len(messages):
            f = c.recv_method(timeout_s=max(0.01, deadline - time.monotonic()))
            assert f.method_ids == w.BASIC_ACK, f"expected basic.ack, got {f.method_ids}"
            a = f.args()
            tag, multiple = a.longlong(), a.octet() & 1
            acked = tag if multiple else acked + 1
    finally:
        c.close()


def test_pending_delayed_messages_survive_kill_9_and_are_routed_once_never_early():
    if external_uri():
        pytest.skip("needs a berth of its own to kill")
    with scratch_dir("berth-delayed-") as data:
        flags = ["--http-listen", "127.0.0.1:0"]
        x, q = unique("delayed"), unique("q")
        proc = BerthProcess(flags, data_dir=data)
        due = {}
        try:
            b = proc.broker
            conn = b.connect()
            ch = conn.channel()
            declare_delayed(ch, x, "direct", durable=True)
            ch.queue_declare(q, durable=True)
            ch.queue_bind(q, x, "k")
            start = time.time()
            messages = []
            for i in range(PENDING):
                delay = 6000 + (i * 7919) % 3000  # 6..9 s, out of order
                body = str(i).encode()
                due[body] = time.time() + delay / 1000.0
                messages.append((body, delay))
            publish_delayed_confirmed(b, x, "k", messages)
            published_s = time.time() - start
            assert time.time() < min(due.values()), "publishing took longer than the delays"
            ex = api(b.http_port, f"/api/exchanges/%2F/{x}")
            assert ex["type"] == "x-delayed-message"
            assert ex["messages_delayed"] == PENDING, ex
            assert ch.queue_declare(q, passive=True).method.message_count == 0
            conn.close()
            proc.proc.kill()  # kill -9: only what the confirms promised counts
            proc.proc.wait(10)
        finally:
            proc.stop()

        proc = BerthProcess(flags, data_dir=data)
        try:
            b = proc.broker
            restarted = time.time()
            ex = api(b.http_port, f"/api/exchanges/%2F/{x}")
            assert ex["messages_delayed"] == PENDING, "every confirmed one is back"
            conn = b.connect()
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1000)
            got = receive(conn, ch, q, PENDING, timeout_s=max(due.values()) - time.time() + 30)
            wall_offset = time.time() - time.monotonic()
            bodies = [body for body, _ in got]
            assert len(bodies) == PENDING, f"{len(bodies)} of {PENDING} routed after the restart"
            assert len(set(bodies)) == PENDING, "routed more than once"
            lateness = sorted((at + wall_offset) - due[body] for body, at in got)
            assert lateness[0] >= -0.05, f"routed {-lateness[0]:.3f} s early"
            metrics = api(b.http_port, "/metrics")
            assert f'berth_exchange_messages_delayed{{vhost="/",exchange="{x}"}} 0' in metrics
            print(f"\n{PENDING} delayed persistent messages: published in {published_s:.2f} s; "
                  f"after kill -9 and restart ({restarted - start:.1f} s after the first publish) "
                  f"lateness p50 {lateness[len(lateness) // 2] * 1000:.0f} ms, "
                  f"p99 {lateness[len(lateness) * 99 // 100] * 1000:.0f} ms, "
                  f"max {lateness[-1] * 1000:.0f} ms")
            conn.close()
        finally:
            proc.stop()


def test_deleting_a_delayed_exchange_discards_its_pending_messages(start_berth):
    b = start_berth("--http-listen", "127.0.0.1:0")
    conn = b.connect()
    ch = conn.channel()
    x, q = unique("delayed"), unique("q")
    declare_delayed(ch, x, "fanout", durable=True)
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, x, "")
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish(x, "", b"m", delayed_props(300, persistent=True))
    assert api(b.http_port, "/api/overview")["delayed_totals"]["messages_delayed"] == 3
    ch.exchange_delete(x)
    time.sleep(0.5)
    assert drain(ch, q) == []
    assert "discarded" in b.log_tail(200) and "messages=3" in b.log_tail(200)
    conn.close()


def test_a_nacked_message_waits_its_backoff_without_taking_prefetch(conn, ch, names, berth_only):
    """Delayed retry (x-delayed-retry-*): a nack with requeue holds the
    message for its backoff; meanwhile the consumer's single prefetch slot
    serves the next message; the retried one carries x-delivery-count."""
    q = names.queue()
    ch.queue_declare(q, arguments={"x-delayed-retry-min": 300,
                                   "x-delayed-retry-multiplier": 1})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"fails")
    ch.basic_publish("", q, b"next")
    ch.basic_qos(prefetch_count=1)
    got = []

    def on_message(c, method, props, body):
        got.append((body, time.monotonic(), (props.headers or {}).get("x-delivery-count")))
        if body == b"fails" and len(got) == 1:
            c.basic_nack(method.delivery_tag, requeue=True)
        else:
            c.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.01)
    assert [(b, n) for b, _, n in got] == [(b"fails", None), (b"next", None), (b"fails", 1)]
    assert got[1][1] - got[0][1] < 0.25, "the waiting message took the prefetch slot"
    assert got[2][1] - got[0][1] >= 0.3, "retried before its backoff"


def test_a_waiting_retry_is_counted_in_the_queue_api(start_berth):
    b = start_berth("--http-listen", "127.0.0.1:0")
    conn = b.connect()
    ch = conn.channel()
    q = unique("q")
    ch.queue_declare(q, arguments={"x-delayed-retry-min": 60_000})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"m")
    m, _p, _b = ch.basic_get(q)
    ch.basic_nack(m.delivery_tag, requeue=True)
    time.sleep(0.2)
    got = api(b.http_port, f"/api/queues/%2F/{q}")
    assert (got["messages_delayed"], got["messages_ready"], got["messages_unacknowledged"]) == (1, 0, 0), got
    assert ch.basic_get(q)[0] is None, "not deliverable while it waits"
    conn.close()


def test_delayed_retry_arguments_fail_with_406(conn, names, berth_only):
    q = names.queue()
    for args in ({"x-delayed-retry-min": 0}, {"x-delayed-retry-max": 10},
                 {"x-delayed-retry-min": 100, "x-delayed-retry-max": 10},
                 {"x-delayed-retry-min": "100"}):
        ch = conn.channel()
        with channel_error(PRECONDITION_FAILED, text="x-delayed-retry"):
            ch.queue_declare(q, arguments=args)


def test_store_scan_names_a_delayed_exchanges_stored_messages():
    if external_uri():
        pytest.skip("needs a berth of its own and its data directory")
    with scratch_dir("berth-delayed-scan-") as data:
        proc = BerthProcess([], data_dir=data)
        try:
            ch = proc.broker.connect().channel()
            x = unique("delayed")
            declare_delayed(ch, x, "direct", durable=True)
            ch.confirm_delivery()
            ch.basic_publish(x, "k", b"m", delayed_props(600_000, persistent=True))
        finally:
            proc.stop()
        binary = os.environ.get("BERTH_BIN") or os.path.join(
            os.path.dirname(__file__), "..", "..", "target", "release", "berth")
        import subprocess
        out = subprocess.run([binary, "store", "scan", "--data-dir", data, "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert f"delayed exchange '{x}' in vhost '/'" in out.stdout, out.stdout[:2000]


def test_a_waiting_retry_survives_kill_9_with_its_count_and_the_rest_of_its_wait():
    """What docs/DELAYED.md promises of delayed retry across a restart
    (issue 48): a returned persistent message of a durable queue stores a
    retry mark, so after kill -9 it still waits (not ready at once), comes
    back when its wait ends, flagged redelivered, with x-delivery-count 1
    (its count kept); its next return waits the next backoff."""
    if external_uri():
        pytest.skip("needs a berth of its own to restart")
    with scratch_dir("berth-retry-restart-") as data:
        flags = ["--http-listen", "127.0.0.1:0"]
        q = unique("q")
        args = {"x-delayed-retry-min": 4_000, "x-delayed-retry-max": 60_000}
        proc = BerthProcess(flags, data_dir=data)
        try:
            conn = proc.broker.connect()
            ch = conn.channel()
            ch.queue_declare(q, durable=True, arguments=args)
            ch.confirm_delivery()
            ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=2))
            m, _props, _body = ch.basic_get(q)
            ch.basic_nack(m.delivery_tag, requeue=True)
            nacked = time.monotonic()
            time.sleep(0.2)
            got = api(proc.broker.http_port, f"/api/queues/%2F/{q}")
            assert got["messages_delayed"] == 1, got
            conn.close()
            proc.proc.kill()  # kill -9
            proc.proc.wait(10)
        finally:
            proc.stop()
        proc = BerthProcess(flags, data_dir=data)
        try:
            conn = proc.broker.connect()
            ch = conn.channel()
            got = api(proc.broker.http_port, f"/api/queues/%2F/{q}")
            if time.monotonic() - nacked < 3.5:
                assert (got["messages_ready"], got["messages_delayed"]) == (0, 1), got
            while True:
                m, props, body = ch.basic_get(q)
                if m is not None:
                    break
                assert time.monotonic() - nacked < 30, "never came back"
                time.sleep(0.05)
            assert time.monotonic() - nacked >= 3.9, "never early"
            assert body == b"m" and m.redelivered, (m, props)
            assert (props.headers or {}).get("x-delivery-count") == 1, props.headers
            ch.basic_nack(m.delivery_tag, requeue=True)
            time.sleep(0.2)
            assert ch.basic_get(q)[0] is None, "the second backoff (8 s) applies"
            assert api(proc.broker.http_port, f"/api/queues/%2F/{q}")["messages_delayed"] == 1
            conn.close()
        finally:
            proc.stop()


def test_an_http_publish_held_by_a_delayed_exchange_answers_routed_false(start_berth):
    """Issue 48: the API answered `routed: true` for a message a delayed
    exchange holds; it has reached no queue yet (the plugin answers false
    too), so berth answers `routed: false, delayed: true`."""
    b = start_berth("--http-listen", "127.0.0.1:0")
    conn = b.connect()
    ch = conn.channel()
    x, q = unique("delayed"), unique("q")
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    conn.close()
    path = f"/api/exchanges/%2F/{x}/publish"
    msg = {"routing_key": "", "payload": "m", "payload_encoding": "string",
           "properties": {"headers": {"x-delay": 60_000}}}
    status, got = api_post(b.http_port, path, msg)
    assert status == 200 and got.get("routed") is False and got.get("delayed") is True, (status, got)
    msg["properties"] = {}
    status, got = api_post(b.http_port, path, msg)
    assert status == 200 and got.get("routed") is True, (status, got)
