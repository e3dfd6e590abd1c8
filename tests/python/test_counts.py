"""Count limits (`limits.queues_max`, `exchanges_max`,
`bindings_per_exchange_max`, `consumers_per_channel_max`): one more is
refused with 406 PRECONDITION_FAILED naming the limit, only that channel
closes, nothing is created, and what exists is still served."""

import pika.exceptions
import pytest

from helpers import channel_error


def test_queue_one_past_queues_max_is_406_and_redeclaring_still_works(start_berth):
    b = start_berth("--queues-max", 3)
    conn = b.connect()
    try:
        ch = conn.channel()
        for n in ("q1", "q2", "q3"):
            ch.queue_declare(n)
        with channel_error(406, 50, 10, text="PRECONDITION_FAILED - cannot declare queue 'q4' "
                           "in vhost '/': vhost queue limit (3) is reached"):
            ch.queue_declare("q4")
        ch = conn.channel()
        ch.queue_declare("q1")  # an existing queue is not a new one
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("q4", passive=True)
        assert e.value.reply_code == 404
    finally:
        conn.close()


def test_exchange_one_past_exchanges_max_is_406(start_berth):
    b = start_berth("--exchanges-max", 12)
    conn = b.connect()
    try:
        ch = conn.channel()
        refused = None
        for i in range(13):
            try:
                ch.exchange_declare(f"x{i}", "direct")
            except pika.exceptions.ChannelClosedByBroker as err:
                refused = (i, err)
                break
        assert refused is not None, "13 exchanges declared past exchanges_max = 12"
        i, err = refused
        assert err.reply_code == 406 and "limits.exchanges_max" in err.reply_text, err
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.exchange_declare(f"x{i}", "direct", passive=True)
    finally:
        conn.close()


def test_binding_one_past_bindings_per_exchange_max_is_406(start_berth):
    b = start_berth("--bindings-per-exchange-max", 2)
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.exchange_declare("bx", "direct")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "bx", "a")
        ch.queue_bind(q, "bx", "b")
        with channel_error(406, 50, 20):
            ch.queue_bind(q, "bx", "c")
        ch = conn.channel()
        ch.basic_publish("bx", "b", b"still routed")
        assert ch.basic_get(q, auto_ack=True)[2] == b"still routed"
    finally:
        conn.close()


def test_consumer_one_past_consumers_per_channel_max_is_406(start_berth):
    b = start_berth("--consumers-per-channel-max", 2)
    conn = b.connect()
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_consume(q, lambda *a: None, consumer_tag="c1")
        ch.basic_consume(q, lambda *a: None, consumer_tag="c2")
        with channel_error(406, 60, 20, text="PRECONDITION_FAILED - reached maximum (2) of "
                           "consumers per channel"):
            ch.basic_consume(q, lambda *a: None, consumer_tag="c3")
        # Another channel has its own count.
        ch2 = conn.channel()
        ch2.basic_consume(q, lambda *a: None, consumer_tag="d1")
    finally:
        conn.close()
