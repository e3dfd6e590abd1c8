"""exchange.*: declare (passive, durable, auto-delete, internal), reserved
names, equivalence, delete (if-unused), exchange-to-exchange bindings."""

import pytest

from helpers import channel_error, connection_error, drain, unique


def exists(conn, exchange):
    ch = conn.channel()
    try:
        ch.exchange_declare(exchange, passive=True)
        ch.close()
        return True
    except Exception as e:
        assert getattr(e, "reply_code", None) == 404, e
        return False


def test_declare_then_passive_declare_succeeds(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    assert ch.exchange_declare(x, "direct", passive=True).method.NAME == "Exchange.DeclareOk"


def test_passive_declare_ignores_type_and_flags(ch):
    ch.exchange_declare("amq.direct", "fanout", passive=True, durable=False)


def test_passive_declare_of_missing_exchange_is_404(ch):
    x = unique("missing")
    with channel_error(404, 40, 10, text=f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, passive=True)


def test_redeclare_with_same_properties_is_ok(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic", durable=True)
    ch.exchange_declare(x, "topic", durable=True)


def test_redeclare_with_other_type_is_406(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    with channel_error(406, 40, 10, text=f"PRECONDITION_FAILED - inequivalent arg 'type' for "
                       f"exchange '{x}' in vhost '/': received 'fanout' but current is 'direct'"):
        ch.exchange_declare(x, "fanout")


@pytest.mark.parametrize("flag", ["durable", "auto_delete"])
def test_redeclare_with_other_flag_is_406(ch, names, flag):
    x = names.exchange()
    ch.exchange_declare(x, "direct", **{flag: True})
    with channel_error(406, 40, 10, text=f"inequivalent arg '{flag}'"):
        ch.exchange_declare(x, "direct")


def test_unknown_exchange_type_closes_connection_503(conn):
    ch = conn.channel()
    with connection_error(503, 40, 10, text="COMMAND_INVALID - "):
        ch.exchange_declare(unique("x"), "no-such-type")
    assert conn.is_closed


def test_declaring_a_new_amq_prefixed_exchange_is_403(ch):
    x = "amq." + unique("x")
    with channel_error(403, 40, 10, text=f"ACCESS_REFUSED - exchange name '{x}' contains "
                       "reserved prefix 'amq.*'"):
        ch.exchange_declare(x, "direct")


def test_redeclaring_a_builtin_amq_exchange_with_its_properties_is_ok(ch):
    for name, kind in [("amq.direct", "direct"), ("amq.fanout", "fanout"),
                       ("amq.topic", "topic"), ("amq.headers", "headers"), ("amq.match", "headers")]:
        ch.exchange_declare(name, kind, durable=True)


def test_deleting_a_builtin_amq_exchange_is_403(ch):
    with channel_error(403, 40, 20, text="ACCESS_REFUSED - "):
        ch.exchange_delete("amq.direct")


def test_declaring_the_default_exchange_is_403(ch):
    with channel_error(403, 40, 10, text="ACCESS_REFUSED - operation not permitted on the "
                       "default exchange"):
        ch.exchange_declare("", "direct")


def test_deleting_the_default_exchange_is_403(ch):
    with channel_error(403, 40, 20):
        ch.exchange_delete("")


def test_delete_removes_exchange(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    ch.exchange_delete(x)
    assert not exists(conn, x)


def test_delete_of_missing_exchange_is_ok(ch):
    ch.exchange_delete(unique("missing"))


def test_delete_if_unused_with_bindings_is_406(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x)
    with channel_error(406, 40, 20, text=f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' "
                       "in use"):
        ch.exchange_delete(x, if_unused=True)
    assert exists(conn, x)


def test_delete_if_unused_without_bindings_deletes(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    ch.exchange_delete(x, if_unused=True)
    assert not exists(conn, x)


def test_deleting_an_exchange_removes_its_bindings(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x)
    ch.exchange_delete(x)
    ch.exchange_declare(x, "fanout")  # same name, fresh: no binding survives
    ch.basic_publish(x, "", b"nobody")
    assert drain(ch, q) == []


def test_auto_delete_exchange_goes_when_its_last_binding_goes(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x)
    ch.queue_bind(q2, x)
    ch.queue_unbind(q1, x)
    assert exists(conn, x)
    ch.queue_unbind(q2, x)
    assert not exists(conn, x)


def test_auto_delete_exchange_never_bound_stays(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", auto_delete=True)
    assert exists(conn, x)


def test_auto_delete_exchange_goes_when_its_bound_queue_is_deleted(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x)
    ch.queue_delete(q)
    assert not exists(conn, x)


def test_publishing_to_an_internal_exchange_is_403(conn, names):
    ch = conn.channel()
    x = names.exchange()
    ch.exchange_declare(x, "fanout", internal=True)
    with channel_error(403, 60, 40, text=f"ACCESS_REFUSED - cannot publish to internal "
                       f"exchange '{x}' in vhost '/'"):
        ch.basic_publish(x, "", b"x")
        ch.queue_declare("", exclusive=True)  # a round trip to see the close


def test_internal_exchange_receives_through_exchange_binding(conn, names):
    ch = conn.channel()
    front, inner = names.exchange("front"), names.exchange("inner")
    ch.exchange_declare(front, "fanout")
    ch.exchange_declare(inner, "fanout", internal=True)
    ch.exchange_bind(inner, front)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, inner)
    ch.basic_publish(front, "k", b"via front")
    assert drain(ch, q) == [b"via front"]


def test_exchange_to_exchange_binding_routes_by_key_and_unbind_stops_it(conn, names):
    ch = conn.channel()
    src, dst = names.exchange("src"), names.exchange("dst")
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src, routing_key="red")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, dst)
    ch.basic_publish(src, "red", b"r1")
    ch.basic_publish(src, "blue", b"b1")
    assert drain(ch, q) == [b"r1"]
    ch.exchange_unbind(dst, src, routing_key="red")
    ch.basic_publish(src, "red", b"r2")
    assert drain(ch, q) == []


def test_exchange_binding_cycles_deliver_once(conn, names):
    ch = conn.channel()
    a, b = names.exchange("a"), names.exchange("b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, a)
    ch.queue_bind(q, b)
    ch.basic_publish(a, "", b"once")
    assert drain(ch, q) == [b"once"]


def test_exchange_bind_with_missing_source_is_404(conn, names):
    ch = conn.channel()
    missing = unique("missing")
    with channel_error(404, 40, 30, text=f"NOT_FOUND - no exchange '{missing}' in vhost '/'"):
        ch.exchange_bind("amq.fanout", missing)


def test_exchange_bind_with_missing_destination_is_404(conn):
    ch = conn.channel()
    missing = unique("missing")
    with channel_error(404, 40, 30, text=f"NOT_FOUND - no exchange '{missing}' in vhost '/'"):
        ch.exchange_bind(missing, "amq.fanout")


def test_exchange_unbind_of_missing_binding_is_ok(ch):
    ch.exchange_unbind("amq.fanout", "amq.direct", routing_key=unique("k"))


def test_auto_delete_source_exchange_goes_after_its_last_exchange_binding(conn, names):
    ch = conn.channel()
    src, dst = names.exchange("src"), names.exchange("dst")
    ch.exchange_declare(src, "fanout", auto_delete=True)
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src)
    ch.exchange_unbind(dst, src)
    assert not exists(conn, src)
    assert exists(conn, dst)
