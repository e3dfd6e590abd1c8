"""Issue 16: names that made durable data vanish. A durable queue whose
name holds a zero byte keeps its confirmed persistent message across
kill -9 and a restart; names and keys longer than an AMQP shortstr (255
bytes) given to the management API get a 400 with a JSON error saying
what was wrong, not a reset connection."""

import signal

import pika
import pytest
import requests

from conftest import BerthProcess, external_uri
from test_management import Api

pytestmark = pytest.mark.skipif(
    bool(external_uri()), reason="starts and kills berth processes of its own")


@pytest.fixture
def berths():
    """Starts berth processes (with the HTTP API) and stops every one."""
    started = []

    def start(data_dir=None):
        p = BerthProcess(["--http-listen", "127.0.0.1:0"], data_dir=data_dir)
        started.append(p)
        return p
    yield start
    for p in started:
        p.stop()


def test_a_queue_with_a_zero_byte_in_its_name_keeps_its_message_across_kill_9(
        berths, tmp_path):
    data = str(tmp_path / "data")
    name = "odd\0name"
    p = berths(data_dir=data)
    conn = p.broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True)
    # Confirmed: basic_publish raises unless the broker acks it.
    ch.basic_publish("", name, b"kept",
                     properties=pika.BasicProperties(delivery_mode=2), mandatory=True)
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(10)

    again = berths(data_dir=data)
    conn = again.broker.connect()
    ch = conn.channel()
    ok = ch.queue_declare(name, passive=True)
    assert ok.method.message_count == 1
    _, _, body = ch.basic_get(name, auto_ack=True)
    assert body == b"kept"
    conn.close()


def _refused(r, *says):
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()
    assert err["error"] == "bad_request", err
    for s in says:
        assert s in err["reason"], err


def test_names_and_keys_longer_than_a_shortstr_get_a_400_not_a_reset(berths):
    api = Api(berths().broker)
    long_key = "k" * 300
    _refused(api.put("queues", "/", "q", body={"arguments": {long_key: 1}}),
             "arguments", "300 bytes long", "255")
    # The same session goes on: the connection was answered, not reset.
    assert api.put("queues", "/", "q", body={"durable": True}).status_code in (201, 204)
    _refused(api.put("exchanges", "/", "x", body={"type": "direct", "arguments":
                                                  {"alternate-exchange": "a", long_key: 1}}),
             "arguments", "300 bytes long")
    _refused(api.put("queues", "/", "q" * 256, body={"durable": True}),
             "queue name is 256 bytes long")
    _refused(api.put("queues", "/", "dl", body={"arguments": {
        "x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": long_key}}),
             "x-dead-letter-routing-key", "300 bytes long")
    _refused(api.post("exchanges", "/", "amq.default", "publish",
                      body={"routing_key": long_key, "payload": "x",
                            "properties": {}, "payload_encoding": "string"}),
             "routing key is 300 bytes long")
    _refused(api.post("exchanges", "/", "amq.direct", "publish",
                      body={"routing_key": "q", "payload": "x", "payload_encoding": "string",
                            "properties": {"headers": {long_key: 1}}}),
             "headers", "300 bytes long")
    _refused(api.post("bindings", "/", "e", "amq.direct", "q", "q",
                      body={"routing_key": long_key}),
             "routing key is 300 bytes long")
    r = requests.post(f"{api.base}/definitions", json={"queues": [{
        "name": "dq", "vhost": "/", "durable": True, "arguments": {long_key: 1}}]},
        auth=("guest", "guest"), timeout=10)
    assert r.status_code == 400, (r.status_code, r.text)
    assert "300 bytes long" in r.text, r.text
