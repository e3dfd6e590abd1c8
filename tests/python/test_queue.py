"""queue.*: declare (passive, durable, exclusive, auto-delete, server-named),
equivalence, bind/unbind, purge, delete (if-unused, if-empty)."""

import pika
import pika.exceptions
import pytest

from helpers import channel_error, drain, publish_confirmed, unique, wait_until

LOCKED_TEXT = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in "
               "vhost '/'")


def queue_exists(conn, q):
    ch = conn.channel()
    try:
        ch.queue_declare(q, passive=True)
        ch.close()
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False


def test_server_named_queue_gets_amq_gen_name(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-") and len(q) > len("amq.gen-")


def test_declare_ok_reports_message_and_consumer_counts(conn, names):
    ch = conn.channel()
    q = names.queue()
    ok = ch.queue_declare(q).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 0)
    publish_confirmed(ch, q, [b"m"] * 3)
    ch.basic_consume(q, lambda *a: None, auto_ack=False)
    conn.process_data_events(0.1)
    # Three messages, all delivered unacked to the one consumer.
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (0, 1)
    ok = conn.channel().queue_declare(q).method
    assert ok.consumer_count == 1


def test_declare_ok_counts_ready_messages(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    publish_confirmed(ch, q, [b"m"] * 4)
    assert ch.queue_declare(q, passive=True).method.message_count == 4


def test_passive_declare_of_missing_queue_is_404(ch):
    q = unique("missing")
    with channel_error(404, 50, 10, text=f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_declare(q, passive=True)


def test_passive_declare_ignores_flags_and_arguments(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    ch.queue_declare(q, passive=True, durable=True, arguments={"x-message-ttl": 5})


def test_durable_queue_redeclared_non_durable_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, durable=True)
    with channel_error(406, 50, 10, text=f"PRECONDITION_FAILED - inequivalent arg 'durable' for "
                       f"queue '{q}' in vhost '/': received 'false' but current is 'true'"):
        ch.queue_declare(q, durable=False)


def test_redeclare_with_other_auto_delete_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, auto_delete=True)
    with channel_error(406, 50, 10, text="inequivalent arg 'auto_delete'"):
        ch.queue_declare(q)


def test_redeclare_with_other_x_argument_value_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 1000})
    with channel_error(406, 50, 10, text=f"PRECONDITION_FAILED - inequivalent arg "
                       f"'x-message-ttl' for queue '{q}' in vhost '/'"):
        ch.queue_declare(q, arguments={"x-message-ttl": 2000})


def test_redeclare_without_a_recognised_x_argument_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 10})
    with channel_error(406, 50, 10, text="inequivalent arg 'x-max-length'"):
        ch.queue_declare(q)


def test_redeclare_adding_a_recognised_x_argument_is_406(ch, names):
    q = names.queue()
    ch.queue_declare(q)
    with channel_error(406, 50, 10, text="inequivalent arg 'x-expires'"):
        ch.queue_declare(q, arguments={"x-expires": 60000})


def test_redeclare_with_other_unknown_argument_is_ok(ch, names):
    q = names.queue()
    ch.queue_declare(q, arguments={"x-pytest-unknown": 1})
    ch.queue_declare(q, arguments={"x-pytest-unknown": 2})


def test_declaring_an_amq_prefixed_queue_is_403(ch):
    q = "amq." + unique("q")
    with channel_error(403, 50, 10, text=f"ACCESS_REFUSED - queue name '{q}' contains reserved "
                       "prefix 'amq.*'"):
        ch.queue_declare(q)


def test_redeclaring_a_server_named_queue_non_passively_is_403(ch):
    # RabbitMQ checks the reserved prefix before looking the queue up.
    q = ch.queue_declare("", exclusive=True).method.queue
    with channel_error(403, 50, 10, text="contains reserved prefix 'amq.*'"):
        ch.queue_declare(q, exclusive=True)


def test_exclusive_queue_passive_declare_from_another_connection_is_405(conns):
    q = conns.open().channel().queue_declare("", exclusive=True).method.queue
    other = conns.open().channel()
    with channel_error(405, 50, 10, text=LOCKED_TEXT.format(q=q)):
        other.queue_declare(q, passive=True)


def test_exclusive_queue_declare_from_another_connection_is_405(conns, names):
    q = names.queue()
    conns.open().channel().queue_declare(q, exclusive=True)
    other = conns.open().channel()
    with channel_error(405, 50, 10, text=LOCKED_TEXT.format(q=q)):
        other.queue_declare(q, exclusive=True)


@pytest.mark.parametrize("op,ids", [
    ("consume", (60, 20)), ("get", (60, 70)), ("purge", (50, 30)), ("delete", (50, 40)),
    ("bind", (50, 20)),
])
def test_exclusive_queue_used_from_another_connection_is_405(conns, op, ids):
    q = conns.open().channel().queue_declare("", exclusive=True).method.queue
    other = conns.open().channel()
    action = {
        "consume": lambda: other.basic_consume(q, lambda *a: None),
        "get": lambda: other.basic_get(q),
        "purge": lambda: other.queue_purge(q),
        "delete": lambda: other.queue_delete(q),
        "bind": lambda: other.queue_bind(q, "amq.direct", "k"),
    }[op]
    with channel_error(405, *ids, text="RESOURCE_LOCKED - "):
        action()


def test_exclusive_redeclare_of_a_shared_queue_is_405(conns, names):
    q = names.queue()
    ch = conns.open().channel()
    ch.queue_declare(q)
    with channel_error(405, 50, 10):
        ch.queue_declare(q, exclusive=True)


def test_publishing_to_an_exclusive_queue_from_another_connection_is_allowed(conns):
    owner = conns.open().channel()
    q = owner.queue_declare("", exclusive=True).method.queue
    other = conns.open().channel()
    publish_confirmed(other, q, [b"hi"])
    assert drain(owner, q) == [b"hi"]


def test_auto_delete_queue_goes_when_its_last_consumer_cancels(conns, names):
    conn = conns.open()
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, auto_delete=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    assert queue_exists(conn, q)
    ch.basic_cancel(t2)
    assert wait_until(lambda: not queue_exists(conn, q), timeout_s=2)


def test_auto_delete_queue_without_consumers_stays(conns, names):
    conn = conns.open()
    q = names.queue()
    conn.channel().queue_declare(q, auto_delete=True)
    assert queue_exists(conn, q)


def test_auto_delete_queue_goes_when_consumer_channel_closes(conns, names):
    conn = conns.open()
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    assert wait_until(lambda: not queue_exists(conn, q), timeout_s=2)


def test_bind_routes_and_unbind_stops_routing(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.direct", "k1")
    ch.basic_publish("amq.direct", "k1", b"a")
    ch.queue_unbind(q, "amq.direct", "k1")
    ch.basic_publish("amq.direct", "k1", b"b")
    assert drain(ch, q) == [b"a"]


def test_binding_twice_delivers_once(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", "k")
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"once")
    assert drain(ch, q) == [b"once"]


def test_bind_to_missing_exchange_is_404(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    x = unique("missing")
    with channel_error(404, 50, 20, text=f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.queue_bind(q, x, "k")


def test_bind_of_missing_queue_is_404(ch):
    q = unique("missing")
    with channel_error(404, 50, 20, text=f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_bind(q, "amq.direct", "k")


def test_binding_to_the_default_exchange_is_403(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    with channel_error(403, 50, 20, text="ACCESS_REFUSED - operation not permitted on the "
                       "default exchange"):
        ch.queue_bind(q, "", "k")


def test_unbind_of_missing_binding_is_ok(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_unbind(q, "amq.direct", unique("never-bound"))


def test_purge_removes_ready_messages_and_reports_count(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    publish_confirmed(ch, q, [b"m"] * 5)
    assert ch.queue_purge(q).method.message_count == 5
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_purge_leaves_unacked_messages(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    publish_confirmed(ch, q, [b"0", b"1", b"2"])
    method, _p, _b = ch.basic_get(q)
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_reject(method.delivery_tag, requeue=True)
    assert drain(ch, q) == [b"0"]


def test_purge_of_missing_queue_is_404(ch):
    q = unique("missing")
    with channel_error(404, 50, 30, text=f"NOT_FOUND - no queue '{q}' in vhost '/'"):
        ch.queue_purge(q)


def test_delete_reports_message_count_and_removes_queue(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    publish_confirmed(ch, q, [b"m"] * 2)
    assert ch.queue_delete(q).method.message_count == 2
    assert not queue_exists(conn, q)


def test_delete_of_missing_queue_is_ok_with_zero_count(ch):
    assert ch.queue_delete(unique("missing")).method.message_count == 0


def test_delete_if_empty_with_messages_is_406(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    with channel_error(406, 50, 40, text=f"PRECONDITION_FAILED - queue '{q}' in vhost '/' "
                       "not empty"):
        ch.queue_delete(q, if_empty=True)
    assert queue_exists(conn, q)


def test_delete_if_unused_with_consumer_is_406(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None)
    with channel_error(406, 50, 40, text=f"PRECONDITION_FAILED - queue '{q}' in vhost '/' "
                       "in use"):
        ch.queue_delete(q, if_unused=True)
    assert queue_exists(conn, q)


def test_delete_if_empty_and_if_unused_on_idle_empty_queue_deletes(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_delete(q, if_empty=True, if_unused=True)
    assert not queue_exists(conn, q)


def test_deleted_queue_loses_its_bindings(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.direct", q)
    ch.queue_delete(q)
    ch.queue_declare(q)
    ch.basic_publish("amq.direct", q, b"lost")
    ch.basic_publish("", q, b"direct")
    assert drain(ch, q) == [b"direct"]


def test_durable_queue_and_persistent_message_are_accepted(conn, names):
    ch = conn.channel()
    q = names.queue()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"keep", pika.BasicProperties(delivery_mode=2))
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"keep" and props.delivery_mode == 2

