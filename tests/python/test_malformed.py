"""Malformed input on raw sockets: each case gets the right reply (or a
closed socket), and a second connection that was already open carries on."""

import struct

import pytest

import amqp_wire as w
from helpers import unique


@pytest.fixture
def bystander(broker):
    """An open connection with a channel and a queue, checked after the
    malformed connection is gone."""
    c = w.RawConnection(broker.host, broker.port)
    c.handshake()
    c.channel_open(1)
    q = unique("bystander")
    c.queue_declare(1, q, exclusive=True)
    c.expect(w.QUEUE_DECLARE_OK)

    def still_works():
        body = b"still here " + q.encode()
        c.basic_publish(1, "", q, body)
        c.basic_get(1, q)
        c.expect(w.BASIC_GET_OK)
        assert c.recv_frame().type == w.FRAME_HEADER
        assert c.recv_frame().payload == body

    c.still_works = still_works
    yield c
    c.close()


def handshaken(broker, **kw):
    c = w.RawConnection(broker.host, broker.port)
    c.handshake(**kw)
    return c


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",        # 0-9 (not 0-9-1)
    b"AMQP\x01\x01\x00\x0a",        # 0-10
    b"AMQP\x00\x01\x00\x00",        # 1-0
    b"GET / HTTP/1.1\r\n\r\n",      # not AMQP at all
])
def test_bad_protocol_header_is_answered_with_0_9_1_header_and_closed(broker, bystander, header):
    with w.RawConnection(broker.host, broker.port) as c:
        c.send(header)
        assert c.recv_raw(8) == w.PROTOCOL_HEADER
        assert c.wait_closed()
    bystander.still_works()


def test_oversized_frame_closes_connection_501(broker, bystander):
    with handshaken(broker) as c:
        c.channel_open(1)
        size = 200_000  # frame_max is 131072
        c.send(struct.pack(">BHI", w.FRAME_METHOD, 1, size) + b"\x00" * size + b"\xce")
        close = c.expect_connection_close()
        assert close.reply_code == 501
        assert close.reply_text.startswith("FRAME_ERROR - ")
        assert c.wait_closed()
    bystander.still_works()


def test_oversized_frame_is_refused_from_its_header_alone(broker, bystander):
    # Only the 7-octet header is sent: the server must not wait for (or
    # buffer) the 100 MB it announces before refusing.
    with handshaken(broker) as c:
        c.channel_open(1)
        c.send(struct.pack(">BHI", w.FRAME_BODY, 1, 100_000_000))
        close = c.expect_connection_close()
        assert close.reply_code == 501
        assert c.wait_closed()
    bystander.still_works()


def test_frame_above_a_client_lowered_frame_max_is_501(broker, bystander):
    with handshaken(broker, frame_max=4096) as c:
        c.channel_open(1)
        c.send(w.frame(w.FRAME_METHOD, 1, struct.pack(">HH", 50, 10) + b"\x00" * 5000))
        close = c.expect_connection_close()
        assert close.reply_code == 501
    bystander.still_works()


def test_method_on_unopened_channel_closes_connection_504(broker, bystander):
    with handshaken(broker) as c:
        c.queue_declare(5, unique("never"))
        close = c.expect_connection_close()
        assert close.reply_code == 504
        assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"
        assert (close.class_id, close.method_id) == w.QUEUE_DECLARE
        assert c.wait_closed()
    bystander.still_works()


def test_wrong_frame_end_byte_closes_connection_501(broker, bystander):
    with handshaken(broker) as c:
        c.send(w.method_frame(1, w.CHANNEL_OPEN, w.shortstr(""))[:-1] + b"\x00")
        close = c.expect_connection_close()
        assert close.reply_code == 501
        assert close.reply_text.startswith("FRAME_ERROR - ")
        assert c.wait_closed()
    bystander.still_works()


def test_wrong_frame_end_during_handshake_ends_connection(broker, bystander):
    with w.RawConnection(broker.host, broker.port) as c:
        c.start()
        bad = w.method_frame(0, w.CONNECTION_START_OK, w.table({}) + w.shortstr("PLAIN")
                             + w.longstr(b"\x00guest\x00guest") + w.shortstr("en_US"))
        c.send(bad[:-1] + b"\xff")
        try:
            close = c.expect_connection_close()
            assert close.reply_code == 501
        except w.PeerClosed:
            pass
        assert c.wait_closed()
    bystander.still_works()


def test_unknown_frame_type_closes_connection_501(broker, bystander):
    with handshaken(broker) as c:
        c.send(w.frame(7, 0, b"abc"))
        close = c.expect_connection_close()
        assert close.reply_code == 501
    bystander.still_works()


@pytest.mark.parametrize("frame_type", [w.FRAME_HEADER, w.FRAME_BODY])
def test_content_frame_without_a_method_closes_connection_505(broker, bystander, frame_type):
    with handshaken(broker) as c:
        c.channel_open(1)
        payload = struct.pack(">HHQ", 60, 0, 3) + b"\x00\x00" if frame_type == w.FRAME_HEADER \
            else b"abc"
        c.send(w.frame(frame_type, 1, payload))
        close = c.expect_connection_close()
        assert close.reply_code == 505
        assert close.reply_text.startswith("UNEXPECTED_FRAME - ")
    bystander.still_works()


def test_method_frame_in_the_middle_of_content_closes_connection_505(broker, bystander):
    with handshaken(broker) as c:
        c.channel_open(1)
        c.send(w.method_frame(1, w.BASIC_PUBLISH, b"\x00\x00" + w.shortstr("")
                              + w.shortstr("k") + b"\x00"))
        c.send(w.frame(w.FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 3) + b"\x00\x00"))
        c.send(w.method_frame(1, w.CHANNEL_OPEN, w.shortstr("")))
        close = c.expect_connection_close()
        assert close.reply_code == 505
        assert (close.class_id, close.method_id) == w.BASIC_PUBLISH
    bystander.still_works()


def test_heartbeat_frame_on_a_channel_closes_connection_505(broker, bystander):
    with handshaken(broker) as c:
        c.channel_open(1)
        c.send(w.frame(w.FRAME_HEARTBEAT, 1, b""))
        close = c.expect_connection_close()
        assert close.reply_code == 505
    bystander.still_works()


def test_truncated_method_arguments_close_connection(broker, bystander):
    with handshaken(broker) as c:
        c.channel_open(1)
        # queue.declare whose queue name claims 5 octets but has 2
        c.send(w.method_frame(1, w.QUEUE_DECLARE, b"\x00\x00\x05ab"))
        close = c.expect_connection_close()
        assert close.reply_code in (501, 502)  # RabbitMQ: 501 FRAME_ERROR
        assert (close.class_id, close.method_id) == w.QUEUE_DECLARE
    bystander.still_works()


@pytest.mark.parametrize("ids", [(99, 10), (50, 99)])
def test_unknown_class_or_method_ends_the_connection(broker, bystander, ids):
    # RabbitMQ 3.10 drops the socket; a close with 503 or 540 is as good.
    with handshaken(broker) as c:
        c.channel_open(1)
        c.send(w.method_frame(1, ids))
        try:
            close = c.expect_connection_close()
            assert close.reply_code in (503, 540), close
        except w.PeerClosed:
            pass
        assert c.wait_closed()
    bystander.still_works()


def test_method_before_connection_open_closes_connection_505(broker, bystander):
    with w.RawConnection(broker.host, broker.port) as c:
        c.start()
        c.start_ok()
        c.tune_ok(heartbeat=0)
        c.send(w.method_frame(1, w.CHANNEL_OPEN, w.shortstr("")))
        close = c.expect_connection_close()
        assert close.reply_code in (504, 505)  # RabbitMQ: 505 UNEXPECTED_FRAME
    bystander.still_works()


def test_garbage_after_handshake_ends_connection_and_others_survive(broker, bystander):
    with handshaken(broker) as c:
        c.send(b"\xde\xad\xbe\xef" * 64)
        try:
            close = c.expect_connection_close()
            assert close.reply_code == 501
        except w.PeerClosed:
            pass
        assert c.wait_closed()
    bystander.still_works()


def test_peer_vanishing_mid_frame_does_not_disturb_others(broker, bystander):
    c = handshaken(broker)
    c.channel_open(1)
    c.send(struct.pack(">BHI", w.FRAME_METHOD, 1, 1000) + b"\x00" * 10)
    c.close()
    bystander.still_works()
