"""AMQPS black-box tests: pika over TLS 1.2/1.3 with a CA, a server and a
client certificate generated here with the openssl CLI; EXTERNAL login by
the certificate's CN; clients without a certificate refused when
fail_if_no_peer_cert; a key that does not fit its certificate is a startup
error naming the file; SIGHUP reloads the certificate without dropping
connections."""

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time

import amqp
import pika
import pika.credentials
import pytest

from conftest import ROOT, scratch_dir
from test_access import berths  # noqa: F401 (the fixture: berths of their own)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_cert(d, name, cn, ca=True, san=None):
    """name.key + name.crt signed by ca.crt/ca.key (or self-signed CA)."""
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={cn}/O=berth-tests", cwd=d)
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\n")
        if san:
            f.write(f"subjectAltName={san}\n")
        f.write("extendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="berth-pytest-certs-")
    try:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.crt", "-days", "2", "-subj", "/CN=berth-test-ca", cwd=d)
        make_cert(d, "server", "localhost", san="DNS:localhost,IP:127.0.0.1")
        make_cert(d, "server2", "localhost", san="DNS:localhost,IP:127.0.0.1")
        make_cert(d, "client", "tls-user")
        yield d
    finally:
        # Made afresh each run: nothing worth keeping.
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tls_berth(certs, berths):  # noqa: F811
    def start(verify=True, fail_if_no_cert=True, cert_dir=certs,
              mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL")):
        mechanism_flags = [f for m in mechanisms or () for f in ("--mechanism", m)]
        return berths("--amqps-listen", "127.0.0.1:0",
                      "--tls-cert-file", os.path.join(cert_dir, "server.crt"),
                      "--tls-key-file", os.path.join(cert_dir, "server.key"),
                      "--tls-ca-file", os.path.join(certs, "ca.crt"),
                      "--tls-verify-peer", str(verify).lower(),
                      "--tls-fail-if-no-peer-cert", str(fail_if_no_cert).lower(),
                      *mechanism_flags)

    return start


def context(certs, client_cert=True, version=None):
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(os.path.join(certs, "client.crt"), os.path.join(certs, "client.key"))
    if version:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def tls_params(b, certs, credentials, **kw):
    return pika.ConnectionParameters(
        host="127.0.0.1", port=b.amqps_port, credentials=credentials,
        ssl_options=pika.SSLOptions(context(certs, **kw), "localhost"),
        connection_attempts=1, socket_timeout=10, heartbeat=0)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_pika_over_tls_logs_in_with_external_by_certificate_cn(tls_berth, certs, version):
    b = tls_berth()
    b.add_user("tls-user", "unused-password")
    c = pika.BlockingConnection(tls_params(b, certs, pika.credentials.ExternalCredentials(),
                                           version=version))
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"over tls")
    assert ch.basic_get(q, auto_ack=True)[2] == b"over tls"
    c.close()
    # PLAIN works over TLS too, and /api/connections says it is TLS (it
    # said "ssl": false for every AMQP connection before 2026-12-07).
    c = pika.BlockingConnection(tls_params(b, certs, pika.PlainCredentials("guest", "guest"),
                                           version=version))
    plain = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=b.port, connection_attempts=1, socket_timeout=10, heartbeat=0))
    listed = {x["name"]: x["ssl"]
              for x in b.ok("GET", "/api/connections")}
    assert sorted(listed.values()) == [False, True], listed
    plain.close()
    c.close()


def test_external_for_a_certificate_without_a_user_is_refused(tls_berth, certs):
    b = tls_berth()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(tls_params(b, certs, pika.credentials.ExternalCredentials()))
    assert "EXTERNAL" in str(info.value)


def py_amqp(b, certs):
    """A py-amqp connection (the transport under kombu and Celery) with a
    client certificate and guest's password, connected."""
    # py-amqp takes its TLS options as a dict (an SSLContext is ignored).
    tls = {"ca_certs": os.path.join(certs, "ca.crt"),
           "certfile": os.path.join(certs, "client.crt"),
           "keyfile": os.path.join(certs, "client.key"),
           "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost"}
    conn = amqp.Connection(host=f"127.0.0.1:{b.amqps_port}", userid="guest",
                           password="guest", ssl=tls, connect_timeout=10)
    conn.connect()
    return conn


def offered(conn):
    return [m.decode() if isinstance(m, bytes) else m for m in conn.mechanisms]


def test_py_amqp_with_a_certificate_and_a_password_logs_in_by_default(tls_berth, certs):
    # py-amqp picks EXTERNAL whenever the server offers it; RabbitMQ offers
    # only PLAIN and AMQPLAIN unless `auth_mechanisms` lists EXTERNAL, so
    # this client logs in with its password there, and must here too.
    b = tls_berth(mechanisms=None)
    conn = py_amqp(b, certs)
    assert offered(conn) == ["PLAIN", "AMQPLAIN"]
    ch = conn.channel()
    q, _, _ = ch.queue_declare(exclusive=True)
    ch.basic_publish(amqp.Message(b"by password"), routing_key=q)
    assert ch.basic_get(q, no_ack=True).body == b"by password"
    conn.close()


def test_external_is_offered_only_when_listed_and_then_in_the_listed_order(tls_berth, certs):
    b = tls_berth(mechanisms=("EXTERNAL", "PLAIN"))
    b.add_user("tls-user", "unused-password")
    conn = py_amqp(b, certs)  # py-amqp now picks EXTERNAL: user tls-user
    assert offered(conn) == ["EXTERNAL", "PLAIN"]
    conn.channel().queue_declare(exclusive=True)
    conn.close()
    # A mechanism that is not offered is refused, even if berth knows it.
    b2 = tls_berth(mechanisms=("PLAIN",))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(tls_params(b2, certs, pika.credentials.ExternalCredentials()))


def test_a_client_without_certificate_is_refused_with_fail_if_no_peer_cert(tls_berth, certs):
    b = tls_berth()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(tls_params(b, certs, pika.PlainCredentials("guest", "guest"),
                                           client_cert=False))
    # Without fail_if_no_peer_cert the same client gets in with PLAIN.
    b2 = tls_berth(fail_if_no_cert=False)
    pika.BlockingConnection(tls_params(b2, certs, pika.PlainCredentials("guest", "guest"),
                                       client_cert=False)).close()


def test_a_key_that_does_not_fit_its_certificate_is_a_startup_error_naming_the_file(certs):
    binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
    with scratch_dir("berth-pytest-badkey-") as d:
        key = os.path.join(certs, "server2.key")
        r = subprocess.run(
            [binary, "serve", "--amqp-listen", "127.0.0.1:0", "--amqps-listen", "127.0.0.1:0",
             "--data-dir", d, "--tls-cert-file", os.path.join(certs, "server.crt"),
             "--tls-key-file", key], capture_output=True, timeout=30)
        assert r.returncode != 0
        assert key in r.stderr.decode(), r.stderr.decode()
        missing = os.path.join(certs, "nope.crt")
        r = subprocess.run(
            [binary, "serve", "--amqp-listen", "127.0.0.1:0", "--amqps-listen", "127.0.0.1:0",
             "--data-dir", d, "--tls-cert-file", missing, "--tls-key-file", key],
            capture_output=True, timeout=30)
        assert r.returncode != 0 and missing in r.stderr.decode(), r.stderr.decode()


def test_sighup_reloads_the_certificate_without_dropping_connections(tls_berth, certs):
    with scratch_dir("berth-pytest-reload-") as d:
        for f in ("server.crt", "server.key"):
            shutil.copy(os.path.join(certs, f), os.path.join(d, f))
        b = tls_berth(cert_dir=d)

        def served_cert():
            import socket
            with socket.create_connection(("127.0.0.1", b.amqps_port)) as s:
                with context(certs).wrap_socket(s, server_hostname="localhost") as t:
                    return t.getpeercert(binary_form=True)

        before = served_cert()
        c = pika.BlockingConnection(tls_params(b, certs, pika.PlainCredentials("guest", "guest")))
        for f in ("server2.crt", "server2.key"):
            shutil.copy(os.path.join(certs, f), os.path.join(d, f.replace("2", "")))
        b.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while served_cert() == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served_cert() != before
        ch = c.channel()  # the old connection still works
        ch.queue_declare("", exclusive=True)
        c.close()
