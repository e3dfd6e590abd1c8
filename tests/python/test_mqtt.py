"""MQTT with a real client, Eclipse Paho's Python one (paho-mqtt): over
TLS (net.mqtts_listen) with a password or a client certificate, over
WebSocket (net.mqtt_ws_listen, path /ws, subprotocol mqtt) and plain
TCP, MQTT 3.1.1 and 5.0 side by side; retained messages and QoS 2 end to
end between clients on different transports."""

import os
import queue
import re
import socket
import ssl
import urllib.parse
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from test_access import AuthBerth
from test_tls import certs, openssl  # noqa: F401 (certs is a fixture)

WAIT_S = 10


@pytest.fixture
def mqtt_berth(certs):  # noqa: F811
    b = AuthBerth(["--mqtt-listen", "127.0.0.1:0", "--mqtts-listen", "127.0.0.1:0",
                   "--mqtt-ws-listen", "127.0.0.1:0",
                   "--tls-cert-file", os.path.join(certs, "server.crt"),
                   "--tls-key-file", os.path.join(certs, "server.key"),
                   "--tls-ca-file", os.path.join(certs, "ca.crt"),
                   "--tls-verify-peer", "true", "--tls-fail-if-no-peer-cert", "false"])
    with open(b.log_path, errors="replace") as f:
        log = f.read()
    b.mqtt_ports = {kind: int(re.search(rf" {kind}=\S+:(\d+)", log).group(1))
                    for kind in ("mqtt", "mqtts", "mqtt-ws")}
    b.certs = certs
    try:
        yield b
    finally:
        b.close()


def tls_context(certs, client_cert=None):  # noqa: F811
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(os.path.join(certs, f"{client_cert}.crt"),
                            os.path.join(certs, f"{client_cert}.key"))
    return ctx


class Client:
    """A paho client running its loop in a thread; what it receives is
    queued in `got`."""

    def __init__(self, b, kind, client_id, v5=False, tls=None, user="guest", password="guest"):
        transport = "websockets" if kind == "mqtt-ws" else "tcp"
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=protocol, transport=transport)
        if transport == "websockets":
            self.c.ws_set_options(path="/ws")
        if tls is not None:
            self.c.tls_set_context(tls)
        if user is not None:
            self.c.username_pw_set(user, password)
        self.got = queue.Queue()
        self.acks = queue.Queue()
        connected = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props: connected.put(rc)
        self.c.on_message = lambda c, u, m: self.got.put(m)
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.acks.put(codes)
        self.c.connect("127.0.0.1", b.mqtt_ports[kind], keepalive=30)
        self.c.loop_start()
        self.rc = connected.get(timeout=WAIT_S)

    def subscribe(self, topic, qos):
        self.c.subscribe(topic, qos)
        return self.acks.get(timeout=WAIT_S)

    def publish(self, topic, payload, qos, retain=False):
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(WAIT_S)
        assert info.is_published(), (topic, payload)

    def message(self):
        return self.got.get(timeout=WAIT_S)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def test_paho_over_tls_and_websocket_gets_retained_and_exactly_once(mqtt_berth):
    b = mqtt_berth
    # 3.1.1 over TLS with a password: a retained message.
    pub = Client(b, "mqtts", "paho-pub", tls=tls_context(b.certs))
    assert pub.rc == 0
    pub.publish("paho/kept", b"hello", qos=1, retain=True)
    # 5.0 over WebSocket: its subscription gets the retained message
    # with the retain flag, then a QoS 2 message exactly once.
    sub = Client(b, "mqtt-ws", "paho-sub", v5=True)
    assert sub.rc == 0
    assert [c.value for c in sub.subscribe("paho/#", 2)] == [2]
    m = sub.message()
    assert (m.topic, m.payload, m.retain, m.qos) == ("paho/kept", b"hello", True, 1)
    pub.publish("paho/once", b"exactly", qos=2)
    m = sub.message()
    assert (m.topic, m.payload, m.retain, m.qos) == ("paho/once", b"exactly", False, 2)
    # Plain TCP, 5.0: clears the retained message with an empty one.
    plain = Client(b, "mqtt", "paho-plain", v5=True)
    plain.publish("paho/kept", b"", qos=1, retain=True)
    assert sub.message().payload == b""
    late = Client(b, "mqtt", "paho-late")
    late.subscribe("paho/#", 1)
    with pytest.raises(queue.Empty):
        late.got.get(timeout=0.5)
    for c in (pub, sub, plain, late):
        c.close()
    with pytest.raises(queue.Empty):
        sub.got.get(timeout=0.2)


def test_a_client_certificate_logs_in_without_a_password(mqtt_berth):
    b = mqtt_berth
    b.add_user("tls-user", "unused-password")
    c = Client(b, "mqtts", "cert", tls=tls_context(b.certs, "client"), user=None)
    assert c.rc == 0
    c.subscribe("cert/#", 1)
    c.publish("cert/x", b"by certificate", qos=1)
    assert c.message().payload == b"by certificate"
    c.close()
    # Without a certificate and a password: bad user name or password.
    anon = Client(b, "mqtts", "anon", v5=True, tls=tls_context(b.certs), user=None)
    assert anon.rc == 134, anon.rc
    anon.close()


def test_websocket_upgrade_is_served_on_ws_only(mqtt_berth):
    port = mqtt_berth.mqtt_ports["mqtt-ws"]
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(b"GET /other HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 404")


def test_mqtt_connections_are_listed_counted_and_closable(mqtt_berth):
    b = mqtt_berth
    v5 = Client(b, "mqtt", "listed-5", v5=True)
    v3 = Client(b, "mqtts", "listed-3", tls=tls_context(b.certs))
    gone = queue.Queue()
    v5.c.on_disconnect = lambda c, u, flags, rc, props: gone.put(rc)
    conns = {c["client_properties"].get("client_id"): c for c in b.ok("GET", "/api/connections")}
    assert conns["listed-5"]["protocol"] == "MQTT 5.0"
    assert (conns["listed-3"]["protocol"], conns["listed-3"]["ssl"]) == ("MQTT 3.1.1", True)
    assert conns["listed-5"]["user"] == "guest" and conns["listed-5"]["vhost"] == "/"
    with urllib.request.urlopen(b.http + "/metrics", timeout=WAIT_S) as r:
        text = r.read()
    assert re.search(rb"^rabbitmq_connections 2$", text, re.M), text[:2000]
    # Closed from the management API: a v5 client is told why (0x98).
    name = urllib.parse.quote(conns["listed-5"]["name"], safe="")
    status, _ = b.api("DELETE", f"/api/connections/{name}")
    assert status == 204
    assert gone.get(timeout=WAIT_S) == 152
    v3.close()
