"""Shovels with an `amqps://` end (docs/SHOVELS.md, "TLS"): berth -> berth
with the destination over TLS, verified against the CA of `cacertfile`,
with a client certificate (`certfile`/`keyfile`) where the destination
demands one; a wrong CA or server name leaves the shovel `terminated`
with the TLS reason (and retrying), `verify_none` connects anyway, and a
certificate path that cannot be read is a 400 naming the parameter.
Certificates are made here with the openssl CLI."""

import os
import shutil
import tempfile
from urllib.parse import quote

import pytest

from helpers import wait_until
from test_shovels import (berths, check_every_id, count, drain_ids,  # noqa: F401 (fixture)
                          free_port, publish_ids, put_shovel, shovel_state)
from test_tls import make_cert, openssl


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="berth-pytest-shovel-certs-")
    try:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.crt", "-days", "2", "-subj", "/CN=berth-shovel-test-ca", cwd=d)
        make_cert(d, "server", "localhost", san="DNS:localhost,IP:127.0.0.1")
        make_cert(d, "client", "shovel-client")
        # A CA that signed nothing berth shows.
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other-ca.key",
                "-out", "other-ca.crt", "-days", "2", "-subj", "/CN=another-ca", cwd=d)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tls_berth(berths, certs, fail_if_no_cert=False):  # noqa: F811
    port = free_port()
    b = berths("--amqps-listen", f"127.0.0.1:{port}",
               "--tls-cert-file", os.path.join(certs, "server.crt"),
               "--tls-key-file", os.path.join(certs, "server.key"),
               "--tls-ca-file", os.path.join(certs, "ca.crt"),
               "--tls-verify-peer", "true",
               "--tls-fail-if-no-peer-cert", str(fail_if_no_cert).lower())
    b.amqps = port
    return b


def amqps_uri(b, host="localhost", **params):
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"amqps://guest:guest@{host}:{b.amqps}/%2f" + (f"?{query}" if query else "")


def test_berth_to_berth_over_amqps_with_a_client_certificate_moves_every_message(
        berths, certs):  # noqa: F811
    src = berths()
    dest = tls_berth(berths, certs, fail_if_no_cert=True)
    n = 2_000
    with src.connect() as conn:
        publish_ids(conn, "tls-a", range(n))
    uri = amqps_uri(dest, cacertfile=os.path.join(certs, "ca.crt"),
                    certfile=os.path.join(certs, "client.crt"),
                    keyfile=os.path.join(certs, "client.key"),
                    verify="verify_peer", server_name_indication="localhost")
    value = {"src-uri": src.uri(), "src-queue": "tls-a", "dest-uri": uri, "dest-queue": "tls-b"}
    r = put_shovel(src, "over-tls", value)
    assert r.status_code == 201, r.text
    conn = dest.connect()
    assert wait_until(lambda: count(conn, "tls-b") == n, timeout_s=20), \
        (count(conn, "tls-b"), shovel_state(src, "over-tls"))
    s = shovel_state(src, "over-tls")
    assert s["state"] == "running", s
    assert s["dest_uri"].startswith("amqps://guest@localhost:"), s
    # The destination has the shovel's connection on its AMQPS listener
    # (which refuses a client without a certificate). Not "ssl": berth's
    # /api/connections says false for every AMQP 0-9-1 connection.
    shovel_conns = [c for c in dest.api("GET", "connections").json()
                    if "over-tls" in str(c.get("client_properties", {}))]
    assert shovel_conns and all(c["port"] == dest.amqps for c in shovel_conns), shovel_conns
    check_every_id(drain_ids(conn, "tls-b"), n, "berth -> berth over amqps")
    conn.close()


def test_a_wrong_ca_or_name_terminates_the_shovel_with_the_tls_reason(berths, certs):  # noqa: F811
    src = berths()
    dest = tls_berth(berths, certs)
    base = {"src-uri": src.uri(), "src-queue": "w-a", "dest-queue": "w-b",
            "reconnect-delay": 1}
    shovels = {
        "wrong-ca": (amqps_uri(dest, cacertfile=os.path.join(certs, "other-ca.crt")),
                     "certificate"),
        "wrong-name": (amqps_uri(dest, host="127.0.0.1",
                                 cacertfile=os.path.join(certs, "ca.crt"),
                                 server_name_indication="mq.example.com"),
                       "certificate"),
    }
    for name, (uri, _) in shovels.items():
        assert put_shovel(src, name, {**base, "dest-uri": uri}).status_code == 201

    def reported():
        states = {s["name"]: s for s in src.api("GET", "shovels").json()}
        return all(states[n]["state"] == "terminated" and why in states[n]["reason"].lower()
                   and "destination" in states[n]["reason"]
                   for n, (_, why) in shovels.items())
    assert wait_until(reported, timeout_s=15), src.api("GET", "shovels").json()
    print({s["name"]: s["reason"] for s in src.api("GET", "shovels").json()})
    # Nothing was moved (no message left its source for an unverified peer).
    with src.connect() as conn:
        publish_ids(conn, "w-a", range(10))
        assert count(conn, "w-a") == 10
    # verify_none takes the certificate the wrong CA cannot vouch for.
    none = amqps_uri(dest, cacertfile=os.path.join(certs, "other-ca.crt"), verify="verify_none")
    assert put_shovel(src, "wrong-ca", {**base, "dest-uri": none}).status_code == 204
    assert wait_until(lambda: shovel_state(src, "wrong-ca")["state"] == "running",
                      timeout_s=15), shovel_state(src, "wrong-ca")
    with dest.connect() as conn:
        assert wait_until(lambda: count(conn, "w-b") == 10, timeout_s=10)


def test_certificate_files_that_cannot_be_read_are_400s_naming_the_parameter(
        berths, certs):  # noqa: F811
    b = berths()
    port = free_port()
    ok = {"src-uri": b.uri(), "src-queue": "a", "dest-queue": "b"}
    missing = os.path.join(certs, "nonexistent.pem")
    cases = [
        (f"amqps://h:{port}?cacertfile={missing}", f"dest-uri: cacertfile {missing}"),
        (f"amqps://h:{port}?verify=verify_none&certfile={missing}"
         f"&keyfile={os.path.join(certs, 'client.key')}", f"dest-uri: certfile {missing}"),
        (f"amqps://h:{port}?verify=verify_none&certfile={os.path.join(certs, 'client.crt')}"
         f"&keyfile={missing}", f"dest-uri: keyfile {missing}"),
        (f"amqps://h:{port}?verify=verify_none&certfile={os.path.join(certs, 'client.crt')}"
         f"&keyfile={os.path.join(certs, 'server.key')}", "does not fit certfile"),
        (f"amqps://h:{port}?verify=sometimes", "verify must be verify_peer or verify_none"),
        (f"amqp://h:{port}?cacertfile={os.path.join(certs, 'ca.crt')}",
         "only of use with amqps://"),
    ]
    for uri, why in cases:
        r = put_shovel(b, "bad", {**ok, "dest-uri": uri})
        assert r.status_code == 400, (uri, r.text)
        assert why in r.json()["reason"], (why, r.json())
    assert b.api("GET", "parameters/shovel").json() == []
