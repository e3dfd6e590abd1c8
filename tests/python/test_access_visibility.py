"""What a user may see through the management API (RabbitMQ's rule: a
`management` user sees the objects of the vhosts it has permissions in and
its own connections; `monitoring` and `administrator` see everything), and
the definitions export of users and permissions (administrator only; a
fresh berth that imports it lets the users log in with their passwords).

Each test starts its own berth (test_access.AuthBerth) and stops it."""

import urllib.parse

import pika.exceptions
import pytest

from test_access import berths  # noqa: F401 (the fixture: berths of their own)

LISTS = ("queues", "exchanges", "bindings", "connections", "channels", "consumers", "vhosts")


def _vhosts_in(berth, what, user, password):
    status, items = berth.api("GET", f"/api/{what}", user=user, password=password)
    assert status == 200, (what, status, items)
    key = "name" if what == "vhosts" else "vhost"
    if what == "consumers":
        return {c["queue"]["vhost"] for c in items}
    return {i[key] for i in items}


def test_a_management_user_lists_only_objects_of_its_vhosts(berths):
    berth = berths()
    berth.ok("PUT", "/api/vhosts/a")
    berth.ok("PUT", "/api/vhosts/b")
    for v in ("a", "b"):
        berth.ok("PUT", f"/api/permissions/{v}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    berth.add_user("ua", "pw", tags="management", vhost="a")
    berth.add_user("watcher", "pw", tags="monitoring", perms=None)
    opened = []
    try:
        # guest opens a connection, a channel and a consumer in each vhost;
        # ua one connection in a.
        for v in ("a", "b"):
            c = berth.connect(vhost=v)
            opened.append(c)
            ch = c.channel()
            ch.queue_declare(f"q-{v}")
            ch.basic_consume(f"q-{v}", lambda *_: None)
        mine = berth.connect("ua", "pw", vhost="a")
        opened.append(mine)
        mine.channel()

        for what in LISTS:
            seen = _vhosts_in(berth, what, "ua", "pw")
            assert "b" not in seen and "/" not in seen, (what, seen)
            assert seen == {"a"}, (what, seen)
            everything = _vhosts_in(berth, what, "watcher", "pw")
            assert {"a", "b"} <= everything, (what, everything)
            assert _vhosts_in(berth, what, "guest", "guest") == everything, what

        # The overview's totals cover what the user sees.
        status, mine_totals = berth.api("GET", "/api/overview", user="ua", password="pw")
        assert status == 200
        assert mine_totals["object_totals"]["queues"] == 1, mine_totals
        assert mine_totals["object_totals"]["connections"] == 1, mine_totals
        assert mine_totals["object_totals"]["consumers"] == 1, mine_totals
        status, all_totals = berth.api("GET", "/api/overview", user="watcher", password="pw")
        assert all_totals["object_totals"]["queues"] == 2, all_totals
        assert all_totals["object_totals"]["connections"] == 3, all_totals

        # Connections: a management user sees its own only, even in a.
        status, conns = berth.api("GET", "/api/connections", user="ua", password="pw")
        assert status == 200 and {c["user"] for c in conns} == {"ua"}, conns
        status, conns = berth.api("GET", "/api/connections")
        guests = [c["name"] for c in conns if c["user"] == "guest"]
        assert len(guests) == 2
        name = urllib.parse.quote(guests[0], safe="")
        assert berth.api("GET", f"/api/connections/{name}", user="ua", password="pw")[0] == 404
        assert berth.api("DELETE", f"/api/connections/{name}", user="ua", password="pw")[0] == 404
        # monitoring sees it but may not close it.
        assert berth.api("GET", f"/api/connections/{name}", user="watcher", password="pw")[0] == 200
        status, out = berth.api("DELETE", f"/api/connections/{name}", user="watcher", password="pw")
        assert status == 401, out

        # Per-vhost lists of a vhost the user may not see: 401, as RabbitMQ.
        for what in ("queues", "exchanges", "bindings", "consumers"):
            status, out = berth.api("GET", f"/api/{what}/b", user="ua", password="pw")
            assert status == 401, (what, status, out)
            assert out["reason"] == "User not authorised to access virtual host"
            assert berth.api("GET", f"/api/{what}/a", user="ua", password="pw")[0] == 200
        for what in ("connections", "channels"):
            assert berth.api("GET", f"/api/vhosts/b/{what}", user="ua", password="pw")[0] == 401
    finally:
        for c in opened:
            if c.is_open:
                c.close()


def test_definitions_export_users_and_permissions_that_import_with_their_passwords(berths):
    source = berths()
    source.ok("PUT", "/api/vhosts/shop")
    source.add_user("alice", "alice-secret", tags="management", vhost="shop",
                    perms=("^alice\\.", ".*", ".*"))
    source.ok("PUT", "/api/topic-permissions/shop/alice",
              {"exchange": "amq.topic", "write": "^orders\\.", "read": ".*"})
    # Only administrators export (the export carries password hashes).
    status, out = source.api("GET", "/api/definitions", user="alice", password="alice-secret")
    assert status == 401 and out["reason"] == "Not administrator user"

    exported = source.ok("GET", "/api/definitions")
    users = {u["name"]: u for u in exported["users"]}
    assert set(users) == {"guest", "alice"}
    alice = users["alice"]
    # As RabbitMQ 3.10 writes a user (tests/python/fixtures/rabbitmq-3.10-definitions.json).
    assert set(alice) == {"name", "password_hash", "hashing_algorithm", "tags", "limits"}
    assert alice["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert alice["tags"] == ["management"] and len(alice["password_hash"]) == 48
    assert {"user": "alice", "vhost": "shop", "configure": "^alice\\.", "write": ".*",
            "read": ".*"} in exported["permissions"]
    assert exported["topic_permissions"] == [
        {"user": "alice", "vhost": "shop", "exchange": "amq.topic", "write": "^orders\\.",
         "read": ".*"}]

    target = berths()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        target.connect("alice", "alice-secret", vhost="shop")
    report = target.ok("POST", "/api/definitions", exported)
    # guest's in / and, as shop's creator, in shop (RabbitMQ grants the
    # creator of a vhost full permissions there); alice's in shop.
    assert report["imported"]["users"] == 2 and report["imported"]["permissions"] == 3
    assert report["imported"]["topic_permissions"] == 1
    # alice logs in with her password over AMQP and HTTP; her permissions came along.
    c = target.connect("alice", "alice-secret", vhost="shop")
    c.channel().queue_declare("alice.q")
    c.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        target.connect("alice", "wrong", vhost="shop")
    status, me = target.api("GET", "/api/whoami", user="alice", password="alice-secret")
    assert status == 200 and me["name"] == "alice"
    again = target.ok("GET", "/api/definitions")
    for k in ("users", "permissions", "topic_permissions", "vhosts"):
        assert sorted(map(str, again[k])) == sorted(map(str, exported[k])), k


NOT_IN_VHOST = "User not authorised to access virtual host"


def test_a_management_user_acts_through_the_api_only_where_its_permissions_allow(berths):
    # RabbitMQ 3.10.8 answered each of these (checked on a private node):
    # 401 "User not authorised to access virtual host" in a vhost the user
    # has no permissions in, 401 "Access refused." for an action its
    # permissions do not cover. berth let a management user read, delete,
    # purge and publish in every vhost through the API.
    berth = berths()
    berth.ok("PUT", "/api/vhosts/a")
    berth.ok("PUT", "/api/permissions/a/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    berth.add_user("m", "pw", tags="management", vhost="a", perms=("^own", "^own", "^own"))
    berth.add_user("watcher", "pw", tags="monitoring", perms=None)
    berth.ok("PUT", "/api/queues/%2F/victim", {})
    berth.ok("PUT", "/api/queues/a/theirs", {})
    msg = {"properties": {}, "routing_key": "victim", "payload": "x", "payload_encoding": "string"}
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}

    def as_m(method, path, body=None, user="m"):
        return berth.api(method, path, body, user=user, password="pw")

    # Another vhost: nothing, not even a read.
    for method, path, body in [
        ("GET", "/api/queues/%2F/victim", None),
        ("PUT", "/api/queues/%2F/x", {}),
        ("DELETE", "/api/queues/%2F/victim", None),
        ("DELETE", "/api/queues/%2F/victim/contents", None),
        ("POST", "/api/queues/%2F/victim/get", get),
        ("POST", "/api/exchanges/%2F/amq.default/publish", msg),
        ("GET", "/api/exchanges/%2F/amq.direct", None),
        ("PUT", "/api/exchanges/%2F/x", {"type": "direct"}),
        ("GET", "/api/bindings/%2F/e/amq.direct/q/victim", None),
        ("POST", "/api/bindings/%2F/e/amq.direct/q/victim", {"routing_key": "k"}),
        ("GET", "/api/aliveness-test/%2F", None),
    ]:
        status, out = as_m(method, path, body)
        assert (status, out and out.get("reason")) == (401, NOT_IN_VHOST), (method, path, status, out)

    # Its own vhost: what the permissions (^own) allow, and no more.
    for method, path, body in [
        ("PUT", "/api/queues/a/notown", {}),
        ("DELETE", "/api/queues/a/theirs", None),
        ("DELETE", "/api/queues/a/theirs/contents", None),
        ("POST", "/api/queues/a/theirs/get", get),
        ("POST", "/api/exchanges/a/amq.default/publish", dict(msg, routing_key="theirs")),
        ("PUT", "/api/exchanges/a/notown", {"type": "direct"}),
        ("POST", "/api/bindings/a/e/amq.direct/q/theirs", {"routing_key": "k"}),
    ]:
        status, out = as_m(method, path, body)
        assert (status, out and out.get("reason")) == (401, "Access refused."), (method, path, status, out)
    assert as_m("PUT", "/api/queues/a/own-q", {})[0] == 201
    assert as_m("PUT", "/api/exchanges/a/own-x", {"type": "fanout"})[0] == 201
    assert as_m("POST", "/api/bindings/a/e/own-x/q/own-q", {"routing_key": "k"})[0] == 201
    assert as_m("POST", "/api/exchanges/a/own-x/publish",
                dict(msg, routing_key="k"))[1] == {"routed": True}
    status, got = as_m("POST", "/api/queues/a/own-q/get", get)
    assert status == 200 and [g["payload"] for g in got] == ["x"], (status, got)
    assert as_m("DELETE", "/api/queues/a/own-q/contents")[0] == 204
    assert as_m("DELETE", "/api/queues/a/own-q")[0] == 204

    # A monitoring user sees every vhost but changes nothing without
    # permissions.
    assert as_m("GET", "/api/queues/%2F/victim", user="watcher")[0] == 200
    status, out = as_m("DELETE", "/api/queues/%2F/victim", user="watcher")
    assert (status, out and out.get("reason")) == (401, "Access refused."), (status, out)

    # Nothing was touched.
    assert berth.api("GET", "/api/queues/%2F/victim")[0] == 200
    assert berth.api("GET", "/api/queues/a/theirs")[0] == 200
    assert berth.api("GET", "/api/exchanges/a/notown")[0] == 404


def test_a_policymaker_changes_and_sees_policies_only_in_its_vhosts(berths):
    berth = berths()
    berth.ok("PUT", "/api/vhosts/a")
    berth.add_user("pm", "pw", tags="policymaker", vhost="a")
    policy = {"pattern": "^q", "definition": {"max-length": 5}}
    berth.ok("PUT", "/api/policies/%2F/root-policy", policy)

    def as_pm(method, path, body=None):
        return berth.api(method, path, body, user="pm", password="pw")

    for method, path, body in [
        ("PUT", "/api/policies/%2F/p", policy),
        ("DELETE", "/api/policies/%2F/root-policy", None),
        ("GET", "/api/policies/%2F/root-policy", None),
        ("GET", "/api/policies/%2F", None),
    ]:
        status, out = as_pm(method, path, body)
        assert (status, out and out.get("reason")) == (401, NOT_IN_VHOST), (method, path, status, out)
    assert as_pm("PUT", "/api/policies/a/p", policy)[0] == 201
    status, listed = as_pm("GET", "/api/policies")
    assert status == 200 and [(p["vhost"], p["name"]) for p in listed] == [("a", "p")], listed
    assert berth.api("GET", "/api/policies/%2F/root-policy")[0] == 200
