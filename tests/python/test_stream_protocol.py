"""RabbitMQ's stream protocol on `net.stream_listen`, driven by a real stream
client: `rstream` (RabbitMQ's Python stream client, from PyPI), which checks
every chunk's CRC and layout as the Java and Go clients do. Interop with
AMQP 0-9-1 (pika) over the same streams, in both directions.

Each test starts its own berth with `--stream-listen 127.0.0.1:0` (the stream
protocol is off by default), so none runs against an external broker.
"""

import asyncio
import os
import re
import signal
import socket
import struct
import time

import pytest
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    OffsetType,
    amqp_decoder,
)
from rstream import Consumer, Producer

from conftest import ANSI_RE
from helpers import unique

STREAM_RE = re.compile(r"berth ready .* stream=([^\s,]+)")
TIMEOUT_S = 15


def stream_port(broker):
    with open(broker.log_path, errors="replace") as f:
        m = STREAM_RE.search(ANSI_RE.sub("", f.read()))
    assert m, f"no stream= in the ready line; log:\n{broker.log_tail()}"
    return int(m.group(1).rpartition(":")[2])


def start(start_berth, data_dir=None):
    b = start_berth("--stream-listen", "127.0.0.1:0", data_dir=data_dir)
    return b, stream_port(b)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S * 2))


def producer(port):
    return Producer("127.0.0.1", port, username="guest", password="guest")


def consumer(port):
    return Consumer("127.0.0.1", port, username="guest", password="guest")


async def publish_confirmed(port, stream, bodies, publisher_name=None, ids=None, create=True):
    """Publishes `bodies` as AMQP 1.0 messages and waits for every confirm."""
    confirmed, errors = set(), []
    done = asyncio.Event()

    async def on_confirm(status):
        if status.is_confirmed:
            confirmed.add(status.message_id)
        else:
            errors.append(status)
        if len(confirmed) + len(errors) == len(bodies):
            done.set()

    async with producer(port) as p:
        if create:
            await p.create_stream(stream, exists_ok=True)
        msgs = [AMQPMessage(body=b) for b in bodies]
        for i, m in enumerate(msgs):
            m.publishing_id = None if ids is None else ids[i]
        for i in range(0, len(msgs), 100):
            await p.send_batch(stream, msgs[i:i + 100], publisher_name=publisher_name,
                               on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
    return confirmed, errors


def body_of(msg):
    """An AMQP 1.0 message's data: one section (bytes) or several (a list)."""
    return b"".join(msg.body) if isinstance(msg.body, list) else msg.body


async def consume(port, stream, n, spec, whole=False, subscriber_name=None, settle_s=0.0):
    """Reads `n` messages (and, with `settle_s`, waits that long for more);
    returns [(offset, body)], or with `whole` [(offset, AMQP 1.0 message)]."""
    got = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got.append((ctx.offset, msg if whole else body_of(msg)))
        if len(got) >= n:
            done.set()

    async with consumer(port) as c:
        await c.subscribe(stream, on_message, offset_specification=spec,
                          decoder=amqp_decoder,
                          subscriber_name=subscriber_name)
        if n:
            await asyncio.wait_for(done.wait(), TIMEOUT_S)
        await asyncio.sleep(settle_s)
    return got


def test_publish_with_confirms_then_consume_from_first_offset_and_next(start_berth):
    _, port = start(start_berth)
    stream = unique("sp-basic")
    n = 500
    bodies = [f"m{i}".encode() for i in range(n)]
    confirmed, errors = run(publish_confirmed(port, stream, bodies))
    assert not errors
    assert len(confirmed) == n

    got = run(consume(port, stream, n, ConsumerOffsetSpecification(OffsetType.FIRST)))
    assert [o for o, _ in got] == list(range(n))
    assert [b for _, b in got] == bodies

    got = run(consume(port, stream, n - 250,
                      ConsumerOffsetSpecification(OffsetType.OFFSET, 250)))
    assert [o for o, _ in got] == list(range(250, n))

    async def next_only():
        got = []
        arrived = asyncio.Event()

        async def on_message(msg, ctx):
            got.append((ctx.offset, body_of(msg)))
            arrived.set()

        async with consumer(port) as c:
            await c.subscribe(stream, on_message, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))
            await asyncio.sleep(0.3)
            assert got == [], "NEXT delivers nothing already there"
            await publish_confirmed(port, stream, [b"after"], create=False)
            await asyncio.wait_for(arrived.wait(), TIMEOUT_S)
        return got

    assert run(next_only()) == [(n, b"after")]


def test_stored_offset_and_messages_survive_a_restart(start_berth, tmp_path):
    data = str(tmp_path / "data")
    b, port = start(start_berth, data_dir=data)
    stream = unique("sp-restart")
    bodies = [f"r{i}".encode() for i in range(100)]
    run(publish_confirmed(port, stream, bodies, publisher_name="p-restart",
                          ids=list(range(1, 101))))

    async def store():
        async with consumer(port) as c:
            await c.store_offset(stream, "app-1", 41)
            return await c.query_offset(stream, "app-1")

    assert run(store()) == 41
    os.kill(b.pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(b.pid, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            break
    # The first berth is gone (reaped by its fixture at the end): a new
    # one on the same data directory.
    time.sleep(0.5)
    _, port = start(start_berth, data_dir=data)

    async def resume():
        async with consumer(port) as c:
            return await c.query_offset(stream, "app-1")

    stored = run(resume())
    assert stored == 41

    async def sequence():
        async with producer(port) as p:
            client = await p.default_client
            return await client.query_publisher_sequence(stream, "p-restart")

    assert run(sequence()) == 100, "deduplication resumes where it was"
    got = run(consume(port, stream, 100 - (stored + 1),
                      ConsumerOffsetSpecification(OffsetType.OFFSET, stored + 1)))
    assert [o for o, _ in got] == list(range(42, 100))
    assert [b for _, b in got] == bodies[42:]


def test_deduplication_by_publisher_reference(start_berth):
    _, port = start(start_berth)
    stream = unique("sp-dedup")
    run(publish_confirmed(port, stream, [b"a", b"b", b"c"], publisher_name="p1", ids=[1, 2, 3]))
    # 2 and 3 again (a publisher that resends after a reconnection), then 4.
    confirmed, errors = run(publish_confirmed(port, stream, [b"b", b"c", b"d"],
                                              publisher_name="p1", ids=[2, 3, 4]))
    assert not errors and confirmed == {2, 3, 4}, "duplicates are confirmed too"

    async def sequence():
        async with producer(port) as p:
            client = await p.default_client
            return await client.query_publisher_sequence(stream, "p1")

    assert run(sequence()) == 4
    got = run(consume(port, stream, 4, ConsumerOffsetSpecification(OffsetType.FIRST),
                      settle_s=0.3))
    assert [b for _, b in got] == [b"a", b"b", b"c", b"d"]


def test_stream_protocol_to_amqp_0_9_1_and_back(start_berth):
    b, port = start(start_berth)
    stream = unique("sp-interop")

    async def publish_with_properties():
        async with producer(port) as p:
            await p.create_stream(stream)
            await p.send_wait(stream, AMQPMessage(
                body=b"from-stream", application_properties={"colour": "blue"}))

    run(publish_with_properties())
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_publish("", stream, b"from-amqp")
        got = []

        def on_msg(ch_, method, props, body):
            got.append((props.headers, body))
            ch_.basic_ack(method.delivery_tag)

        ch.basic_consume(stream, on_msg, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    finally:
        conn.close()
    assert [body for _, body in got] == [b"from-stream", b"from-amqp"]
    assert got[0][0]["colour"] == "blue"
    assert got[0][0]["x-stream-offset"] == 0

    got = run(consume(port, stream, 2, ConsumerOffsetSpecification(OffsetType.FIRST),
                      whole=True))
    assert [body_of(m) for _, m in got] == [b"from-stream", b"from-amqp"]
    assert got[0][1].application_properties[b"colour"] == b"blue"


def test_unsupported_commands_are_answered_with_a_response_code(start_berth):
    _, port = start(start_berth)

    def frame(key, corr, body=b""):
        payload = struct.pack(">HHI", key, 1, corr) + body
        return struct.pack(">I", len(payload)) + payload

    def string(s):
        return struct.pack(">H", len(s)) + s.encode()

    def read_frame(sock):
        size = struct.unpack(">I", recv_exact(sock, 4))[0]
        return recv_exact(sock, size)

    def recv_exact(sock, n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "closed"
            buf += chunk
        return buf

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(frame(0x0011, 1, struct.pack(">I", 0)))  # peer properties
        assert struct.unpack(">HHIH", read_frame(s)[:10])[3] == 1
        s.sendall(frame(0x0012, 2))  # sasl handshake
        read_frame(s)
        plain = b"\0guest\0guest"
        s.sendall(frame(0x0013, 3, string("PLAIN") + struct.pack(">I", len(plain)) + plain))
        assert struct.unpack(">HHIH", read_frame(s)[:10])[3] == 1
        tune = read_frame(s)
        assert struct.unpack(">HH", tune[:4])[0] == 0x0014
        s.sendall(struct.pack(">IHHII", 12, 0x0014, 1, 1 << 20, 0))
        s.sendall(frame(0x0015, 4, string("/")))  # open
        assert struct.unpack(">HHIH", read_frame(s)[:10])[3] == 1
        # Route (super streams): not served, answered UNKNOWN_FRAME (0x0d).
        s.sendall(frame(0x0018, 5, string("key") + string("super")))
        key, _, corr, code = struct.unpack(">HHIH", read_frame(s)[:10])
        assert (key, corr, code) == (0x8018, 5, 0x0d)
        # The connection is still usable: metadata of a missing stream.
        s.sendall(frame(0x000f, 6, struct.pack(">I", 1) + string("nope")))
        reply = read_frame(s)
        assert struct.unpack(">HHI", reply[:8]) == (0x800f, 1, 6)
        # An unknown key ends the connection with a Close naming it.
        s.sendall(frame(0x0077, 7))
        close = read_frame(s)
        assert struct.unpack(">HHIH", close[:10])[0::3] == (0x0016, 0x0d)


def test_a_wrong_password_is_refused(start_berth):
    _, port = start(start_berth)

    async def login():
        async with Producer("127.0.0.1", port, username="guest", password="nope") as p:
            await p.create_stream(unique("sp-never"))

    with pytest.raises(Exception) as e:
        run(login())
    assert type(e.value).__name__ == "AuthenticationFailure", repr(e.value)
