"""tx.* (select/commit/rollback) and confirm.select (publisher confirms)."""

import struct

import pika
import pika.exceptions
import pytest

import amqp_wire as w
from helpers import channel_error, drain, unique


# ------------------------------------------------------------------ tx
def test_tx_publishes_are_invisible_until_commit(conn):
    tx = conn.channel()
    tx.tx_select()
    q = tx.queue_declare("", exclusive=True).method.queue
    tx.basic_publish("", q, b"a")
    tx.basic_publish("", q, b"b")
    reader = conn.channel()
    assert drain(reader, q) == []
    tx.tx_commit()
    assert drain(reader, q) == [b"a", b"b"]


def test_tx_rollback_discards_publishes(conn):
    tx = conn.channel()
    tx.tx_select()
    q = tx.queue_declare("", exclusive=True).method.queue
    tx.basic_publish("", q, b"discarded")
    tx.tx_rollback()
    tx.basic_publish("", q, b"kept")
    tx.tx_commit()
    assert drain(conn.channel(), q) == [b"kept"]


def test_tx_acks_take_effect_at_commit(conn):
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.basic_publish("", q, b"m")
    tx = conn.channel()
    tx.tx_select()
    tag = tx.basic_get(q)[0].delivery_tag
    tx.basic_ack(tag)
    tx.tx_rollback()  # the ack is forgotten: the message is still unacked
    tx.basic_ack(tag)
    tx.tx_commit()
    tx.close()
    assert drain(conn.channel(), q) == []


def test_tx_rolled_back_ack_leaves_message_unacked(conn):
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.basic_publish("", q, b"m")
    tx = conn.channel()
    tx.tx_select()
    tag = tx.basic_get(q)[0].delivery_tag
    tx.basic_ack(tag)
    tx.tx_rollback()
    tx.close()  # unacked: requeued
    method, _p, body = conn.channel().basic_get(q, auto_ack=True)
    assert body == b"m" and method.redelivered is True


def test_tx_select_twice_is_ok(ch):
    ch.tx_select()
    ch.tx_select()
    ch.tx_commit()


def test_tx_commit_without_select_is_406(ch):
    with channel_error(406, 90, 20, text="PRECONDITION_FAILED - channel is not transactional"):
        ch.tx_commit()


def test_tx_rollback_without_select_is_406(ch):
    with channel_error(406, 90, 30, text="PRECONDITION_FAILED - channel is not transactional"):
        ch.tx_rollback()


def test_confirm_select_on_a_tx_channel_is_406(ch):
    ch.tx_select()
    with channel_error(406, 85, 10, text="PRECONDITION_FAILED - cannot switch from tx to "
                       "confirm mode"):
        ch.confirm_delivery()


def test_tx_select_on_a_confirm_channel_is_406(ch):
    ch.confirm_delivery()
    with channel_error(406, 90, 10, text="PRECONDITION_FAILED - cannot switch from confirm to "
                       "tx mode"):
        ch.tx_select()


def test_tx_mandatory_unroutable_is_returned_at_commit(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _c, m, _p, b: returned.append((m.reply_code, b)))
    ch.tx_select()
    ch.basic_publish("amq.direct", unique("nowhere"), b"r", mandatory=True)
    ch.tx_commit()
    conn.process_data_events(0.2)
    assert returned == [(312, b"r")]


# ------------------------------------------------------------------ confirms
def test_confirmed_publish_returns_after_ack(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())  # raises unless acked
    assert ch.queue_declare(q, passive=True).method.message_count == 20


def test_confirm_of_an_unroutable_message_is_an_ack(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", unique("nowhere"), b"x")  # no exception: acked


def test_confirmed_mandatory_unroutable_raises_unroutable(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("amq.direct", unique("nowhere"), b"x", mandatory=True)
    assert info.value.messages[0].method.reply_code == 312


def test_confirms_cover_every_publish_in_order_with_multiple_batches(broker):
    n = 500
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        q = unique("confirms")
        c.queue_declare(1, q, exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        c.confirm_select(1)
        c.send(b"".join(
            w.method_frame(1, w.BASIC_PUBLISH, b"\x00\x00" + w.shortstr("") + w.shortstr(q)
                           + b"\x00") + w.content_frames(1, b"x") for _ in range(n)))
        confirmed, last, acks = set(), 0, []
        while last < n:
            f = c.recv_method()
            assert f.method_ids == w.BASIC_ACK, f.method_ids
            r = f.args()
            tag, multiple = r.longlong(), r.octet() & 1
            assert tag > last, "confirms must move forward"
            acks.append((tag, multiple))
            confirmed.update(range(last + 1, tag + 1) if multiple else [tag])
            last = tag
        assert confirmed == set(range(1, n + 1))


def test_confirm_delivery_tags_count_per_channel(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        for ch in (1, 2):
            c.channel_open(ch)
            c.confirm_select(ch)
        c.basic_publish(1, "amq.direct", unique("k"), b"x")
        c.basic_publish(2, "amq.direct", unique("k"), b"x")
        c.basic_publish(1, "amq.direct", unique("k"), b"x")
        confirmed = {1: set(), 2: set()}
        while confirmed != {1: {1, 2}, 2: {1}}:
            f = c.expect(w.BASIC_ACK)
            r = f.args()
            tag, multiple = r.longlong(), r.octet() & 1
            assert f.channel in (1, 2) and tag <= (2 if f.channel == 1 else 1), (f.channel, tag)
            confirmed[f.channel].update(range(1, tag + 1) if multiple else [tag])


def test_reject_publish_overflow_nacks_with_confirms(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True, arguments={
        "x-max-length": 1, "x-overflow": "reject-publish"}).method.queue
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"refused")
    assert drain(ch, q) == [b"fits"]


def test_persistent_message_to_durable_queue_is_confirmed(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"durable", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_closing_a_channel_with_confirms_in_flight_never_stalls_the_connection(broker):
    # Publishes and channel.close go out in one write, so the channel is
    # gone before the store confirms its messages. Those late completions
    # must not count against the connection for ever: 70 rounds of 1,000
    # pass its limit of 65,536 publishes waiting for the store, after which
    # a leaking broker stops reading the connection.
    q = unique("close-in-flight")
    persistent = b"\x10\x00\x02"  # property flags: delivery-mode; mode 2
    with w.RawConnection(broker.host, broker.port, timeout_s=30) as c:
        c.handshake()
        c.channel_open(1)
        c.send(w.method_frame(1, w.QUEUE_DECLARE, struct.pack(">H", 0) + w.shortstr(q)
                              + bytes([0b10]) + w.table({})))  # durable
        c.expect(w.QUEUE_DECLARE_OK)
        publish = (w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("")
                                  + w.shortstr(q) + b"\x00")
                   + w.content_frames(1, b"x", c.frame_max, properties=persistent))
        for _ in range(70):
            c.confirm_select(1)
            c.send(publish * 1000 + w.method_frame(1, w.CHANNEL_CLOSE, struct.pack(">H", 200)
                                                   + w.shortstr("done") + struct.pack(">HH", 0, 0)))
            while c.recv_method(timeout_s=10).method_ids != w.CHANNEL_CLOSE_OK:
                pass  # confirms that made it before the close
            c.channel_open(1)
        c.confirm_select(1)
        c.send(publish)
        c.expect(w.BASIC_ACK, timeout_s=10)
        c.send(w.method_frame(1, (50, 40), struct.pack(">H", 0) + w.shortstr(q) + b"\x00"))
        c.expect((50, 41))
