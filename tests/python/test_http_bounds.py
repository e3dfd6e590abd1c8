"""The management API keeps the broker's bounds (issue 16 item 10): an
HTTP publish is refused while a resource alarm is on, as an AMQP
publisher is blocked, and one `POST .../get` answer is bounded in bytes
(`HTTP_GET_BODY_BYTES_MAX` in crates/server/src/limits.rs, 16 MiB): the
messages past the bound stay in the queue.

Each test starts its own berth (test_access.AuthBerth) and stops it."""

from test_access import berths  # noqa: F401 (the fixture: berths of their own)

GET_BODY_BYTES_MAX = 16 << 20
PUBLISH = {"routing_key": "q", "payload": "hello", "payload_encoding": "string",
           "properties": {"delivery_mode": 2}}


def test_http_publish_is_refused_while_the_disk_alarm_is_on(berths):
    # No filesystem has an exabyte free: the alarm is on from the start.
    berth = berths("--disk-free-bytes-min", str(1 << 60))
    berth.ok("PUT", "/api/queues/%2F/q", {"durable": True})
    status, out = berth.api("POST", "/api/exchanges/%2F/amq.default/publish", PUBLISH)
    assert status == 503, (status, out)
    assert out["error"] == "resource_alarm" and "disk" in out["reason"], out
    status, q = berth.api("GET", "/api/queues/%2F/q")
    assert q["messages"] == 0, q


def test_http_get_answer_is_bounded_in_bytes(berths):
    berth = berths()
    berth.ok("PUT", "/api/queues/%2F/big", {"durable": False})
    # Over AMQP: the API takes request bodies of at most 2 MB.
    c = berth.connect()
    ch = c.channel()
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", "big", b"x" * (7 << 20))
    # Three 7 MiB bodies pass the 16 MiB bound: two come back, the third
    # stays in the queue (and with ack_requeue_false, only two are acked).
    status, got = berth.api("POST", "/api/queues/%2F/big/get",
                            {"count": 3, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert status == 200
    assert [m["payload_bytes"] for m in got] == [7 << 20, 7 << 20]
    assert sum(len(m["payload"]) for m in got) <= GET_BODY_BYTES_MAX
    status, q = berth.api("GET", "/api/queues/%2F/big")
    assert q["messages"] == 1, q
    # A message larger than the bound alone still comes back (else it
    # could never be read through the API), alone.
    ch.basic_publish("", "big", b"y" * (17 << 20))
    c.close()
    status, got = berth.api("POST", "/api/queues/%2F/big/get",
                            {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert [m["payload_bytes"] for m in got] == [7 << 20]
    berth.api("POST", "/api/queues/%2F/big/get",
              {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    status, got = berth.api("POST", "/api/queues/%2F/big/get",
                            {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert [m["payload_bytes"] for m in got] == [17 << 20]
