"""x- queue arguments: TTLs, expiry, length limits and overflow, dead
lettering with x-death, delivery limit, consumer timeout, priorities, queue
types, unknown and invalid arguments."""

import time

import pika
import pika.exceptions
import pytest

from helpers import channel_error, drain, publish_confirmed, unique, wait_until


def declare(ch, arguments, **kw):
    kw.setdefault("exclusive", True)
    return ch.queue_declare("", arguments=arguments, **kw).method.queue


def dead_letter_target(ch, names):
    """A fanout exchange with one queue bound: where dead letters land."""
    dlx = names.exchange("dlx")
    ch.exchange_declare(dlx, "fanout")
    dlq = declare(ch, {})
    ch.queue_bind(dlq, dlx)
    return dlx, dlq


def get_message(ch, q, timeout_s=3, auto_ack=True):
    """basic.get until a message comes (dead lettering is asynchronous)."""
    def attempt():
        got = ch.basic_get(q, auto_ack=auto_ack)
        return got if got[0] is not None else None

    got = wait_until(attempt, timeout_s=timeout_s, interval_s=0.05)
    assert got is not None, f"no message arrived in {q}"
    return got


def get_dead_letter(ch, dlq, timeout_s=3):
    return get_message(ch, dlq, timeout_s)


def passive_count(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


# ------------------------------------------------------------------ TTL
def test_queue_message_ttl_expires_messages(ch):
    q = declare(ch, {"x-message-ttl": 150})
    publish_confirmed(ch, q, [b"old1", b"old2"])
    time.sleep(0.4)
    publish_confirmed(ch, q, [b"fresh"])
    assert drain(ch, q) == [b"fresh"]


def test_expired_messages_leave_the_message_count(ch):
    q = declare(ch, {"x-message-ttl": 100})
    publish_confirmed(ch, q, [b"a", b"b", b"c"])
    assert wait_until(lambda: passive_count(ch, q) == 0, timeout_s=3)


def test_message_ttl_zero_drops_messages_without_a_consumer(ch):
    q = declare(ch, {"x-message-ttl": 0})
    publish_confirmed(ch, q, [b"now or never"])
    assert drain(ch, q) == []


def test_per_message_expiration_expires_that_message(ch):
    q = declare(ch, {})
    publish_confirmed(ch, q, [b"short"], properties=pika.BasicProperties(expiration="100"))
    publish_confirmed(ch, q, [b"long"], properties=pika.BasicProperties(expiration="60000"))
    publish_confirmed(ch, q, [b"forever"])
    time.sleep(0.3)
    assert drain(ch, q) == [b"long", b"forever"]


def test_lower_of_queue_ttl_and_expiration_applies(ch):
    q = declare(ch, {"x-message-ttl": 100})
    publish_confirmed(ch, q, [b"m"], properties=pika.BasicProperties(expiration="60000"))
    time.sleep(0.3)
    assert drain(ch, q) == []


def test_expiration_property_is_delivered_unchanged(ch):
    q = declare(ch, {})
    publish_confirmed(ch, q, [b"m"], properties=pika.BasicProperties(expiration="60000"))
    _m, props, _b = ch.basic_get(q, auto_ack=True)
    assert props.expiration == "60000"


@pytest.mark.parametrize("expiration,detail", [("abc", "invalid expiration 'abc'"),
                                               ("-1", "invalid expiration '-1'")])
def test_invalid_expiration_property_closes_channel_406(ch, expiration, detail):
    q = declare(ch, {})
    with channel_error(406, 60, 40, text=f"PRECONDITION_FAILED - {detail}"):
        ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=expiration))
        ch.queue_declare(q, passive=True)


# ------------------------------------------------------------------ x-expires
def test_unused_queue_with_x_expires_is_deleted(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, arguments={"x-expires": 200})

    def gone():
        c = conn.channel()
        try:
            c.queue_declare(q, passive=True)
            c.close()
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True

    assert not gone()
    # A passive declare counts as use and restarts the timer: poll slowly.
    assert wait_until(gone, timeout_s=5, interval_s=0.5)


def test_queue_with_a_consumer_does_not_expire(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, arguments={"x-expires": 200})
    ch.basic_consume(q, lambda *a: None)
    conn.process_data_events(0.6)
    conn.channel().queue_declare(q, passive=True)


# ------------------------------------------------------------------ length limits
def test_max_length_drops_from_the_head(ch):
    q = declare(ch, {"x-max-length": 2})
    publish_confirmed(ch, q, [b"1", b"2", b"3", b"4"])
    assert passive_count(ch, q) == 2
    assert drain(ch, q) == [b"3", b"4"]


def test_max_length_zero_keeps_nothing(ch):
    q = declare(ch, {"x-max-length": 0})
    publish_confirmed(ch, q, [b"1"])
    assert drain(ch, q) == []


def test_max_length_bytes_counts_body_bytes(ch):
    q = declare(ch, {"x-max-length-bytes": 10})
    publish_confirmed(ch, q, [b"aaaa", b"bbbb", b"cccc"])  # 12 bytes: drop the head
    assert drain(ch, q) == [b"bbbb", b"cccc"]


def test_max_length_bytes_drops_until_under_the_limit(ch):
    q = declare(ch, {"x-max-length-bytes": 10})
    publish_confirmed(ch, q, [b"123456", b"abcdef", b"xyz123"])
    assert drain(ch, q) == [b"xyz123"]


def test_overflow_reject_publish_drops_new_messages(ch):
    q = declare(ch, {"x-max-length": 2, "x-overflow": "reject-publish"})
    for body in (b"1", b"2", b"3"):
        ch.basic_publish("", q, body)
    time.sleep(0.1)
    assert drain(ch, q) == [b"1", b"2"]


def test_overflow_reject_publish_nacks_with_confirms(ch):
    q = declare(ch, {"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"2")
    ch.basic_get(q, auto_ack=True)
    ch.basic_publish("", q, b"3")  # room again: acked
    assert drain(ch, q) == [b"3"]


def test_overflow_reject_publish_nacks_only_for_the_full_queue(ch):
    full = declare(ch, {"x-max-length": 0, "x-overflow": "reject-publish"})
    roomy = declare(ch, {})
    x = unique("fan")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    ch.queue_bind(full, x)
    ch.queue_bind(roomy, x)
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(x, "", b"m")
    assert drain(ch, roomy) == [b"m"]  # routed queues with room still get it


def test_overflow_drop_head_is_the_default_and_explicit(ch):
    q = declare(ch, {"x-max-length": 1, "x-overflow": "drop-head"})
    publish_confirmed(ch, q, [b"1", b"2"])
    assert drain(ch, q) == [b"2"]


def test_max_length_drop_head_dead_letters_with_reason_maxlen(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-max-length": 1, "x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"first", b"second"])
    _m, props, body = get_dead_letter(ch, dlq)
    assert body == b"first"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert props.headers["x-first-death-reason"] == "maxlen"


# ------------------------------------------------------------------ dead lettering
def test_rejected_message_is_dead_lettered_with_x_death(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"bad"], properties=pika.BasicProperties(
        headers={"app": "kept"}, content_type="text/plain"))
    tag = ch.basic_get(q)[0].delivery_tag
    ch.basic_reject(tag, requeue=False)
    method, props, body = get_dead_letter(ch, dlq)
    assert body == b"bad"
    assert (method.exchange, method.routing_key, method.redelivered) == (dlx, q, False)
    assert props.content_type == "text/plain"
    h = props.headers
    assert h["app"] == "kept"
    assert h["x-first-death-reason"] == "rejected"
    assert h["x-first-death-queue"] == q
    assert h["x-first-death-exchange"] == ""
    (death,) = h["x-death"]
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == q
    assert death["exchange"] == ""
    assert death["routing-keys"] == [q]
    assert "time" in death


def test_nacked_message_is_dead_lettered_with_reason_rejected(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"n"])
    ch.basic_nack(ch.basic_get(q)[0].delivery_tag, requeue=False)
    _m, props, _b = get_dead_letter(ch, dlq)
    assert props.headers["x-death"][0]["reason"] == "rejected"


def test_requeued_message_is_not_dead_lettered(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"r"])
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=True)
    time.sleep(0.1)
    assert drain(ch, dlq) == []
    assert drain(ch, q) == [b"r"]


def test_expired_message_is_dead_lettered_with_original_expiration(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"late"], properties=pika.BasicProperties(expiration="50"))
    method, props, body = get_dead_letter(ch, dlq)
    assert body == b"late"
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired"
    assert death["original-expiration"] == "50"
    assert props.expiration is None  # removed so the dead letter does not expire again


def test_queue_ttl_expiry_is_dead_lettered_with_reason_expired(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = declare(ch, {"x-message-ttl": 50, "x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"ttl"])
    _m, props, body = get_dead_letter(ch, dlq)
    assert body == b"ttl"
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired" and "original-expiration" not in death


def test_dead_letter_routing_key_replaces_the_routing_key(ch, names):
    dlx = names.exchange("dlx")
    ch.exchange_declare(dlx, "direct")
    dlq = declare(ch, {})
    ch.queue_bind(dlq, dlx, "to-dlq")
    q = declare(ch, {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "to-dlq"})
    ch.queue_bind(q, "amq.direct", "orig")
    publish_confirmed(ch, "orig", [b"m"], exchange="amq.direct")
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    method, props, _b = get_dead_letter(ch, dlq)
    assert method.routing_key == "to-dlq"
    (death,) = props.headers["x-death"]
    assert death["exchange"] == "amq.direct"
    assert death["routing-keys"] == ["orig"]


def test_dead_letter_to_default_exchange_by_routing_key(ch):
    dlq = declare(ch, {})
    q = declare(ch, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    publish_confirmed(ch, q, [b"m"])
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    _m, _p, body = get_dead_letter(ch, dlq)
    assert body == b"m"


def test_x_death_records_each_queue_newest_first(ch):
    final = declare(ch, {})
    second = declare(ch, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": final})
    first = declare(ch, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": second})
    publish_confirmed(ch, first, [b"m"])
    ch.basic_reject(ch.basic_get(first)[0].delivery_tag, requeue=False)
    tag = wait_until(lambda: ch.basic_get(second)[0], timeout_s=3).delivery_tag
    ch.basic_reject(tag, requeue=False)
    _m, props, _b = get_dead_letter(ch, final)
    deaths = props.headers["x-death"]
    assert [d["queue"] for d in deaths] == [second, first]
    assert all(d["count"] == 1 and d["reason"] == "rejected" for d in deaths)
    assert props.headers["x-first-death-queue"] == first


def test_x_death_count_increments_when_a_message_dies_again_in_the_same_queue(ch):
    # q dead-letters to retry; retry (TTL 50) dead-letters back to q.
    q = unique("loop")
    retry = declare(ch, {"x-message-ttl": 50, "x-dead-letter-exchange": "",
                         "x-dead-letter-routing-key": q})
    ch.queue_declare(q, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
    publish_confirmed(ch, q, [b"m"])
    for expected in (1, 2):
        method = wait_until(lambda: ch.basic_get(q)[0], timeout_s=3)
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = get_message(ch, q)
    by_queue = {(d["queue"], d["reason"]): d["count"] for d in props.headers["x-death"]}
    assert by_queue == {(q, "rejected"): 2, (retry, "expired"): 2}


def test_dead_letter_exchange_that_does_not_exist_drops_the_message(ch):
    q = declare(ch, {"x-dead-letter-exchange": unique("missing-dlx")})
    publish_confirmed(ch, q, [b"m"])
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    assert ch.is_open
    assert drain(ch, q) == []


def test_dead_letter_routing_key_without_exchange_is_406(ch):
    with channel_error(406, 50, 10, text="PRECONDITION_FAILED - invalid arg "
                       "'x-dead-letter-routing-key'"):
        declare(ch, {"x-dead-letter-routing-key": "rk"})


# ------------------------------------------------------------------ delivery limit
def quorum_queue(ch, names, arguments):
    q = names.queue("quorum")
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", **arguments})
    return q


def test_delivery_limit_drops_message_after_limit_redeliveries(ch, names):
    q = quorum_queue(ch, names, {"x-delivery-limit": 2})
    publish_confirmed(ch, q, [b"poison"])
    flags = []
    for _ in range(5):
        method = wait_until(lambda: ch.basic_get(q)[0], timeout_s=0.5)
        if method is None:
            break
        flags.append(method.redelivered)
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert flags == [False, True, True]  # delivered 1 + 2 times, then dropped


def test_delivery_limit_dead_letters_with_reason_delivery_limit(ch, names):
    dlx, dlq = dead_letter_target(ch, names)
    q = quorum_queue(ch, names, {"x-delivery-limit": 1, "x-dead-letter-exchange": dlx})
    publish_confirmed(ch, q, [b"poison"])
    for _ in range(2):
        method = wait_until(lambda: ch.basic_get(q)[0], timeout_s=3)
        ch.basic_nack(method.delivery_tag, requeue=True)
    _m, props, body = get_dead_letter(ch, dlq)
    assert body == b"poison"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert props.headers["x-death"][0]["queue"] == q


# ------------------------------------------------------------------ consumer timeout
def test_x_consumer_timeout_closes_the_channel_406_and_requeues(berth_only, conn):
    ch = conn.channel()
    q = declare(ch, {"x-consumer-timeout": 300})
    publish_confirmed(ch, q, [b"slow"])
    closed = []
    ch.basic_consume(q, lambda *a: None)
    ch._impl.add_on_close_callback(lambda _c, reason: closed.append(reason))
    assert wait_until(lambda: closed, timeout_s=5, conn=conn), "channel not closed"
    reason = closed[0]
    assert reason.reply_code == 406
    assert "PRECONDITION_FAILED - delivery acknowledgement on channel" in reason.reply_text
    assert "timed out" in reason.reply_text
    method, _p, body = conn.channel().basic_get(q, auto_ack=True)
    assert body == b"slow" and method.redelivered is True


def test_acked_deliveries_do_not_time_out(berth_only, conn):
    ch = conn.channel()
    q = declare(ch, {"x-consumer-timeout": 300})
    publish_confirmed(ch, q, [b"1", b"2"])
    ch.basic_consume(q, lambda c, m, p, b: c.basic_ack(m.delivery_tag))
    conn.process_data_events(1.0)
    assert ch.is_open


def test_server_wide_consumer_timeout_closes_the_channel_406(start_berth):
    b = start_berth("--consumer-timeout-ms", 300)
    conn = b.connect()
    try:
        ch = conn.channel()
        q = declare(ch, {})
        publish_confirmed(ch, q, [b"slow"])
        closed = []
        ch._impl.add_on_close_callback(lambda _c, reason: closed.append(reason))
        ch.basic_consume(q, lambda *a: None)
        assert wait_until(lambda: closed, timeout_s=5, conn=conn), "channel not closed"
        assert closed[0].reply_code == 406
        assert "timed out" in closed[0].reply_text
        method, _p, body = conn.channel().basic_get(q, auto_ack=True)
        assert body == b"slow" and method.redelivered is True
    finally:
        conn.close()


# ------------------------------------------------------------------ priorities
def test_max_priority_delivers_higher_priority_first_fifo_within_a_level(ch):
    q = declare(ch, {"x-max-priority": 5})
    sent = [(b"p1", 1), (b"none-a", None), (b"p5-a", 5), (b"p3", 3), (b"p9-capped", 9),
            (b"p5-b", 5), (b"p0", 0), (b"none-b", None)]
    for body, prio in sent:
        publish_confirmed(ch, q, [body], properties=pika.BasicProperties(priority=prio))
    assert drain(ch, q) == [b"p5-a", b"p9-capped", b"p5-b", b"p3", b"p1",
                            b"none-a", b"p0", b"none-b"]


def test_priority_is_ignored_without_max_priority(ch):
    q = declare(ch, {})
    for body, prio in [(b"low", 1), (b"high", 9)]:
        publish_confirmed(ch, q, [body], properties=pika.BasicProperties(priority=prio))
    assert drain(ch, q) == [b"low", b"high"]


def test_priority_consumer_gets_high_priority_first_after_backlog(conn):
    ch = conn.channel()
    q = declare(ch, {"x-max-priority": 10})
    for prio in (1, 2, 3, 10, 4):
        publish_confirmed(ch, q, [str(prio).encode()],
                          properties=pika.BasicProperties(priority=prio))
    got = []
    ch.basic_qos(prefetch_count=1)

    def on_message(c, m, _p, body):
        got.append(body)
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on_message)
    assert wait_until(lambda: len(got) == 5, conn=conn)
    assert got == [b"10", b"4", b"3", b"2", b"1"]


# ------------------------------------------------------------------ types, unknown, invalid
def test_queue_type_classic_is_accepted(ch):
    declare(ch, {"x-queue-type": "classic"})


def test_queue_type_quorum_is_accepted_durable(ch, names):
    q = quorum_queue(ch, names, {})
    publish_confirmed(ch, q, [b"q"])
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"q"


def test_unknown_x_arguments_are_ignored(ch):
    q = declare(ch, {"x-pytest-unknown": "whatever", "x-another": 7, "not-x": True})
    publish_confirmed(ch, q, [b"m"])
    assert drain(ch, q) == [b"m"]


INVALID_ARGUMENTS = [
    ("x-message-ttl", -1), ("x-message-ttl", "abc"),
    ("x-expires", 0), ("x-expires", -5), ("x-expires", "abc"),
    ("x-max-length", -1), ("x-max-length", "x"),
    ("x-max-length-bytes", -5), ("x-max-length-bytes", "x"),
    ("x-overflow", "bogus"), ("x-overflow", 3),
    ("x-max-priority", -1), ("x-max-priority", 256), ("x-max-priority", "a"),
    ("x-dead-letter-exchange", 5),
]


@pytest.mark.parametrize("name,value", INVALID_ARGUMENTS)
def test_invalid_argument_value_is_406(ch, name, value):
    with channel_error(406, 50, 10, text="PRECONDITION_FAILED - ") as info:
        declare(ch, {name: value})
    assert name in info.value.reply_text


def test_quorum_queue_must_be_durable_406(ch, names):
    q = names.queue("quorum")
    with channel_error(406, 50, 10, text="PRECONDITION_FAILED - "):
        ch.queue_declare(q, durable=False, arguments={"x-queue-type": "quorum"})
