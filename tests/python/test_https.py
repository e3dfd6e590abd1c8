"""HTTPS for the management API (net.https_listen): the same API as plain
HTTP over TLS 1.2 and 1.3 with the [tls] certificate; verify_peer and
fail_if_no_peer_cert as for AMQPS; rabbitmqadmin --ssl and the berth CLI
(--url https://... --ca-file) work over it; startup errors name the file."""

import os
import re
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import base64
import json

import pytest

from conftest import ANSI_RE, ROOT, external_uri, scratch_dir
from test_access import AuthBerth
from test_tls import certs, context  # noqa: F401 (certs is a fixture)

RABBITMQADMIN = "/usr/bin/rabbitmqadmin"
BINARY = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")


def https_port(b):
    with open(b.log_path, errors="replace") as f:
        m = re.search(r"https=\S*?:(\d+)", ANSI_RE.sub("", f.read()))
    assert m, "no https= in the ready line"
    return int(m.group(1))


@pytest.fixture
def https_berth(certs):  # noqa: F811
    if external_uri():
        pytest.skip("starts its own berth")
    started = []

    def start(verify=False, fail_if_no_cert=False):
        b = AuthBerth(["--https-listen", "127.0.0.1:0",
                       "--tls-cert-file", os.path.join(certs, "server.crt"),
                       "--tls-key-file", os.path.join(certs, "server.key"),
                       "--tls-ca-file", os.path.join(certs, "ca.crt"),
                       "--tls-verify-peer", str(verify).lower(),
                       "--tls-fail-if-no-peer-cert", str(fail_if_no_cert).lower()])
        started.append(b)
        b.https_port = https_port(b)
        return b

    try:
        yield start
    finally:
        for b in started:
            b.close()


def get(port, path, ctx, user="guest", password="guest"):
    req = urllib.request.Request(f"https://localhost:{port}{path}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", "Basic " + token)
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        return r.status, json.loads(r.read())


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_the_api_answers_over_https(https_berth, certs, version):  # noqa: F811
    b = https_berth()
    status, overview = get(b.https_port, "/api/overview",
                           context(certs, client_cert=False, version=version))
    assert status == 200 and "rabbitmq_version" in overview, overview
    # Wrong credentials are refused over HTTPS as over HTTP.
    with pytest.raises(urllib.error.HTTPError) as info:
        get(b.https_port, "/api/overview", context(certs, client_cert=False), password="no")
    assert info.value.code == 401


def test_plain_http_to_the_https_port_gets_no_api_answer(https_berth):
    b = https_berth()
    with socket.create_connection(("127.0.0.1", b.https_port), timeout=10) as s:
        s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert b"rabbitmq_version" not in got and not got.startswith(b"HTTP/1.1 200"), got


def test_fail_if_no_peer_cert_applies_to_https(https_berth, certs):  # noqa: F811
    b = https_berth(verify=True, fail_if_no_cert=True)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
        get(b.https_port, "/api/overview", context(certs, client_cert=False))
    status, _ = get(b.https_port, "/api/overview", context(certs, client_cert=True))
    assert status == 200


def test_rabbitmqadmin_lists_queues_over_https(https_berth, certs):  # noqa: F811
    if not os.access(RABBITMQADMIN, os.X_OK):
        pytest.fail(f"{RABBITMQADMIN} missing: scripts/test.sh installs rabbitmq-server")
    b = https_berth()
    c = b.connect()
    c.channel().queue_declare("over-https")
    out = subprocess.run(
        ["python3", RABBITMQADMIN, "--ssl", "--ssl-ca-cert-file", os.path.join(certs, "ca.crt"),
         "-H", "localhost", "-P", str(b.https_port), "-u", "guest", "-p", "guest",
         "-f", "raw_json", "list", "queues"], capture_output=True, text=True, timeout=30)
    c.close()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "over-https" in [q["name"] for q in json.loads(out.stdout)]


def test_the_berth_cli_manages_users_over_https_with_a_ca_file(https_berth, certs):  # noqa: F811
    b = https_berth()
    url = f"https://localhost:{b.https_port}"
    run = lambda *a: subprocess.run([BINARY, *a, "--url", url], capture_output=True,  # noqa: E731
                                    text=True, timeout=30)
    out = run("user", "add", "remote", "pw", "--ca-file", os.path.join(certs, "ca.crt"))
    assert out.returncode == 0, out.stdout + out.stderr
    out = run("user", "list", "--ca-file", os.path.join(certs, "ca.crt"))
    assert out.returncode == 0 and "remote" in out.stdout, out.stdout + out.stderr
    # Without the test CA the system bundle does not trust the server.
    out = run("user", "list")
    assert out.returncode != 0 and "certificate" in out.stderr.lower(), out.stderr


def test_https_without_a_certificate_or_with_a_wrong_key_fails_at_startup(certs):  # noqa: F811
    with scratch_dir("berth-pytest-https-bad-") as d:
        base = [BINARY, "serve", "--amqp-listen", "127.0.0.1:0", "--https-listen", "127.0.0.1:0",
                "--data-dir", d]
        r = subprocess.run(base, capture_output=True, timeout=30)
        assert r.returncode != 0 and b"tls.cert_file" in r.stderr, r.stderr
        key = os.path.join(certs, "server2.key")
        r = subprocess.run(base + ["--tls-cert-file", os.path.join(certs, "server.crt"),
                                   "--tls-key-file", key], capture_output=True, timeout=30)
        assert r.returncode != 0 and key in r.stderr.decode(), r.stderr
