"""Routing through the default exchange, amq.direct, amq.fanout, amq.topic,
amq.headers, amq.match and user-declared exchanges of each type."""

import pika
import pytest

from helpers import drain, publish_confirmed, unique


def bound_queue(ch, exchange, routing_key="", arguments=None):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, exchange, routing_key, arguments=arguments)
    return q


def publish(ch, exchange, key, body, headers=None):
    props = pika.BasicProperties(headers=headers) if headers is not None else None
    publish_confirmed(ch, key, [body], exchange=exchange, properties=props)


def test_default_exchange_routes_by_queue_name(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"direct to queue")
    ch.basic_publish("", unique("nobody"), b"lost")
    assert drain(ch, q) == [b"direct to queue"]


@pytest.mark.parametrize("exchange", ["amq.direct", "user-direct"])
def test_direct_exchange_routes_on_exact_key(ch, names, exchange):
    if exchange == "user-direct":
        exchange = names.exchange()
        ch.exchange_declare(exchange, "direct")
    red = bound_queue(ch, exchange, "red")
    both = bound_queue(ch, exchange, "red")
    ch.queue_bind(both, exchange, "blue")
    for key in ("red", "blue", "green", "re", "red.x"):
        publish(ch, exchange, key, key.encode())
    assert drain(ch, red) == [b"red"]
    assert drain(ch, both) == [b"red", b"blue"]


@pytest.mark.parametrize("exchange", ["amq.fanout", "user-fanout"])
def test_fanout_exchange_ignores_routing_key(ch, names, exchange):
    if exchange == "user-fanout":
        exchange = names.exchange()
        ch.exchange_declare(exchange, "fanout")
    a = bound_queue(ch, exchange, "ignored")
    b = bound_queue(ch, exchange)
    publish(ch, exchange, "any.key", b"1")
    publish(ch, exchange, "", b"2")
    assert drain(ch, a) == [b"1", b"2"]
    assert drain(ch, b) == [b"1", b"2"]


TOPIC_CASES = [
    # pattern, keys that match, keys that do not
    ("stock.*.nyse", ["stock.ibm.nyse", "stock..nyse"], ["stock.nyse", "stock.ibm.x.nyse", "stock.ibm.nyse.x"]),
    ("stock.#", ["stock", "stock.ibm", "stock.ibm.nyse"], ["stocks.ibm", "x.stock.ibm"]),
    ("#.error", ["error", "app.error", "a.b.c.error"], ["error.app", "app.errors"]),
    ("#", ["", "a", "a.b.c"], []),
    ("*", ["a"], ["a.b", ""]),  # the empty key has no words
    ("a.#.z", ["a.z", "a.b.z", "a.b.c.z"], ["a.b", "z", "a.z.b"]),
    ("*.*", ["a.b", ".b", "a."], ["a", "a.b.c"]),
    ("a.*.#", ["a.b", "a.b.c", "a.b.c.d"], ["a", "b.a"]),
    ("exact.key", ["exact.key"], ["exact", "exact.key.more"]),
]


@pytest.mark.parametrize("pattern,matching,other", TOPIC_CASES)
def test_topic_exchange_star_and_hash(ch, pattern, matching, other):
    q = bound_queue(ch, "amq.topic", pattern)
    for key in matching + other:
        publish(ch, "amq.topic", key, key.encode() or b"<empty>")
    assert drain(ch, q) == [k.encode() or b"<empty>" for k in matching]


def test_user_topic_exchange_routes_to_every_matching_binding_once(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "topic")
    q = bound_queue(ch, x, "log.*")
    ch.queue_bind(q, x, "log.#")
    ch.queue_bind(q, x, "#.warn")
    other = bound_queue(ch, x, "audit.#")
    publish(ch, x, "log.warn", b"once")
    publish(ch, x, "audit.log", b"audit")
    assert drain(ch, q) == [b"once"]
    assert drain(ch, other) == [b"audit"]


@pytest.mark.parametrize("exchange", ["amq.headers", "amq.match", "user-headers"])
def test_headers_exchange_x_match_all(ch, names, exchange):
    if exchange == "user-headers":
        exchange = names.exchange()
        ch.exchange_declare(exchange, "headers")
    q = bound_queue(ch, exchange, "", {"x-match": "all", "format": "pdf", "type": "report"})
    publish(ch, exchange, "", b"both", {"format": "pdf", "type": "report"})
    publish(ch, exchange, "", b"both+extra", {"format": "pdf", "type": "report", "x": 1})
    publish(ch, exchange, "", b"one", {"format": "pdf"})
    publish(ch, exchange, "", b"wrong value", {"format": "pdf", "type": "log"})
    publish(ch, exchange, "", b"none", {})
    publish(ch, exchange, "", b"no headers", None)
    assert drain(ch, q) == [b"both", b"both+extra"]


def test_headers_exchange_x_match_any(ch):
    q = bound_queue(ch, "amq.headers", "", {"x-match": "any", "format": "pdf", "type": "report"})
    publish(ch, "amq.headers", "", b"both", {"format": "pdf", "type": "report"})
    publish(ch, "amq.headers", "", b"one", {"format": "pdf"})
    publish(ch, "amq.headers", "", b"other one", {"type": "report", "x": "y"})
    publish(ch, "amq.headers", "", b"wrong value", {"format": "zip"})
    publish(ch, "amq.headers", "", b"none", {})
    assert drain(ch, q) == [b"both", b"one", b"other one"]


def test_headers_exchange_defaults_to_x_match_all(ch):
    q = bound_queue(ch, "amq.headers", "", {"a": "1", "b": "2"})
    publish(ch, "amq.headers", "", b"both", {"a": "1", "b": "2"})
    publish(ch, "amq.headers", "", b"one", {"a": "1"})
    assert drain(ch, q) == [b"both"]


def test_headers_exchange_ignores_routing_key_and_matches_typed_values(ch):
    q = bound_queue(ch, "amq.headers", "some-key", {"x-match": "all", "n": 5})
    publish(ch, "amq.headers", "other-key", b"int", {"n": 5})
    publish(ch, "amq.headers", "", b"string", {"n": "5"})
    assert drain(ch, q) == [b"int"]


def test_headers_binding_with_no_arguments_matches_everything(ch):
    q = bound_queue(ch, "amq.headers", "", {})
    publish(ch, "amq.headers", "", b"with", {"a": "1"})
    publish(ch, "amq.headers", "", b"without", None)
    assert drain(ch, q) == [b"with", b"without"]


def test_headers_unbind_needs_the_same_arguments(ch):
    args = {"x-match": "any", "k": "v"}
    q = bound_queue(ch, "amq.headers", "", args)
    ch.queue_unbind(q, "amq.headers", "", arguments={"x-match": "any", "k": "other"})
    publish(ch, "amq.headers", "", b"still bound", {"k": "v"})
    ch.queue_unbind(q, "amq.headers", "", arguments=args)
    publish(ch, "amq.headers", "", b"unbound", {"k": "v"})
    assert drain(ch, q) == [b"still bound"]


def test_one_message_to_many_queues(ch, names):
    x = names.exchange()
    ch.exchange_declare(x, "fanout")
    queues = [bound_queue(ch, x) for _ in range(20)]
    publish(ch, x, "", b"everyone")
    for q in queues:
        assert drain(ch, q) == [b"everyone"]
