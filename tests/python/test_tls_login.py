"""EXTERNAL by the certificate's full distinguished name or by a subject
alternative name (tls.cert_login_from, RabbitMQ's ssl_cert_login_from),
and SIGHUP rereading the CA file: a client certificate from a new CA is
accepted after the CA file is replaced, and open connections stay."""

import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.parse

import pika
import pika.credentials
import pika.exceptions
import pytest

from conftest import scratch_dir
from test_access import AuthBerth, berths  # noqa: F401 (berths is a fixture)
from test_tls import certs, openssl  # noqa: F401 (certs is a fixture)


def client_cert(d, name, subj, san=None, ca="ca"):
    """name.crt/name.key with subject `subj`, signed by ca.crt/ca.key."""
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", subj, cwd=d)
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
        if san:
            f.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)


def rfc2253_subject(path):
    out = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-subject", "-nameopt",
                          "RFC2253"], check=True, capture_output=True, text=True).stdout
    return out.strip().removeprefix("subject=")


@pytest.fixture
def start(certs, berths):  # noqa: F811
    def run(*extra, ca_file=None):
        return berths("--amqps-listen", "127.0.0.1:0",
                      "--tls-cert-file", os.path.join(certs, "server.crt"),
                      "--tls-key-file", os.path.join(certs, "server.key"),
                      "--tls-ca-file", ca_file or os.path.join(certs, "ca.crt"),
                      "--tls-verify-peer", "true", "--tls-fail-if-no-peer-cert", "true",
                      "--mechanism", "PLAIN", "--mechanism", "EXTERNAL",
                      *extra)

    return run


def external(b, certs, name, cert_dir=None):  # noqa: F811
    d = cert_dir or certs
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.crt"))
    ctx.load_cert_chain(os.path.join(d, f"{name}.crt"), os.path.join(d, f"{name}.key"))
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=b.amqps_port,
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(ctx, "localhost"),
        connection_attempts=1, socket_timeout=10, heartbeat=0))


def add_user(b, name):
    q = urllib.parse.quote(name, safe="")
    b.ok("PUT", f"/api/users/{q}", {"password": "unused", "tags": ""})
    b.ok("PUT", f"/api/permissions/%2F/{q}", {"configure": ".*", "write": ".*", "read": ".*"})


@pytest.fixture(scope="module")
def named(certs):  # noqa: F811
    client_cert(certs, "dn", "/C=US/O=berth, tests/OU=qa/UID=u7/CN=dn-user",
                san="DNS:first.example,DNS:san-user,email:mail-user@example.com,"
                    "URI:urn:uri-user")
    return certs


def test_external_by_distinguished_name_uses_rfc4514_as_openssl_prints_it(start, named):
    dn = rfc2253_subject(os.path.join(named, "dn.crt"))
    assert dn == "CN=dn-user,UID=u7,OU=qa,O=berth\\, tests,C=US", dn
    b = start("--tls-cert-login-from", "distinguished_name")
    add_user(b, "dn-user")  # the CN alone must not be enough
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        external(b, named, "dn")
    add_user(b, dn)
    c = external(b, named, "dn")
    c.channel().queue_declare("", exclusive=True)
    c.close()


@pytest.mark.parametrize("san_type,index,user", [
    ("dns", "1", "san-user"), ("email", "0", "mail-user@example.com"),
    ("uri", "0", "urn:uri-user")])
def test_external_by_subject_alternative_name_of_a_type_and_index(start, named, san_type,
                                                                    index, user):
    b = start("--tls-cert-login-from", "subject_alternative_name",
              "--tls-cert-login-san-type", san_type, "--tls-cert-login-san-index", index)
    add_user(b, "first.example")  # dns index 0: must not be the one used
    add_user(b, "dn-user")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        external(b, named, "dn")
    add_user(b, user)
    external(b, named, "dn").close()


def test_a_bad_cert_login_setting_is_refused_at_startup(certs):  # noqa: F811
    with pytest.raises(RuntimeError) as info:
        AuthBerth(["--tls-cert-login-from", "serial_number"]).stop()
    assert "distinguished_name" in str(info.value)


def test_sighup_rereads_the_ca_file_keeping_open_connections(start, certs):  # noqa: F811
    with scratch_dir("berth-pytest-ca-reload-") as d:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca2.key", "-out",
                "ca2.crt", "-days", "2", "-subj", "/CN=berth-test-ca-2", cwd=d)
        client_cert(d, "tls-user", "/CN=tls-user", ca="ca2")
        ca_file = os.path.join(d, "trusted.crt")
        shutil.copy(os.path.join(certs, "ca.crt"), ca_file)
        b = start(ca_file=ca_file)
        add_user(b, "tls-user")
        old = external(b, certs, "client")  # signed by the first CA
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            external(b, certs, "tls-user", cert_dir=d)
        with open(ca_file, "a") as f:
            f.write(open(os.path.join(d, "ca2.crt")).read())
        b.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while True:
            try:
                external(b, certs, "tls-user", cert_dir=d).close()
                break
            except pika.exceptions.AMQPConnectionError:
                assert time.monotonic() < deadline, "the new CA was not trusted after SIGHUP"
                time.sleep(0.1)
        old.channel().queue_declare("", exclusive=True)  # still open
        old.close()
