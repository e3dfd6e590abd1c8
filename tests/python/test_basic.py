"""basic.*: qos, consume, cancel (both directions), publish (mandatory,
properties), get, ack/nack/reject, recover."""

import struct
import time

import pika
import pytest

import amqp_wire as w
from helpers import (channel_error, connection_error, drain, publish_confirmed, unique,
                     wait_until)


def fill(ch, q, n, prefix="m"):
    publish_confirmed(ch, q, [f"{prefix}{i}".encode() for i in range(n)])


class Collector:
    """Consumer callback that records (method, properties, body)."""

    def __init__(self):
        self.got = []

    def __call__(self, _ch, method, props, body):
        self.got.append((method, props, body))

    @property
    def bodies(self):
        return [b for _m, _p, b in self.got]


def settle(conn, seconds=0.3):
    """Lets deliveries arrive: a consumer may not receive more, however long
    we wait, so tests that check a limit wait a bounded, short time."""
    conn.process_data_events(time_limit=seconds)


def settle_at(conn, collector, n):
    """Waits until n deliveries arrived, then a little longer; returns how
    many there are (so `== n` shows no more than n came)."""
    wait_until(lambda: len(collector.got) >= n, timeout_s=5, conn=conn)
    settle(conn)
    return len(collector.got)


# ------------------------------------------------------------------ qos
def test_per_consumer_prefetch_limits_unacked_deliveries(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 10)
    ch.basic_qos(prefetch_count=2)
    c = Collector()
    ch.basic_consume(q, c)
    assert settle_at(conn, c, 2) == 2
    assert c.bodies == [b"m0", b"m1"]
    ch.basic_ack(c.got[0][0].delivery_tag)
    assert settle_at(conn, c, 3) == 3
    assert c.bodies == [b"m0", b"m1", b"m2"]
    ch.basic_ack(c.got[2][0].delivery_tag, multiple=True)
    assert settle_at(conn, c, 5) == 5


def test_per_consumer_prefetch_applies_to_each_consumer(conn):
    ch = conn.channel()
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q1, 10)
    fill(ch, q2, 10)
    ch.basic_qos(prefetch_count=3, global_qos=False)
    c = Collector()
    ch.basic_consume(q1, c)
    ch.basic_consume(q2, c)
    assert settle_at(conn, c, 6) == 6


def test_global_prefetch_is_shared_by_all_consumers_on_the_channel(conn):
    ch = conn.channel()
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q1, 10)
    fill(ch, q2, 10)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    c = Collector()
    ch.basic_consume(q1, c)
    ch.basic_consume(q2, c)
    assert settle_at(conn, c, 3) == 3
    ch.basic_ack(0, multiple=True)
    assert settle_at(conn, c, 6) == 6


def two_queues_with_consumers(conn, qos_calls, expected_total, n=10):
    """Two queues of n messages each, one consumer on each, after the given
    basic.qos calls (prefetch_count, global) in order; returns the
    deliveries per consumer once expected_total arrived and they settle."""
    ch = conn.channel()
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q1, n)
    fill(ch, q2, n)
    for count, is_global in qos_calls:
        ch.basic_qos(prefetch_count=count, global_qos=is_global)
    c = Collector()
    ch.basic_consume(q1, c)
    ch.basic_consume(q2, c)
    settle_at(conn, c, expected_total)
    per_consumer = {}
    for m, _p, _b in c.got:
        per_consumer[m.consumer_tag] = per_consumer.get(m.consumer_tag, 0) + 1
    return sorted(per_consumer.values())


def test_global_and_per_consumer_prefetch_both_apply(conn):
    # Per-consumer 2 first, then the channel-wide 3: 2 + 1 unacked.
    assert two_queues_with_consumers(conn, [(2, False), (3, True)], 3) == [1, 2]


def test_per_consumer_qos_after_global_qos_lifts_the_channel_limit(conn):
    # RabbitMQ 3.10: basic.qos global=false resets the channel-wide limit
    # (rabbit_limiter:unlimit_prefetch), so only the per-consumer 2 applies.
    assert two_queues_with_consumers(conn, [(3, True), (2, False)], 4) == [2, 2]


def test_prefetch_zero_means_unlimited(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 50)
    ch.basic_qos(prefetch_count=0)
    c = Collector()
    ch.basic_consume(q, c)
    assert wait_until(lambda: len(c.got) == 50, timeout_s=5, conn=conn)


def test_no_ack_consumer_ignores_prefetch(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 20)
    ch.basic_qos(prefetch_count=1)
    c = Collector()
    ch.basic_consume(q, c, auto_ack=True)
    assert wait_until(lambda: len(c.got) == 20, timeout_s=5, conn=conn)


def test_basic_get_is_not_limited_by_prefetch(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    ch.basic_qos(prefetch_count=1)
    assert all(ch.basic_get(q)[0] is not None for _ in range(3))


def test_prefetch_size_is_not_implemented_540(conn):
    ch = conn.channel()
    with connection_error(540, 60, 10, text="NOT_IMPLEMENTED - "):
        ch.basic_qos(prefetch_size=10)


# ------------------------------------------------------------------ consume
def test_consumer_receives_messages_in_order_with_delivery_fields(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 5)
    c = Collector()
    tag = ch.basic_consume(q, c)
    assert wait_until(lambda: len(c.got) == 5, conn=conn)
    assert c.bodies == [f"m{i}".encode() for i in range(5)]
    tags = [m.delivery_tag for m, _p, _b in c.got]
    assert tags == sorted(tags) and len(set(tags)) == 5
    m = c.got[0][0]
    assert (m.consumer_tag, m.exchange, m.routing_key, m.redelivered) == (tag, "", q, False)


def test_no_ack_consumer_empties_the_queue(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 10)
    c = Collector()
    ch.basic_consume(q, c, auto_ack=True)
    assert wait_until(lambda: len(c.got) == 10, conn=conn)
    ch2 = conn.channel()
    ok = ch2.queue_declare(q, passive=True).method
    assert ok.message_count == 0


def test_messages_round_robin_between_two_consumers(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    a, b = Collector(), Collector()
    ch.basic_consume(q, a, auto_ack=True)
    ch.basic_consume(q, b, auto_ack=True)
    fill(ch, q, 10)
    assert wait_until(lambda: len(a.got) + len(b.got) == 10, conn=conn)
    assert len(a.got) == 5 and len(b.got) == 5


def test_server_generates_amq_ctag_consumer_tags(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        q = unique("ctag")
        c.queue_declare(1, q, exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        c.basic_consume(1, q)
        tag = c.expect(w.BASIC_CONSUME_OK).args().shortstr()
        assert tag.startswith("amq.ctag-")


def test_duplicate_consumer_tag_closes_connection_530(broker):
    # pika refuses a duplicate tag itself, so this is said on a raw socket.
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        q = unique("dup")
        c.queue_declare(1, q, exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        c.basic_consume(1, q, consumer_tag="dup-tag")
        c.expect(w.BASIC_CONSUME_OK)
        c.basic_consume(1, q, consumer_tag="dup-tag")
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'dup-tag'"
        assert (close.class_id, close.method_id) == w.BASIC_CONSUME


def test_same_consumer_tag_on_two_channels_is_allowed(conn):
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    conn.channel().basic_consume(q, lambda *a: None, consumer_tag="shared-tag")
    conn.channel().basic_consume(q, lambda *a: None, consumer_tag="shared-tag")


def test_exclusive_consumer_blocks_other_consumers_403(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    other = conn.channel()
    with channel_error(403, 60, 20, text=f"ACCESS_REFUSED - queue '{q}' in vhost '/' in "
                       "exclusive use"):
        other.basic_consume(q, lambda *a: None)


def test_exclusive_consume_on_a_queue_with_consumers_is_403(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    with channel_error(403, 60, 20, text="in exclusive use"):
        other.basic_consume(q, lambda *a: None, exclusive=True)


def test_consume_from_missing_queue_is_404(ch):
    q = unique("missing")
    with channel_error(404, 60, 20, text=f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.basic_consume(q, lambda *a: None)


# ------------------------------------------------------------------ cancel
def test_cancel_stops_deliveries_and_keeps_unacked_ackable(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=1)
    c = Collector()
    tag = ch.basic_consume(q, c)
    fill(ch, q, 3)
    assert wait_until(lambda: len(c.got) == 1, conn=conn)
    ch.basic_cancel(tag)
    ch.basic_ack(c.got[0][0].delivery_tag)
    assert settle_at(conn, c, 1) == 1
    assert ch.queue_declare(q, passive=True).method.message_count == 2


def test_cancel_of_unknown_consumer_tag_is_ok(ch):
    ch.basic_cancel(unique("no-such-consumer"))


def test_deleting_a_queue_sends_basic_cancel_to_its_consumers(conns):
    conn = conns.open()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    assert wait_until(lambda: cancelled, conn=conn) == [tag]
    assert ch.is_open  # a cancel notification does not close the channel


QUEUE_KINDS = {"plain": {}, "exclusive": {"exclusive": True}, "auto-delete": {"auto_delete": True}}


def consumed_queue(c, kind):
    """Raw connection `c` (with consumer_cancel_notify) consumes from a new
    queue of the given kind on channel 1, as consumer "ctag"."""
    q = unique("delete-consumed")
    c.queue_declare(1, q, **QUEUE_KINDS[kind])
    c.expect(w.QUEUE_DECLARE_OK)
    c.basic_consume(1, q, consumer_tag="ctag")
    c.expect(w.BASIC_CONSUME_OK)
    return q


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_queue_delete_on_the_consumers_channel_sends_delete_ok_then_basic_cancel(broker, kind):
    # RabbitMQ 3.10 answers queue.delete before it tells the channel's own
    # consumer: delete-ok, then basic.cancel. Clients rely on it: amqplib
    # takes the first reply-like method as the answer to its pending RPC,
    # and a program that closes its channel on the cancel would otherwise
    # lose the delete-ok.
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake(capabilities={"consumer_cancel_notify": True})
        c.channel_open(1)
        q = consumed_queue(c, kind)
        c.queue_delete(1, q)
        first, second = c.recv_method(), c.recv_method()
        assert [(first.channel, first.method_ids), (second.channel, second.method_ids)] == \
            [(1, w.QUEUE_DELETE_OK), (1, w.BASIC_CANCEL)]
        assert first.args().long() == 0  # message_count
        assert second.args().shortstr() == "ctag"
        c.queue_declare(1, unique("after-delete"), exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_queue_delete_on_another_channel_sends_delete_ok_there_and_basic_cancel_to_the_consumer(broker, kind):
    # Across channels RabbitMQ fixes no order (both orders were seen).
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake(capabilities={"consumer_cancel_notify": True})
        c.channel_open(1)
        c.channel_open(2)
        q = consumed_queue(c, kind)
        c.queue_delete(2, q)
        got = {(f.channel, f.method_ids) for f in (c.recv_method(), c.recv_method())}
        assert got == {(2, w.QUEUE_DELETE_OK), (1, w.BASIC_CANCEL)}
        for channel in (1, 2):
            c.queue_declare(channel, unique("after-delete"), exclusive=True)
            c.expect(w.QUEUE_DECLARE_OK)


def test_deleting_a_queue_cancels_consumers_on_other_connections(conns, names):
    owner = conns.open()
    q = names.queue()
    ch = owner.channel()
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    conns.open().channel().queue_delete(q)
    assert wait_until(lambda: cancelled, conn=owner) == [tag]


# ------------------------------------------------------------------ publish
def test_mandatory_unroutable_message_is_returned_312_no_route(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _c, m, p, b: returned.append((m, p, b)))
    key = unique("nowhere")
    props = pika.BasicProperties(content_type="text/plain", headers={"k": "v"})
    ch.basic_publish("amq.direct", key, b"bounce", props, mandatory=True)
    assert wait_until(lambda: returned, conn=conn)
    method, p, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", key)
    assert body == b"bounce"
    assert p.content_type == "text/plain" and p.headers == {"k": "v"}


def test_mandatory_routable_message_is_delivered_not_returned(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"ok", mandatory=True)
    assert drain(ch, q) == [b"ok"]
    settle(conn, 0.2)
    assert returned == []


def test_non_mandatory_unroutable_message_is_dropped_silently(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("amq.direct", unique("nowhere"), b"gone")
    ch.queue_declare("", exclusive=True)  # round trip
    settle(conn, 0.2)
    assert returned == [] and ch.is_open


def test_mandatory_return_comes_before_the_confirm(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        c.confirm_select(1)
        c.basic_publish(1, "amq.direct", unique("nowhere"), b"x", mandatory=True)
        f = c.expect(w.BASIC_RETURN)
        r = f.args()
        assert (r.short(), r.shortstr()) == (312, "NO_ROUTE")
        assert c.recv_frame().type == w.FRAME_HEADER
        assert c.recv_frame().payload == b"x"
        ack = c.expect(w.BASIC_ACK).args()
        assert ack.longlong() == 1


def test_publish_to_missing_exchange_closes_channel_404(ch):
    x = unique("missing")
    with channel_error(404, 60, 40, text=f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.basic_publish(x, "k", b"x")
        ch.queue_declare("", exclusive=True)


def test_publish_immediate_is_not_implemented_540(broker):
    with w.RawConnection(broker.host, broker.port) as c:
        c.handshake()
        c.channel_open(1)
        c.send(w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("")
                              + w.shortstr("k") + bytes([0b10]))
               + w.content_frames(1, b"x"))
        close = c.expect_connection_close()
        assert close.reply_code == 540
        assert close.reply_text == "NOT_IMPLEMENTED - immediate=true"
        assert (close.class_id, close.method_id) == w.BASIC_PUBLISH


def test_properties_and_headers_round_trip(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    headers = {"str": "s", "int": 42, "neg": -7, "bool": True, "list": ["a", 1],
               "nested": {"x": "y"}, "bytes": b"\x00\x01"}
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip", headers=headers,
        delivery_mode=2, priority=3, correlation_id="corr", reply_to="reply",
        message_id="mid", timestamp=1700000000, type="kind", app_id="app", user_id="guest")
    ch.basic_publish("", q, b"{}", props)
    _m, got, body = ch.basic_get(q, auto_ack=True)
    assert body == b"{}"
    for field in ("content_type", "content_encoding", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "message_id", "timestamp", "type", "app_id",
                  "user_id"):
        assert getattr(got, field) == getattr(props, field), field
    assert got.headers == headers


def test_user_id_other_than_the_login_is_406(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    with channel_error(406, 60, 40, text="PRECONDITION_FAILED - user_id property set to 'bob' "
                       "but authenticated user was 'guest'"):
        ch.basic_publish("", q, b"x", pika.BasicProperties(user_id="bob"))
        ch.queue_declare(q, passive=True)


def test_empty_body_is_delivered(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"")
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert method is not None and body == b""


# ------------------------------------------------------------------ get
def test_get_on_empty_queue_is_get_empty(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    assert ch.basic_get(q) == (None, None, None)


def test_get_ok_reports_remaining_message_count(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    counts = [ch.basic_get(q, auto_ack=True)[0].message_count for _ in range(3)]
    assert counts == [2, 1, 0]


def test_get_ok_carries_exchange_and_routing_key(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", "rk")
    ch.basic_publish("amq.direct", "rk", b"x")
    method, _p, _b = ch.basic_get(q, auto_ack=True)
    assert (method.exchange, method.routing_key, method.redelivered) == ("amq.direct", "rk", False)


def test_get_from_missing_queue_is_404(ch):
    q = unique("missing")
    with channel_error(404, 60, 70, text=f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.basic_get(q)


# ------------------------------------------------------------------ ack / nack / reject
def test_ack_multiple_acks_everything_up_to_the_tag(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 4)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(4)]
    ch.basic_ack(tags[2], multiple=True)
    ch.close()  # requeues what is still unacked: only the fourth
    ch = conn.channel()
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"m3", True, 0)


def test_nack_multiple_with_requeue_redelivers_in_original_order(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    ch.basic_get(q)
    second = ch.basic_get(q)[0]
    ch.basic_nack(second.delivery_tag, multiple=True, requeue=True)
    got = [(m.redelivered, b) for m, _p, b in (ch.basic_get(q, auto_ack=True) for _ in range(3))]
    assert got == [(True, b"m0"), (True, b"m1"), (False, b"m2")]


def test_nack_without_requeue_drops_the_message(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 2)
    m = ch.basic_get(q)[0]
    ch.basic_nack(m.delivery_tag, requeue=False)
    assert drain(ch, q) == [b"m1"]


def test_reject_with_requeue_redelivers_with_redelivered_flag(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"again")
    m = ch.basic_get(q)[0]
    assert m.redelivered is False
    ch.basic_reject(m.delivery_tag, requeue=True)
    m2, _p, body = ch.basic_get(q)
    assert body == b"again" and m2.redelivered is True
    assert m2.delivery_tag != m.delivery_tag


def test_reject_without_requeue_drops_the_message(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"gone")
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert drain(ch, q) == []


def test_consumer_nack_requeue_redelivers_to_a_consumer(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    seen = []

    def on_message(chan, method, _props, body):
        seen.append((method.redelivered, body))
        if len(seen) == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    ch.basic_publish("", q, b"x")
    assert wait_until(lambda: len(seen) == 2, conn=conn)
    assert seen == [(False, b"x"), (True, b"x")]


@pytest.mark.parametrize("op,ids", [("ack", (60, 80)), ("nack", (60, 120)), ("reject", (60, 90))])
def test_unknown_delivery_tag_closes_channel_406(ch, op, ids):
    with channel_error(406, *ids, text="PRECONDITION_FAILED - unknown delivery tag 99"):
        getattr(ch, f"basic_{op}")(99)
        ch.queue_declare("", exclusive=True)


def test_double_ack_closes_channel_406(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    tag = ch.basic_get(q)[0].delivery_tag
    ch.basic_ack(tag)
    with channel_error(406, 60, 80, text=f"unknown delivery tag {tag}"):
        ch.basic_ack(tag)
        ch.queue_declare(q, passive=True)


def test_ack_of_a_no_ack_delivery_closes_channel_406(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    tag = ch.basic_get(q, auto_ack=True)[0].delivery_tag
    with channel_error(406, 60, 80):
        ch.basic_ack(tag)
        ch.queue_declare(q, passive=True)


def test_ack_on_another_channel_closes_that_channel_406(conn):
    a, b = conn.channel(), conn.channel()
    q = a.queue_declare("", exclusive=True).method.queue
    a.basic_publish("", q, b"x")
    tag = a.basic_get(q)[0].delivery_tag
    with channel_error(406, 60, 80):
        b.basic_ack(tag)
        b.queue_declare(q, passive=True)
    a.basic_ack(tag)
    a.queue_declare(q, passive=True)


def test_ack_zero_multiple_with_nothing_outstanding_is_ok(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_ack(0, multiple=True)
    ch.queue_declare(q, passive=True)


def test_ack_zero_multiple_acks_all_outstanding(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    for _ in range(3):
        ch.basic_get(q)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert conn.channel().queue_declare(q, passive=True).method.message_count == 0


# ------------------------------------------------------------------ recover
def test_recover_requeue_redelivers_unacked_with_redelivered_flag(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    c = Collector()
    ch.basic_consume(q, c)
    fill(ch, q, 3)
    assert wait_until(lambda: len(c.got) == 3, conn=conn)
    ch.basic_recover(requeue=True)
    assert wait_until(lambda: len(c.got) == 6, conn=conn)
    assert [(m.redelivered, b) for m, _p, b in c.got[3:]] == \
        [(True, b"m0"), (True, b"m1"), (True, b"m2")]
    first_tags = {m.delivery_tag for m, _p, _b in c.got[:3]}
    assert first_tags.isdisjoint(m.delivery_tag for m, _p, _b in c.got[3:])


def test_recover_without_requeue_is_not_implemented_540(conn):
    ch = conn.channel()
    with connection_error(540, 60, 110, text="NOT_IMPLEMENTED - requeue=false"):
        ch.basic_recover(requeue=False)


def test_old_delivery_tags_are_invalid_after_recover(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    tag = ch.basic_get(q)[0].delivery_tag
    ch.basic_recover(requeue=True)
    time.sleep(0.1)
    with channel_error(406, 60, 80):
        ch.basic_ack(tag)
        ch.queue_declare(q, passive=True)
