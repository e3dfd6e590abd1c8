"""Policies and operator policies through the management API of the real
binary, acting on queues and exchanges through pika: TTL and
dead-lettering on an existing queue, max-length acting at once, overflow,
an operator policy capping a queue argument, priority, apply-to exchanges
with alternate-exchange, validation (400), vhost deletion, and policies
surviving kill -9."""

import os
import signal
import time

import pika
import pika.exceptions
import pytest
import requests

from conftest import BerthProcess, Broker, external_uri
from helpers import unique
from test_management import Api

# RabbitMQ's management stats lag by its collection interval (5 s).
WAIT_S = 15 if external_uri() else 5


class _External:
    """RabbitMQ (or another broker) under test: BERTH_TEST_URI and
    BERTH_TEST_HTTP_PORT name its AMQP and HTTP ports (tests/python/README.md)."""

    def __init__(self):
        p = pika.URLParameters(external_uri())
        self.broker = Broker(p.host, p.port, is_berth=False,
                             http_port=int(os.environ["BERTH_TEST_HTTP_PORT"]))


@pytest.fixture
def berth():
    """A berth of its own (policies apply vhost-wide), or the external broker
    when BERTH_TEST_URI and BERTH_TEST_HTTP_PORT are set, so the same
    scenarios run against RabbitMQ; there every policy is deleted after each
    test."""
    if external_uri():
        if not os.environ.get("BERTH_TEST_HTTP_PORT"):
            pytest.skip("needs BERTH_TEST_HTTP_PORT with BERTH_TEST_URI")
        ext = _External()

        def external(data_dir=None):
            if data_dir is not None:
                pytest.skip("restarts the broker")
            return ext
        yield external
        api = Api(ext.broker)
        for kind in ("policies", "operator-policies"):
            for p in api.get(kind).json():
                api.delete(kind, p["vhost"], p["name"])
        return
    started = []

    def start(data_dir=None):
        p = BerthProcess(["--http-listen", "127.0.0.1:0"], data_dir=data_dir)
        started.append(p)
        return p
    yield start
    for p in started:
        p.stop()


def _eventually(check, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S}s: {what}")


def _put_policy(api, name, pattern, definition, kind="policies", **extra):
    r = api.put(kind, "/", name, body={"pattern": pattern, "definition": definition, **extra})
    assert r.status_code in (201, 204), r.text
    return r


def _ready(api, q):
    # RabbitMQ's counts lag (its stats are emitted every few seconds), so
    # every check of them waits.
    return api.get("queues", "/", q).json().get("messages_ready")


def _policy_of(api, q, field, expected):
    """The queue as shown once its `field` is `expected` (RabbitMQ's lag)."""
    got = {}

    def shown():
        got.clear()
        got.update(api.get("queues", "/", q).json())
        return got.get(field) == expected
    _eventually(shown, f"queue {q} shows {field} {expected!r}")
    return got


def test_ttl_and_dead_letter_policy_on_an_existing_queue_dead_letters(berth):
    b = berth().broker
    api = Api(b)
    conn = b.connect()
    ch = conn.channel()
    q, dlq = unique("ttl-q"), unique("ttl-dlq")
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, "dlx")
    ch.queue_declare(q)  # no arguments: the policy alone acts
    r = _put_policy(api, "ttl-dlx", f"^{q}$", {"message-ttl": 100, "dead-letter-exchange": "dlx"},
                    **{"apply-to": "queues"})
    assert r.status_code == 201
    shown = _policy_of(api, q, "policy", "ttl-dlx")
    assert shown["operator_policy"] is None
    assert shown["effective_policy_definition"] == {"message-ttl": 100,
                                                    "dead-letter-exchange": "dlx"}
    assert shown["arguments"] == {}
    ch.basic_publish("", q, b"late")
    _eventually(lambda: _ready(api, dlq) == 1, "message dead-lettered after the policy TTL")
    _eventually(lambda: _ready(api, q) == 0, "source queue empty")
    _, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"late" and props.headers["x-death"][0]["reason"] == "expired"
    # Deleting the policy puts the declared settings back: no TTL.
    assert api.delete("policies", "/", "ttl-dlx").status_code == 204
    _policy_of(api, q, "policy", None)
    ch.basic_publish("", q, b"stays")
    time.sleep(0.3)
    _eventually(lambda: _ready(api, q) == 1, "message kept without the policy's TTL")
    time.sleep(0.3)
    assert ch.basic_get(q, auto_ack=True)[2] == b"stays"
    conn.close()


def test_max_length_policy_trims_at_once_and_overflow_rejects_publishes(berth):
    b = berth().broker
    api = Api(b)
    conn = b.connect()
    ch = conn.channel()
    q = unique("len-q")
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    _eventually(lambda: _ready(api, q) == 5, "5 ready")
    _put_policy(api, "len", f"^{q}$", {"max-length": 2})
    _eventually(lambda: _ready(api, q) == 2, "a lower limit drops from the head")
    assert ch.basic_get(q, auto_ack=True)[2] == b"3"
    _put_policy(api, "len", f"^{q}$", {"max-length": 1, "overflow": "reject-publish"})
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"refused")
    _eventually(lambda: _ready(api, q) == 1, "the refused message is not queued")
    conn.close()


def test_operator_policy_caps_a_queue_argument_and_a_policy(berth):
    b = berth().broker
    api = Api(b)
    conn = b.connect()
    ch = conn.channel()
    q = unique("cap-q")
    ch.queue_declare(q, arguments={"x-max-length": 10})
    _put_policy(api, "big", f"^{q}$", {"max-length": 20})
    _put_policy(api, "cap", ".*", {"max-length": 3}, kind="operator-policies")
    shown = _policy_of(api, q, "operator_policy", "cap")
    assert shown["policy"] == "big"
    assert shown["effective_policy_definition"] == {"max-length": 3}
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    _eventually(lambda: _ready(api, q) == 3, "capped at the operator policy's 3")
    # Without the operator policy the lower of argument and policy (10) holds.
    assert api.delete("operator-policies", "/", "cap").status_code == 204
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    _eventually(lambda: _ready(api, q) == 10, "argument's 10 after the cap is gone")
    assert [p["name"] for p in api.get("operator-policies").json()] == []
    conn.close()


def test_the_highest_priority_policy_is_the_one_applied(berth):
    b = berth().broker
    api = Api(b)
    conn = b.connect()
    ch = conn.channel()
    q = unique("prio-q")
    ch.queue_declare(q)
    _put_policy(api, "low", "prio", {"max-length": 1}, priority=1)
    _put_policy(api, "high", "^pytest-prio", {"max-length": 4}, priority=5)
    _policy_of(api, q, "policy", "high")
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    _eventually(lambda: _ready(api, q) == 4, "the priority-5 policy's limit")
    listed = api.get("policies", "/").json()
    assert sorted((p["name"], p["priority"], p["apply-to"]) for p in listed) == [
        ("high", 5, "all"), ("low", 1, "all")]
    conn.close()


def test_apply_to_exchanges_sets_an_alternate_exchange(berth):
    b = berth().broker
    api = Api(b)
    conn = b.connect()
    ch = conn.channel()
    x, alt_q = unique("ae-x"), unique("ae-q")
    ch.exchange_declare(x, "direct")
    ch.exchange_declare("ae-alt", "fanout")
    ch.queue_declare(alt_q)
    ch.queue_bind(alt_q, "ae-alt")
    # A policy for queues only does not touch the exchange.
    _put_policy(api, "q-only", "ae-", {"max-length": 5}, **{"apply-to": "queues"})
    assert "policy" not in api.get("exchanges", "/", x).json()
    _put_policy(api, "ae", "^pytest-ae-x", {"alternate-exchange": "ae-alt"},
                **{"apply-to": "exchanges"})
    _eventually(lambda: api.get("exchanges", "/", x).json().get("policy") == "ae",
                "exchange shows its policy")
    ch.basic_publish(x, "nowhere", b"unroutable")
    _eventually(lambda: _ready(api, alt_q) == 1, "routed to the policy's alternate exchange")
    conn.close()


@pytest.mark.parametrize("kind,body,why", [
    ("policies", {"pattern": ".*", "definition": {"no-such-key": 1}}, "no-such-key"),
    ("policies", {"pattern": ".*", "definition": {"max-length": "ten"}}, "max-length"),
    ("policies", {"pattern": ".*", "definition": {"expires": 0}}, "expires"),
    ("policies", {"pattern": "(", "definition": {"max-length": 1}}, "regular expression"),
    ("policies", {"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "bindings"},
     "apply-to"),
    ("policies", {"pattern": ".*", "definition": {"federation-upstream": "up"}},
     "federation-upstream"),
    ("operator-policies", {"pattern": ".*", "definition": {"dead-letter-exchange": "d"}},
     "operator policy"),
    ("policies", {"pattern": ".*"}, "definition"),
])
def test_invalid_policies_are_a_400_naming_the_problem(berth, kind, body, why):
    b = berth().broker
    api = Api(b)
    r = api.put(kind, "/", "bad", body=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request", r.text
    if b.is_berth:  # RabbitMQ's texts do not always name the key
        assert why in r.json()["reason"], r.text
    assert api.get(kind, "/", "bad").status_code == 404


def test_mirroring_keys_are_accepted_without_effect(berth):
    api = Api(berth().broker)
    _put_policy(api, "ha", ".*", {"ha-mode": "all", "queue-mode": "lazy"})
    assert api.get("policies", "/", "ha").json()["definition"] == {"ha-mode": "all",
                                                                   "queue-mode": "lazy"}


def test_deleting_a_vhost_deletes_its_policies(berth):
    api = Api(berth().broker)
    assert api.put("vhosts", "pv").status_code in (201, 204)
    r = api.put("policies", "pv", "p", body={"pattern": ".*", "definition": {"max-length": 1}})
    assert r.status_code == 201, r.text
    assert api.delete("vhosts", "pv").status_code == 204
    assert api.put("vhosts", "pv").status_code in (201, 204)
    assert api.get("policies", "pv").json() == []


def test_policies_survive_kill_9(berth, tmp_path):
    data = str(tmp_path / "data")
    p = berth(data_dir=data)
    api = Api(p.broker)
    _put_policy(api, "keep", "^kept", {"max-length": 2}, priority=7)
    _put_policy(api, "opcap", ".*", {"message-ttl": 60000}, kind="operator-policies")
    r = api.put("policies", "/", "gone", body={"pattern": ".*", "definition": {"max-length": 9}})
    assert r.status_code == 201
    assert api.delete("policies", "/", "gone").status_code == 204
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(10)
    again = berth(data_dir=data)
    api = Api(again.broker)
    kept = api.get("policies", "/", "keep").json()
    assert (kept["pattern"], kept["priority"], kept["definition"]) == ("^kept", 7,
                                                                       {"max-length": 2})
    assert api.get("policies", "/", "gone").status_code == 404
    assert api.get("operator-policies", "/", "opcap").status_code == 200
    conn = again.broker.connect()
    ch = conn.channel()
    ch.queue_declare("kept-q")
    for i in range(4):
        ch.basic_publish("", "kept-q", str(i).encode())
    _eventually(lambda: _ready(api, "kept-q") == 2, "restored policy applies to a new queue")
    conn.close()


def test_policymaker_changes_policies_but_only_administrator_operator_policies(berth):
    b = berth().broker
    api = Api(b)
    body = {"pattern": "^never$", "definition": {"max-length": 1}}
    for user, tags in (("pol-mgmt", "management"), ("pol-maker", "policymaker")):
        assert api.put("users", user, body={"password": "pw", "tags": tags}).status_code in (201, 204)
        r = api.put("permissions", "/", user, body={"configure": ".*", "write": ".*", "read": ".*"})
        assert r.status_code in (201, 204), r.text
    try:
        url = f"http://127.0.0.1:{b.http_port}/api"
        put = lambda user, path: requests.put(f"{url}/{path}", json=body,
                                              auth=(user, "pw"), timeout=10)
        assert put("pol-mgmt", "policies/%2F/by-mgmt").status_code == 401
        assert put("pol-maker", "policies/%2F/by-maker").status_code == 201
        assert put("pol-maker", "operator-policies/%2F/by-maker").status_code == 401
        assert api.get("policies", "/", "by-mgmt").status_code == 404
        assert api.get("operator-policies", "/", "by-maker").status_code == 404
    finally:
        for user in ("pol-mgmt", "pol-maker"):
            api.delete("users", user)
