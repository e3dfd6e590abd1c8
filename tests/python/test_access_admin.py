"""Administrators as RabbitMQ treats them (issue 16 item 12): creating a
vhost through the API grants its creator full permissions there, and an
administrator without permissions in a vhost is refused there every action
RabbitMQ's management plugin runs through an AMQP channel (declare, delete,
purge, bind, publish, get) with RabbitMQ 3.10's 401 "Access refused.";
reading stays open, as it is in RabbitMQ. The JSON fields RabbitMQ returns
for vhosts and exchanges are there too (what the Terraform provider reads).

Each test starts its own berth (test_access.AuthBerth) and stops it."""

from test_access import berth  # noqa: F401 (the fixture: a berth of its own)

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def test_creating_a_vhost_grants_its_creator_full_permissions(berth):
    status, _ = berth.api("PUT", "/api/vhosts/made")
    assert status == 201
    status, p = berth.api("GET", "/api/permissions/made/guest")
    assert status == 200, p
    assert (p["configure"], p["write"], p["read"]) == (".*", ".*", ".*")
    # Only a creation grants: a PUT of an existing vhost leaves the
    # permissions as they are (RabbitMQ's maybe_grant_full_permissions).
    berth.ok("DELETE", "/api/permissions/made/guest")
    status, _ = berth.api("PUT", "/api/vhosts/made")
    assert status == 204
    assert berth.api("GET", "/api/permissions/made/guest")[0] == 404


def test_an_administrator_without_permissions_is_refused_in_the_vhost(berth):
    berth.ok("PUT", "/api/vhosts/v")
    berth.ok("PUT", "/api/queues/v/q", {"durable": True})
    berth.ok("PUT", "/api/exchanges/v/x", {"type": "fanout"})
    # (On a berth that grants nothing at creation there is nothing to
    # delete: the refusals below are what this test pins.)
    berth.api("DELETE", "/api/permissions/v/guest")
    assert berth.api("GET", "/api/permissions/v/guest")[0] == 404
    refused = [
        ("PUT", "/api/queues/v/q2", {"durable": True}),
        ("DELETE", "/api/queues/v/q", None),
        ("DELETE", "/api/queues/v/q/contents", None),
        ("PUT", "/api/exchanges/v/x2", {"type": "direct"}),
        ("DELETE", "/api/exchanges/v/x", None),
        ("POST", "/api/bindings/v/e/x/q/q", {"routing_key": "k"}),
        ("POST", "/api/exchanges/v/x/publish",
         {"routing_key": "k", "payload": "p", "payload_encoding": "string", "properties": {}}),
        ("POST", "/api/queues/v/q/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}),
    ]
    for method, path, body in refused:
        status, out = berth.api(method, path, body)
        assert (status, out) == (401, {"error": "not_authorised", "reason": "Access refused."}), \
            (method, path, status, out)
    # Reading is not an AMQP action: an administrator still sees the vhost.
    assert berth.api("GET", "/api/queues/v/q")[0] == 200
    assert berth.api("GET", "/api/exchanges/v/x")[0] == 200
    # With permissions back, the same requests pass.
    berth.ok("PUT", "/api/permissions/v/guest", FULL)
    for method, path, body in refused[:1]:
        assert berth.api(method, path, body)[0] in (201, 204)


def test_vhost_and_exchange_json_carry_rabbitmqs_fields(berth):
    berth.ok("PUT", "/api/vhosts/shop")
    status, v = berth.api("GET", "/api/vhosts/shop")
    assert status == 200
    assert v["default_queue_type"] == "classic"
    assert v["metadata"] == {"description": "", "tags": []}
    listed = [x for x in berth.api("GET", "/api/vhosts")[1] if x["name"] == "shop"]
    assert listed and listed[0]["default_queue_type"] == "classic", listed
    berth.ok("PUT", "/api/exchanges/shop/orders", {"type": "topic"})
    status, x = berth.api("GET", "/api/exchanges/shop/orders")
    assert status == 200
    assert x["incoming"] == [] and x["outgoing"] == []
    assert "user_who_performed_action" in x
    status, x = berth.api("GET", "/api/exchanges/shop/amq.topic")
    assert x["user_who_performed_action"] == "rmq-internal"
    for e in berth.api("GET", "/api/exchanges/shop")[1]:
        assert "user_who_performed_action" in e, e
