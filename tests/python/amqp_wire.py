"""A deliberately small AMQP 0-9-1 client written by hand with `struct`.

The raw-socket tests use it to say things pika never would (a bad protocol
header, an oversized frame, a wrong frame-end octet, a method on a channel
that was never opened, AMQPLAIN, a client that goes silent) and to read the
server's replies octet by octet (reply codes, class/method ids, tune values,
confirm multiples). Only what those tests need is encoded or decoded.

Frame layout (AMQP 0-9-1 section 4.2.3):

    type:u8 | channel:u16 | size:u32 | payload:size octets | frame-end:u8 = 0xCE
"""

import socket
import struct
import time
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

# (class_id, method_id) of the methods the tests name.
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_UPDATE_SECRET = (10, 70)
CONNECTION_UPDATE_SECRET_OK = (10, 71)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


# ---------------------------------------------------------------- encoding
def shortstr(s):
    b = s.encode() if isinstance(s, str) else s
    assert len(b) < 256
    return struct.pack(">B", len(b)) + b


def longstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">I", len(b)) + b


def table_items(d):
    """The field-value pairs of a table, without its length prefix (the
    shape AMQPLAIN's response uses)."""
    out = b""
    for key, value in d.items():
        out += shortstr(key)
        if isinstance(value, bool):
            out += b"t" + struct.pack(">B", value)
        elif isinstance(value, int):
            out += b"l" + struct.pack(">q", value)
        elif isinstance(value, dict):
            out += b"F" + table(value)
        else:
            out += b"S" + longstr(value)
    return out


def table(d):
    items = table_items(d)
    return struct.pack(">I", len(items)) + items


def frame(frame_type, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_frame(channel, ids, args=b""):
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *ids) + args)


def close_frame(channel, ids, reply_code=200, reply_text="bye", failing=(0, 0)):
    """connection.close (channel 0) or channel.close, as a client sends it."""
    return method_frame(channel, ids, struct.pack(">H", reply_code) + shortstr(reply_text)
                        + struct.pack(">HH", *failing))


def publish_frames(channel, exchange, routing_key, body, frame_max=131072, mandatory=False):
    """basic.publish with its content header and body frames."""
    return (method_frame(channel, BASIC_PUBLISH,
                         struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key)
                         + bytes([int(mandatory)]))
            + content_frames(channel, body, frame_max))


def content_frames(channel, body, frame_max=131072, properties=b"\x00\x00"):
    """Content header (class 60, no properties by default) and body frames."""
    out = frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, len(body)) + properties)
    chunk = frame_max - 8
    for i in range(0, len(body), chunk):
        out += frame(FRAME_BODY, channel, body[i:i + chunk])
    return out


# ---------------------------------------------------------------- decoding
class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        b = self.data[self.pos:self.pos + n]
        if len(b) != n:
            raise ValueError("truncated")
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def octet(self):
        return self.unpack(">B")[0]

    def short(self):
        return self.unpack(">H")[0]

    def long(self):
        return self.unpack(">I")[0]

    def longlong(self):
        return self.unpack(">Q")[0]

    def shortstr(self):
        return self.take(self.octet()).decode()

    def longstr(self):
        return self.take(self.long())

    def table(self):
        end = self.long()
        sub = Reader(self.take(end))
        out = {}
        while sub.pos < len(sub.data):
            key = sub.shortstr()
            out[key] = sub.value()
        return out

    def value(self):
        t = self.take(1)
        simple = {b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H", b"I": ">i", b"i": ">I",
                  b"l": ">q", b"L": ">Q", b"f": ">f", b"d": ">d", b"T": ">Q"}
        if t in simple:
            return self.unpack(simple[t])[0]
        if t == b"t":
            return bool(self.octet())
        if t == b"S":
            return self.longstr().decode(errors="replace")
        if t == b"x":
            return self.longstr()
        if t == b"F":
            return self.table()
        if t == b"A":
            sub = Reader(self.take(self.long()))
            items = []
            while sub.pos < len(sub.data):
                items.append(sub.value())
            return items
        if t == b"D":
            scale, raw = self.unpack(">Bi")
            return raw / (10 ** scale)
        if t == b"V":
            return None
        raise ValueError(f"unknown field type {t!r}")


@dataclass
class Frame:
    type: int
    channel: int
    payload: bytes

    @property
    def method_ids(self):
        if self.type != FRAME_METHOD:
            return None
        return struct.unpack(">HH", self.payload[:4])

    def args(self):
        return Reader(self.payload[4:])


@dataclass
class Close:
    """A connection.close or channel.close as the server sent it."""
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


def parse_close(f):
    r = f.args()
    return Close(r.short(), r.shortstr(), r.short(), r.short())


class PeerClosed(Exception):
    """The server closed (or reset) the TCP connection."""


# ---------------------------------------------------------------- client
class RawConnection:
    def __init__(self, host, port, timeout_s=10, source=None):
        self.sock = socket.create_connection((host, port), timeout=timeout_s,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.frame_max = 131072
        self.server_properties = {}
        self.mechanisms = []
        self.tune = None  # (channel_max, frame_max, heartbeat) proposed by the server

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("no frame in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as e:
                raise PeerClosed(f"connection reset by peer; unparsed bytes {self.buf[:64]!r}") from e
            if not chunk:
                raise PeerClosed(f"peer closed the connection; unparsed bytes {self.buf[:64]!r}")
            self.buf += chunk

    def recv_raw(self, n, timeout_s=5):
        """Exactly n octets (for replies that are not frames)."""
        self._fill(n, time.monotonic() + timeout_s)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self, timeout_s=5):
        deadline = time.monotonic() + timeout_s
        self._fill(7, deadline)
        frame_type, channel, size = struct.unpack(">BHI", self.buf[:7])
        self._fill(7 + size + 1, deadline)
        payload = self.buf[7:7 + size]
        end = self.buf[7 + size]
        self.buf = self.buf[7 + size + 1:]
        if end != FRAME_END:
            raise ValueError(f"bad frame end {end:#x}")
        return Frame(frame_type, channel, payload)

    def recv_method(self, timeout_s=5, skip_heartbeats=True):
        while True:
            f = self.recv_frame(timeout_s)
            if f.type == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return f

    def expect(self, ids, timeout_s=5):
        f = self.recv_method(timeout_s)
        if f.method_ids != ids:
            detail = ""
            if f.method_ids in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                detail = f" {parse_close(f)}"
            raise AssertionError(f"expected method {ids}, got frame type {f.type} "
                                 f"method {f.method_ids}{detail}")
        return f

    def quiet_and_open(self, timeout_s):
        """None if the server neither sent anything nor closed the connection
        within the time; otherwise what it did instead."""
        if self.buf:
            return f"sent {self.buf[:64]!r}"
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return None
        except ConnectionResetError:
            return "reset the connection"
        return f"sent {data[:64]!r}" if data else "closed the connection"

    def wait_closed(self, timeout_s=5):
        """True if the peer closes the TCP connection within the time."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                self._fill(len(self.buf) + 1, deadline)
                self.buf = b""
        except PeerClosed:
            return True
        except socket.timeout:
            return False

    def expect_connection_close(self, timeout_s=5):
        """Reads until connection.close, answers close-ok, returns the Close."""
        deadline = time.monotonic() + timeout_s
        while True:
            f = self.recv_method(max(0.01, deadline - time.monotonic()))
            if f.method_ids == CONNECTION_CLOSE:
                close = parse_close(f)
                try:
                    self.send(method_frame(0, CONNECTION_CLOSE_OK))
                except OSError:
                    pass
                return close

    # -- handshake ---------------------------------------------------------
    def start(self, header=PROTOCOL_HEADER):
        """Sends the protocol header and reads connection.start."""
        self.send(header)
        f = self.expect(CONNECTION_START)
        r = f.args()
        self.version = (r.octet(), r.octet())
        self.server_properties = r.table()
        self.mechanisms = r.longstr().decode().split()
        self.locales = r.longstr().decode().split()
        return f

    def start_ok(self, user="guest", password="guest", mechanism="PLAIN", capabilities=None):
        if mechanism == "PLAIN":
            response = b"\x00" + user.encode() + b"\x00" + password.encode()
        elif mechanism == "AMQPLAIN":
            response = table_items({"LOGIN": user, "PASSWORD": password})
        else:
            raise ValueError(mechanism)
        caps = {"authentication_failure_close": True, **(capabilities or {})}
        props = table({"product": "berth raw-socket tests", "capabilities": caps})
        self.send(method_frame(0, CONNECTION_START_OK,
                               props + shortstr(mechanism) + longstr(response) + shortstr("en_US")))

    def tune_ok(self, channel_max=None, frame_max=None, heartbeat=None):
        """Reads connection.tune and answers with the server's values unless
        overridden. Returns the values sent."""
        f = self.expect(CONNECTION_TUNE)
        r = f.args()
        self.tune = (r.short(), r.long(), r.short())
        cm = self.tune[0] if channel_max is None else channel_max
        fm = self.tune[1] if frame_max is None else frame_max
        hb = self.tune[2] if heartbeat is None else heartbeat
        self.frame_max = fm
        self.send(method_frame(0, CONNECTION_TUNE_OK, struct.pack(">HIH", cm, fm, hb)))
        return cm, fm, hb

    def open(self, vhost="/"):
        self.send(method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00"))

    def handshake(self, user="guest", password="guest", mechanism="PLAIN", vhost="/",
                  channel_max=None, frame_max=None, heartbeat=0, capabilities=None):
        self.start()
        self.start_ok(user, password, mechanism, capabilities)
        negotiated = self.tune_ok(channel_max, frame_max, heartbeat)
        self.open(vhost)
        self.expect(CONNECTION_OPEN_OK)
        return negotiated

    # -- a few methods -----------------------------------------------------
    def channel_open(self, channel):
        self.send(method_frame(channel, CHANNEL_OPEN, shortstr("")))
        self.expect(CHANNEL_OPEN_OK)

    def queue_declare(self, channel, queue, exclusive=False, auto_delete=False):
        bits = (exclusive << 2) | (auto_delete << 3)
        self.send(method_frame(channel, QUEUE_DECLARE,
                               struct.pack(">H", 0) + shortstr(queue) + bytes([bits]) + table({})))

    def basic_publish(self, channel, exchange, routing_key, body, mandatory=False):
        self.send(publish_frames(channel, exchange, routing_key, body, self.frame_max, mandatory))

    def queue_delete(self, channel, queue, if_unused=False, if_empty=False):
        bits = if_unused | (if_empty << 1)
        self.send(method_frame(channel, QUEUE_DELETE,
                               struct.pack(">H", 0) + shortstr(queue) + bytes([bits])))

    def basic_consume(self, channel, queue, consumer_tag="", no_ack=False, exclusive=False):
        bits = (no_ack << 1) | (exclusive << 2)
        self.send(method_frame(channel, BASIC_CONSUME,
                               struct.pack(">H", 0) + shortstr(queue) + shortstr(consumer_tag)
                               + bytes([bits]) + table({})))

    def confirm_select(self, channel):
        self.send(method_frame(channel, CONFIRM_SELECT, b"\x00"))
        self.expect(CONFIRM_SELECT_OK)

    def basic_get(self, channel, queue, no_ack=True):
        self.send(method_frame(channel, BASIC_GET,
                               struct.pack(">H", 0) + shortstr(queue) + bytes([int(no_ack)])))

    def heartbeat(self):
        self.send(frame(FRAME_HEARTBEAT, 0, b""))
