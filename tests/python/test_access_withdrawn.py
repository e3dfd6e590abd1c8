"""Access withdrawn while clients are connected: deleting a user closes its
AMQP connections with 320 CONNECTION_FORCED "user 'u' is deleted" (as
RabbitMQ does) and leaves other users' connections alone; clearing a
user's permissions keeps the connection (as RabbitMQ 3.10) but refuses its
next operation. And the HTTP API's failed logins go through the login
throttle: a password-guessing HTTP client is slowed while a correct
client's requests are served."""

import base64
import http.client
import statistics
import threading
import time

import pika
import pika.exceptions
import pytest

from helpers import channel_error
from test_access import berth  # noqa: F401 (a fixture)


def wait_closed(c, budget_s=5):
    """Pumps `c` until the broker closes it; returns the close exception."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        try:
            c.process_data_events(time_limit=0.1)
        except pika.exceptions.ConnectionClosedByBroker as e:
            return e
    pytest.fail(f"connection still open {budget_s}s after its user was deleted")


def test_deleting_a_user_closes_its_connections_with_320(berth):  # noqa: F811
    berth.add_user("leaver", "pw")
    berth.add_user("stayer", "pw")
    gone = [berth.connect("leaver", "pw") for _ in range(2)]
    kept = berth.connect("stayer", "pw")
    berth.ok("DELETE", "/api/users/leaver")
    for c in gone:
        e = wait_closed(c)
        assert e.reply_code == 320, e
        assert e.reply_text == "CONNECTION_FORCED - user 'leaver' is deleted", e
    kept.channel().queue_declare("", exclusive=True)
    kept.close()


def test_clearing_permissions_keeps_the_connection_but_refuses_its_next_operation(berth):  # noqa: F811,E501
    berth.add_user("narrowed", "pw")
    c = berth.connect("narrowed", "pw")
    ch = c.channel()
    ch.queue_declare("narrowed-q")
    berth.ok("DELETE", "/api/permissions/%2F/narrowed")
    with channel_error(403, text="access to queue 'narrowed-q' in vhost '/' refused"):
        ch.queue_declare("narrowed-q")
    assert c.is_open
    c.close()


def test_a_password_guessing_http_client_is_slowed_and_others_are_served(berth):  # noqa: F811
    """4 keep-alive clients on 127.0.0.1 send wrong passwords as fast as
    answered for about 2 s; a correct client on 127.0.0.2 gets its 20
    requests in meanwhile (its median and max request time are printed),
    and the guessers get far fewer answers than unthrottled (their
    address's budget: auth.login_failures_per_s_max at once, then as many
    per second). Time budget: about 8 s (booked turns are answered up to
    5 s after the guessing stops)."""
    host, port = berth.http.removeprefix("http://").rsplit(":", 1)
    bad = "Basic " + base64.b64encode(b"guest:wrong").decode()
    good = "Basic " + base64.b64encode(b"guest:guest").decode()
    stop = threading.Event()
    failures = [0]

    def guess():
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        while not stop.is_set():
            conn.request("GET", "/api/overview", headers={"Authorization": bad})
            r = conn.getresponse()
            r.read()
            assert r.status == 401
            failures[0] += 1

    threads = [threading.Thread(target=guess, daemon=True) for _ in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        times_ms = []
        for _ in range(20):
            t0 = time.monotonic()
            conn = http.client.HTTPConnection(host, int(port), timeout=10,
                                              source_address=("127.0.0.2", 0))
            conn.request("GET", "/api/overview", headers={"Authorization": good})
            r = conn.getresponse()
            r.read()
            conn.close()
            assert r.status == 200, r.status
            times_ms.append((time.monotonic() - t0) * 1000)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    guessing_s = time.monotonic() - started
    rate = failures[0] / guessing_s
    print(f"\nHTTP guessers: {failures[0]} failed logins in {guessing_s:.1f}s ({rate:.0f}/s); "
          f"correct client ms min {min(times_ms):.1f} median {statistics.median(times_ms):.1f} "
          f"max {max(times_ms):.1f}")
    # Unthrottled, 4 keep-alive clients get ~10,000 answers per second;
    # throttled, their address gets 10 at once and 10 per second.
    assert rate < 100, rate
