"""connection.*: authentication, vhosts, tune negotiation, server
properties, blocked/unblocked, update-secret."""

import time

import pika
import pika.exceptions
import pytest

import amqp_wire as w
from helpers import unique, wait_until

REQUIRED_CAPABILITIES = [
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack",
    "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
    "per_consumer_qos",
]


def raw(broker):
    return w.RawConnection(broker.host, broker.port)


def test_plain_login_opens_a_working_connection(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hello")
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hello"


def test_server_properties_name_product_version_platform(conn):
    props = conn._impl.server_properties
    for key in ("product", "version", "platform"):
        assert isinstance(props.get(key), str) and props[key], (key, props)


def test_server_capabilities_advertise_the_rabbitmq_extensions(conn):
    caps = conn._impl.server_properties["capabilities"]
    for cap in REQUIRED_CAPABILITIES:
        assert caps.get(cap) is True, (cap, caps)


def test_connection_start_offers_plain_and_amqplain_over_0_9(broker):
    with raw(broker) as c:
        c.start()
        assert c.version == (0, 9)
        assert "PLAIN" in c.mechanisms and "AMQPLAIN" in c.mechanisms
        assert "en_US" in c.locales
        assert c.server_properties["capabilities"]["publisher_confirms"] is True


def test_amqplain_login_opens_connection(broker):
    with raw(broker) as c:
        c.handshake(mechanism="AMQPLAIN")
        c.channel_open(1)
        q = unique("amqplain")
        c.queue_declare(1, q, exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_bad_password_is_refused_403_access_refused(broker, mechanism):
    with raw(broker) as c:
        c.start()
        c.start_ok("guest", "not-the-password", mechanism)
        close = c.expect_connection_close()
        assert close.reply_code == 403
        assert close.reply_text.startswith("ACCESS_REFUSED - ")
        assert mechanism in close.reply_text
        assert (close.class_id, close.method_id) == (0, 0)
        assert c.wait_closed()


def test_unknown_user_is_refused_403(broker):
    with raw(broker) as c:
        c.start()
        c.start_ok(unique("nobody"), "guest")
        close = c.expect_connection_close()
        assert close.reply_code == 403


def test_bad_password_surfaces_in_pika_as_authentication_error(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        broker.connect(credentials=pika.PlainCredentials("guest", "wrong"))
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)


def test_unknown_mechanism_is_refused(broker):
    with raw(broker) as c:
        c.start()
        c.send(w.method_frame(0, w.CONNECTION_START_OK, w.table({}) + w.shortstr("CRAM-MD5")
                              + w.longstr(b"x") + w.shortstr("en_US")))
        try:
            close = c.expect_connection_close()
        except w.PeerClosed:
            return  # the connection ended, as it must
        assert close.reply_code in (403, 530, 540)


def test_unknown_vhost_closes_connection_530(broker):
    vhost = unique("vhost")
    with raw(broker) as c:
        c.start()
        c.start_ok()
        c.tune_ok(heartbeat=0)
        c.open(vhost)
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text == f"NOT_ALLOWED - vhost {vhost} not found"
        assert (close.class_id, close.method_id) == w.CONNECTION_OPEN


def test_unknown_vhost_surfaces_in_pika_as_access_denied(broker):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        broker.connect(virtual_host=unique("vhost"))
    assert "530" in str(info.value)


def test_tune_proposes_default_channel_max_frame_max_and_heartbeat(broker):
    with raw(broker) as c:
        c.handshake()
        assert c.tune == (2047, 131072, 60)


def test_tune_proposes_configured_limits(start_berth):
    b = start_berth("--frame-size-bytes-max", 65536, "--channels-per-connection-max", 16,
                    "--heartbeat-s", 7)
    with raw(b) as c:
        c.handshake()
        assert c.tune == (16, 65536, 7)


def test_client_may_lower_frame_max_and_bodies_are_split_to_fit(broker, conns):
    conn = conns.open(frame_max=4096, channel_max=8)
    assert conn._impl.params.frame_max == 4096
    assert conn._impl.params.channel_max == 8
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytes(range(256)) * 100  # 25,600 octets: 7 body frames of <= 4088
    ch.basic_publish("", q, body)
    _m, _p, got = ch.basic_get(q, auto_ack=True)
    assert got == body


def test_deliveries_respect_the_frame_max_the_client_chose(broker):
    with raw(broker) as c:
        c.handshake(frame_max=4096)
        c.channel_open(1)
        q = unique("fm")
        c.queue_declare(1, q, exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        body = b"z" * 20000
        c.basic_publish(1, "", q, body)
        c.basic_get(1, q)
        c.expect(w.BASIC_GET_OK)
        header = c.recv_frame()
        assert header.type == w.FRAME_HEADER
        received = b""
        while len(received) < len(body):
            f = c.recv_frame()
            assert f.type == w.FRAME_BODY
            assert len(f.payload) + 8 <= 4096
            received += f.payload
        assert received == body


@pytest.mark.parametrize("frame_max", [1024, 1 << 20])
def test_tune_ok_frame_max_outside_the_limits_ends_the_connection(broker, frame_max):
    # Below the 4096 minimum or above what the server proposed. RabbitMQ
    # answers 530 NOT_ALLOWED and drops the socket at once (often a reset).
    with raw(broker) as c:
        c.start()
        c.start_ok()
        c.tune_ok(frame_max=frame_max, heartbeat=0)
        try:
            f = c.recv_method(timeout_s=5)
        except w.PeerClosed:
            return
        assert f.method_ids == w.CONNECTION_CLOSE, f
        assert w.parse_close(f).reply_code == 530


def test_opening_more_channels_than_channel_max_closes_connection_530(broker):
    with raw(broker) as c:
        c.handshake(channel_max=2)
        c.channel_open(1)
        c.channel_open(2)
        c.send(w.method_frame(3, w.CHANNEL_OPEN, w.shortstr("")))
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text.startswith("NOT_ALLOWED - ")
        assert "channel_max" in close.reply_text


def test_update_secret_is_acknowledged_and_connection_keeps_working(conn):
    conn.update_secret("guest", "rotation")
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-")


def test_update_secret_raw_gets_update_secret_ok(broker):
    with raw(broker) as c:
        c.handshake()
        c.send(w.method_frame(0, w.CONNECTION_UPDATE_SECRET,
                              w.longstr("guest") + w.shortstr("rotation")))
        c.expect(w.CONNECTION_UPDATE_SECRET_OK)
        c.channel_open(1)


def test_client_close_is_answered_with_close_ok(broker):
    with raw(broker) as c:
        c.handshake()
        c.channel_open(1)
        c.send(w.method_frame(0, w.CONNECTION_CLOSE,
                              b"\x00\xc8" + w.shortstr("bye") + b"\x00\x00\x00\x00"))
        c.expect(w.CONNECTION_CLOSE_OK)


def _declared_queue_and_publishes(c, channel, count):
    """An exclusive queue on `channel` and `count` publishes to it, as bytes."""
    q = unique("drain")
    c.queue_declare(channel, q, exclusive=True)
    c.expect(w.QUEUE_DECLARE_OK)
    return b"".join(w.publish_frames(channel, "", q, b"m%d" % i, c.frame_max)
                    for i in range(count))


def _keep_writing(c, data, duration_s, what):
    """Writes `data` again and again for `duration_s`; fails on a write error
    (a reset connection)."""
    start = time.monotonic()
    while time.monotonic() - start < duration_s:
        try:
            c.send(data)
        except OSError as e:
            pytest.fail(f"writing {what} failed after {time.monotonic() - start:.3f} s: {e!r}")
        time.sleep(0.01)


def test_client_close_then_frames_of_an_open_channel_get_close_ok_and_no_reset(broker):
    # A multiplexing client (amqplib) can write connection.close ahead of
    # frames of a channel it is still flushing. RabbitMQ answers close-ok,
    # then reads and drops what else comes until the client closes the
    # socket (3.10: for up to 30 s); closing at once resets the connection
    # under the client's writes (EPIPE / ECONNRESET).
    with raw(broker) as c:
        c.handshake()
        c.channel_open(1)
        publishes = _declared_queue_and_publishes(c, 1, 200)
        c.send(w.close_frame(0, w.CONNECTION_CLOSE) + publishes)
        c.expect(w.CONNECTION_CLOSE_OK)
        _keep_writing(c, publishes, 1.0, "channel 1's frames after close-ok")
        what = c.quiet_and_open(0.5)
        assert what is None, f"before the client closed, the server {what}"


def test_server_close_drops_frames_until_close_ok_then_closes(broker):
    # The other direction: after the server's connection.close the client's
    # frames in flight are dropped, not answered and not a reason to reset;
    # RabbitMQ closes the socket once close-ok arrives.
    with raw(broker) as c:
        c.handshake()
        c.channel_open(1)
        c.channel_open(2)
        publishes = _declared_queue_and_publishes(c, 2, 200)
        # A second channel.open on an open channel is a connection error (504).
        c.send(w.method_frame(1, w.CHANNEL_OPEN, w.shortstr("")) + publishes)
        f = c.expect(w.CONNECTION_CLOSE)
        assert w.parse_close(f).reply_code == 504
        _keep_writing(c, publishes, 1.0, "channel 2's frames before close-ok")
        what = c.quiet_and_open(0.3)
        assert what is None, f"before close-ok, the server {what}"
        c.send(w.method_frame(0, w.CONNECTION_CLOSE_OK))
        assert c.wait_closed(timeout_s=5), "the server kept the socket open after close-ok"


def test_exclusive_queue_is_deleted_when_its_connection_closes(broker, conns):
    a = conns.open()
    q = a.channel().queue_declare("", exclusive=True).method.queue
    a.close()
    ch = conns.open().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 404


def test_memory_alarm_blocks_publishers_then_unblocks(start_berth, names):
    b = start_berth("--memory-high-watermark-bytes", 1_000_000)
    events = []
    publisher = b.connect()
    try:
        publisher.add_on_connection_blocked_callback(
            lambda _c, frame: events.append(("blocked", frame.method.reason)))
        publisher.add_on_connection_unblocked_callback(
            lambda _c, _frame: events.append(("unblocked", None)))
        ch = publisher.channel()
        q = names.queue()
        ch.queue_declare(q)
        for _ in range(15):
            ch.basic_publish("", q, b"m" * 100_000)
        assert wait_until(lambda: events, timeout_s=10, conn=publisher), "no connection.blocked"
        assert events[0][0] == "blocked" and events[0][1]
        other = b.connect()
        try:
            other.channel().queue_purge(q)
        finally:
            other.close()
        assert wait_until(lambda: ("unblocked", None) in events, timeout_s=10, conn=publisher)
        ch.basic_publish("", q, b"after")  # publishing works again
        ch.queue_declare(q, passive=True)
    finally:
        try:
            publisher.close()
        except Exception:
            pass

