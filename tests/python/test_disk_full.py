"""The disk free alarm on a real small filesystem (issue 7's disk-full
fault test): berth's data directory on a tmpfs of `FS_BYTES`; the test fills
the filesystem past `limits.disk_free_bytes_min` and checks that the
publisher is blocked (`connection.blocked`, no confirm for what it sends
meanwhile), that reads keep working, that publishing resumes once space
returns, and that after a restart every confirmed message is there, intact.

Needs root (to mount the tmpfs); skipped otherwise. The mount is removed
whatever the outcome. Time budget: about 15 s (`ALARM_S` per wait).
"""

import os
import shutil
import struct
import subprocess
import tempfile
import time

import pytest

import amqp_wire as w
from conftest import BerthProcess, external_uri

FS_BYTES = 96 << 20
DISK_FREE_BYTES_MIN = 24 << 20
# Free space the filler leaves: below the minimum, yet room for the broker.
LEFT_FREE_BYTES = 12 << 20
# The alarm is checked every 250 ms; the connection looks every 100 ms.
ALARM_S = 5
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
PERSISTENT = struct.pack(">HB", 0x1000, 2)  # delivery-mode = 2


@pytest.fixture
def small_fs():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tempfile.mkdtemp(prefix="berth-diskfull-")
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", d], check=True)
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)
        shutil.rmtree(d, ignore_errors=True)


def free_bytes(path):
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def fill(path, leave_bytes):
    """Writes a file that leaves `leave_bytes` free; returns its path."""
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 20)
        while free_bytes(path) > leave_bytes + len(chunk):
            f.write(chunk)
            f.flush()
        f.write(b"\0" * max(0, free_bytes(path) - leave_bytes))
    return filler


def body(i):
    return f"message {i:05d} ".encode() * 64


def publish(c, first, count):
    for i in range(first, first + count):
        c.send(w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("")
                              + w.shortstr("disk-full") + b"\x00")
               + w.content_frames(1, body(i), frame_max=c.frame_max, properties=PERSISTENT))


def acked_upto(c, target, timeout_s):
    """Reads acks until `target` is confirmed; returns the highest seen."""
    upto, deadline = 0, time.monotonic() + timeout_s
    while upto < target:
        f = c.recv_method(timeout_s=max(0.01, deadline - time.monotonic()))
        assert f.method_ids == w.BASIC_ACK, f"expected basic.ack, got {f.method_ids}"
        upto = max(upto, f.args().longlong())
    return upto


def test_full_disk_blocks_publishers_keeps_reads_and_loses_nothing(small_fs):
    if external_uri():
        pytest.skip("needs a berth of its own on a small filesystem")
    data = os.path.join(small_fs, "data")
    flags = ["--disk-free-bytes-min", str(DISK_FREE_BYTES_MIN),
             "--segment-size-bytes", str(4 << 20), "--log-groups", "2"]
    proc = BerthProcess(flags, data_dir=data)
    try:
        b = proc.broker
        reader = b.connect()
        rch = reader.channel()
        rch.queue_declare("disk-full", durable=True)
        with w.RawConnection(b.host, b.port) as pub:
            pub.handshake(capabilities={"connection.blocked": True})
            pub.channel_open(1)
            pub.confirm_select(1)
            publish(pub, 0, 100)
            assert acked_upto(pub, 100, ALARM_S) == 100

            filler = fill(small_fs, LEFT_FREE_BYTES)
            f = pub.recv_method(timeout_s=ALARM_S)
            assert f.method_ids == CONNECTION_BLOCKED, f.method_ids
            assert f.args().shortstr() == "low on disk"
            # Sent while blocked: not read, so neither confirmed nor nacked.
            publish(pub, 100, 20)
            assert pub.quiet_and_open(1.0) is None

            # Reads keep working.
            assert rch.queue_declare("disk-full", passive=True).method.message_count == 100
            m, _p, got = rch.basic_get("disk-full")
            assert got == body(0)
            rch.basic_reject(m.delivery_tag, requeue=True)

            os.unlink(filler)
            f = pub.recv_method(timeout_s=ALARM_S)
            assert f.method_ids == CONNECTION_UNBLOCKED, f.method_ids
            assert acked_upto(pub, 120, ALARM_S) == 120
        reader.close()
    finally:
        proc.stop()

    # A restart on the same data: every confirmed message, intact.
    proc = BerthProcess(flags, data_dir=data)
    try:
        conn = proc.broker.connect()
        ch = conn.channel()
        assert ch.queue_declare("disk-full", durable=True).method.message_count == 120
        got = []
        while True:
            m, _p, b_ = ch.basic_get("disk-full", auto_ack=True)
            if m is None:
                break
            got.append(b_)
        assert sorted(got) == [body(i) for i in range(120)]
        conn.close()
    finally:
        proc.stop()
