"""Sizes and liveness: large bodies over many frames, the message size
limit, heartbeats (a silent peer is disconnected)."""

import hashlib
import os
import time

import pytest

import amqp_wire as w
from helpers import channel_error, wait_until


@pytest.mark.parametrize("size", [131072 - 8, 131072, 1 << 20, 10 << 20])
def test_large_body_round_trips_through_get(ch, size):
    body = os.urandom(size)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, body)
    _m, _p, got = ch.basic_get(q, auto_ack=True)
    assert len(got) == size and hashlib.sha256(got).digest() == hashlib.sha256(body).digest()


def test_large_bodies_round_trip_through_a_consumer(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    bodies = [os.urandom(n) for n in (1 << 20, 3 << 20, 5)]
    for b in bodies:
        ch.basic_publish("", q, b)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    assert wait_until(lambda: len(got) == 3, timeout_s=20, conn=conn)
    assert got == bodies


def test_large_body_with_small_frame_max(broker, conns):
    conn = conns.open(frame_max=4096)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = os.urandom(1 << 20)  # 257 body frames each way
    ch.basic_publish("", q, body)
    assert ch.basic_get(q, auto_ack=True)[2] == body


def test_message_larger_than_the_configured_maximum_is_406(start_berth):
    b = start_berth("--message-size-bytes-max", 1 << 20)
    conn = b.connect()
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x" * (1 << 20))  # exactly the limit: accepted
        assert len(ch.basic_get(q, auto_ack=True)[2]) == 1 << 20
        with channel_error(406, 60, 40, text="PRECONDITION_FAILED - message size "):
            ch.basic_publish("", q, b"x" * ((1 << 20) + 1))
            ch.queue_declare(q, passive=True)
        assert conn.is_open
        ch2 = conn.channel()
        assert ch2.queue_declare(q, passive=True).method.message_count == 0
    finally:
        conn.close()


def test_silent_client_with_heartbeat_1s_is_disconnected(broker):
    # The client asks for a 1 s heartbeat in tune-ok, then says nothing.
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake(heartbeat=1)
        start = time.monotonic()
        heartbeats = 0
        with pytest.raises(w.PeerClosed):
            while time.monotonic() - start < 15:
                f = c.recv_frame(timeout_s=15)
                if f.type == w.FRAME_HEARTBEAT:
                    assert f.channel == 0
                    heartbeats += 1
        elapsed = time.monotonic() - start
        assert 1.0 <= elapsed <= 10, elapsed
        assert heartbeats >= 1, "the server sent no heartbeat while waiting"


def test_client_that_keeps_sending_heartbeats_stays_connected(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake(heartbeat=1)
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            c.heartbeat()
            try:
                c.recv_frame(timeout_s=0.4)
            except TimeoutError:
                pass
        c.channel_open(1)  # still alive


def test_pika_with_short_heartbeat_survives_idle_time(broker, conns):
    conn = conns.open(heartbeat=1)
    conn.sleep(3.5)  # pika answers heartbeats while it sleeps
    assert conn.is_open
    conn.channel().queue_declare("", exclusive=True)


def test_server_heartbeat_flag_disconnects_a_silent_client(start_berth):
    b = start_berth("--heartbeat-s", 1)
    with w.RawConnection(b.host, b.port) as c:
        c.start()
        c.start_ok()
        assert c.tune_ok()[2] == 1  # accept the server's proposal
        c.open()
        c.expect(w.CONNECTION_OPEN_OK)
        start = time.monotonic()
        assert c.wait_closed(timeout_s=10)
        assert time.monotonic() - start >= 1.0


def test_heartbeat_zero_disables_the_timeout(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake(heartbeat=0)
        assert not c.wait_closed(timeout_s=3)
        c.channel_open(1)
