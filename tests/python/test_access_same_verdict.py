"""One permission verdict through both front doors (issue 16 item 9):
every case runs once over AMQP (pika) and once through the management
API, and both must give the same verdict — topic permissions on publish
and bind, a `user_id` that is not the user's, and the dead-letter and
alternate exchange checks of a declare.

Starts its own berth (test_access.AuthBerth) and stops it."""

import pika
import pika.exceptions

from test_access import berth  # noqa: F401 (the fixture: a berth of its own)

USER, PASSWORD = "u", "pw"
PERMS = (r"^u\.", r"^(u\.|amq\.topic)", r"^(u\.|amq\.topic)")


def publish(exchange, key, user_id=None):
    def amqp(ch, _door):
        props = pika.BasicProperties(user_id=user_id) if user_id else None
        ch.basic_publish(exchange, key, b"m", props)

    def http(b, _door):
        props = {"user_id": user_id} if user_id else {}
        return b.api("POST", f"/api/exchanges/%2F/{exchange}/publish",
                     {"routing_key": key, "payload": "m", "payload_encoding": "string",
                      "properties": props}, user=USER, password=PASSWORD)[0]
    return amqp, http


def bind(key):
    def amqp(ch, _door):
        ch.queue_bind("u.q", "amq.topic", key)

    def http(b, _door):
        return b.api("POST", "/api/bindings/%2F/e/amq.topic/q/u.q", {"routing_key": key},
                     user=USER, password=PASSWORD)[0]
    return amqp, http


def declare_queue(name, dlx):
    def amqp(ch, door):
        ch.queue_declare(f"{name}.{door}", arguments={"x-dead-letter-exchange": dlx})

    def http(b, door):
        return b.api("PUT", f"/api/queues/%2F/{name}.{door}",
                     {"durable": True, "arguments": {"x-dead-letter-exchange": dlx}},
                     user=USER, password=PASSWORD)[0]
    return amqp, http


def declare_exchange(name, ae):
    def amqp(ch, door):
        ch.exchange_declare(f"{name}.{door}", "fanout", arguments={"alternate-exchange": ae})

    def http(b, door):
        return b.api("PUT", f"/api/exchanges/%2F/{name}.{door}",
                     {"type": "fanout", "arguments": {"alternate-exchange": ae}},
                     user=USER, password=PASSWORD)[0]
    return amqp, http


# (case, (amqp, http), allowed?)
CASES = [
    ("publish inside the topic permission", publish("amq.topic", "alice.x"), True),
    ("publish outside the topic permission", publish("amq.topic", "bob.x"), False),
    ("publish to an exchange without write", publish("forbidden-x", "k"), False),
    ("publish with the user's own user_id", publish("amq.topic", "alice.x", USER), True),
    ("publish with another user's user_id", publish("amq.topic", "alice.x", "guest"), False),
    ("bind inside the topic permission", bind("alice.#"), True),
    ("bind outside the topic permission", bind("bob.#"), False),
    ("queue with a writable dead-letter exchange", declare_queue("u.dl-ok", "u.x"), True),
    ("queue with a dead-letter exchange without write", declare_queue("u.dl-no", "forbidden-x"), False),
    ("exchange with a writable alternate", declare_exchange("u.ae-ok", "u.x"), True),
    ("exchange with an alternate without write", declare_exchange("u.ae-no", "forbidden-x"), False),
]


def amqp_verdict(berth, run):
    c = berth.connect(USER, PASSWORD)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        try:
            run(ch, "amqp")
            # A refused publish closes the channel: a round trip sees it.
            ch.basic_qos(prefetch_count=1)
            return True
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code in (403, 406), e
            return False
    finally:
        if c.is_open:
            c.close()


def test_amqp_and_http_give_the_same_verdict(berth):  # noqa: F811
    berth.add_user(USER, PASSWORD, tags="management", perms=PERMS)
    berth.ok("PUT", f"/api/topic-permissions/%2F/{USER}",
             {"exchange": "amq.topic", "write": r"^alice\.", "read": r"^alice\."})
    berth.ok("PUT", "/api/queues/%2F/u.q", {"durable": True})
    berth.ok("PUT", "/api/exchanges/%2F/u.x", {"type": "fanout"})
    berth.ok("PUT", "/api/exchanges/%2F/forbidden-x", {"type": "fanout"})
    verdicts = []
    for case, (amqp, http), allowed in CASES:
        over_amqp = amqp_verdict(berth, amqp)
        status = http(berth, "http")
        assert status in (200, 201, 204, 400, 401), (case, status)
        over_http = status in (200, 201, 204)
        verdicts.append((case, allowed, over_amqp, over_http))
    wrong = [v for v in verdicts if not v[1] == v[2] == v[3]]
    assert not wrong, "(case, expected, amqp, http): " + repr(wrong)
