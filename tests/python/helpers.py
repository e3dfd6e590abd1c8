"""Helpers shared by the test modules: unique names, error assertions, waits."""

import time
import uuid
from contextlib import contextmanager

import pika.exceptions
import pytest


def unique(prefix="t"):
    return f"pytest-{prefix}-{uuid.uuid4().hex[:12]}"



# --------------------------------------------------------------------------
# Assertions on errors
# --------------------------------------------------------------------------
@contextmanager
def channel_error(code, class_id=None, method_id=None, text=None):
    """The body must end in Channel.Close with this reply code (and, if
    given, class/method ids and a reply_text containing `text`)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        yield info
    _check_close(info.value, code, class_id, method_id, text)


@contextmanager
def connection_error(code, class_id=None, method_id=None, text=None):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        yield info
    _check_close(info.value, code, class_id, method_id, text)


def _check_close(err, code, class_id, method_id, text):
    assert err.reply_code == code, f"expected {code}, got {err.reply_code} {err.reply_text!r}"
    if class_id is not None:
        assert (getattr(err, "class_id", None), getattr(err, "method_id", None)) == \
            (class_id, method_id), f"offending method ids in {err!r}"
    if text is not None:
        assert text in err.reply_text, err.reply_text


def wait_until(predicate, timeout_s=5.0, interval_s=0.05, conn=None):
    """Polls predicate() until it is true; processes pika I/O if conn given."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return value
        if conn is not None:
            conn.process_data_events(time_limit=interval_s)
        else:
            time.sleep(interval_s)


def drain(ch, queue, limit=10000):
    """basic.get with auto-ack until get-empty; returns the bodies."""
    bodies = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    return bodies


def publish_confirmed(ch, routing_key, bodies, exchange="", properties=None):
    """Publishes on a separate confirm-mode channel of ch's connection and
    waits for every confirm. RabbitMQ answers queue.declare's message_count
    ahead of deliveries still in flight, so counts are asserted only after
    confirms (which a queue sends once it holds the message)."""
    pub = ch.connection.channel()
    pub.confirm_delivery()
    for body in bodies:
        pub.basic_publish(exchange, routing_key, body, properties)
    pub.close()
