"""channel.*: open/close/flow, channel numbers, many channels."""

import struct

import pika.exceptions
import pytest

import amqp_wire as w
from helpers import channel_error, connection_error, unique


def test_channels_open_and_close_independently(conn):
    a, b = conn.channel(), conn.channel()
    q = a.queue_declare("", exclusive=True).method.queue
    a.close()
    assert a.is_closed and b.is_open
    b.basic_publish("", q, b"still here")
    assert b.basic_get(q, auto_ack=True)[2] == b"still here"


def test_channel_error_closes_only_that_channel(conn):
    good, bad = conn.channel(), conn.channel()
    with channel_error(404):
        bad.queue_declare(unique("missing"), passive=True)
    assert bad.is_closed and good.is_open and conn.is_open
    assert good.queue_declare("", exclusive=True).method.queue


def test_closed_channel_number_can_be_opened_again(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        c.send(w.method_frame(1, w.CHANNEL_CLOSE,
                              b"\x00\xc8" + w.shortstr("done") + b"\x00\x00\x00\x00"))
        c.expect(w.CHANNEL_CLOSE_OK)
        c.channel_open(1)
        c.queue_declare(1, unique("reopen"), exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)


def test_crossing_channel_close_leaves_the_other_channels_working(broker):
    # The client closes channel 1 just as the broker closes it with an
    # exception, so the two channel.close cross on the wire. Each side
    # answers the other's close with close-ok; the broker frees the number
    # only at the client's close-ok (RabbitMQ 3.10), which is therefore no
    # frame "on an unopened channel", and the connection's other channels
    # carry on.
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        c.channel_open(2)
        c.send(w.method_frame(1, w.QUEUE_DECLARE, struct.pack(">H", 0)
                              + w.shortstr(unique("missing")) + b"\x01" + w.table({}))
               + w.close_frame(1, w.CHANNEL_CLOSE))
        close = c.expect(w.CHANNEL_CLOSE)
        assert close.channel == 1 and w.parse_close(close).reply_code == 404
        assert c.expect(w.CHANNEL_CLOSE_OK).channel == 1
        c.send(w.method_frame(1, w.CHANNEL_CLOSE_OK))
        c.queue_declare(2, unique("other-channel"), exclusive=True)
        assert c.expect(w.QUEUE_DECLARE_OK).channel == 2
        c.channel_open(1)
        c.queue_declare(1, unique("reopened"), exclusive=True)
        assert c.expect(w.QUEUE_DECLARE_OK).channel == 1


def test_second_channel_open_on_an_open_channel_closes_connection_504(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        c.send(w.method_frame(1, w.CHANNEL_OPEN, w.shortstr("")))
        close = c.expect_connection_close()
        assert close.reply_code == 504
        assert close.reply_text.startswith("CHANNEL_ERROR - ")
        assert (close.class_id, close.method_id) == w.CHANNEL_OPEN


def test_channel_flow_active_true_is_confirmed(conn):
    assert conn.channel().flow(True) is True


def test_channel_flow_active_false_is_not_implemented_540(conn):
    ch = conn.channel()
    with connection_error(540, 20, 20, text="NOT_IMPLEMENTED - "):
        ch.flow(False)


def test_many_channels_on_one_connection_work_concurrently(conn):
    channels = [conn.channel() for _ in range(300)]
    assert len({c.channel_number for c in channels}) == 300
    q = channels[0].queue_declare("", exclusive=True).method.queue
    for i, c in enumerate(channels):
        c.basic_publish("", q, str(i).encode())
    got = set()
    for c in channels:
        method, _props, body = c.basic_get(q, auto_ack=True)
        assert method is not None
        got.add(int(body))
    assert got == set(range(300))
    for c in channels[::2]:
        c.close()
    for c in channels[1::2]:
        assert c.is_open
        c.queue_declare(q, passive=True)


def test_channel_close_requeues_unacked_messages_as_redelivered(conn):
    a = conn.channel()
    q = a.queue_declare("", exclusive=True).method.queue
    a.basic_publish("", q, b"one")
    method, _p, _b = a.basic_get(q)
    assert method.redelivered is False
    a.close()
    b = conn.channel()
    method, _p, body = b.basic_get(q)
    assert body == b"one" and method.redelivered is True


def test_use_of_a_channel_after_the_broker_closed_it_is_refused_locally(conn):
    ch = conn.channel()
    with channel_error(404):
        ch.queue_declare(unique("missing"), passive=True)
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        ch.queue_declare("", exclusive=True)
