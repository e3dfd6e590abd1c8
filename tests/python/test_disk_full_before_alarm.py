"""A disk filled by another process before the disk alarm trips (issue 16
item 15), on a real small tmpfs: with the alarm off, berth's writes meet
ENOSPC. Publishers must get `basic.nack` (no crash, no confirm, other
connections unaffected), the alarms health check must name the full group;
once the filler is deleted publishing must resume without a restart, and
after `kill -9` and a restart every confirmed message must be there exactly
once (and no nacked one: its batch was taken back).

Needs root (to mount the tmpfs); skipped otherwise. The mount is removed
whatever the outcome. Time budget: about 10 s.
"""

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import amqp_wire as w
from conftest import BerthProcess, external_uri

FS_BYTES = 16 << 20
WAIT_S = 10
PERSISTENT = struct.pack(">HB", 0x1000, 2)  # delivery-mode = 2
QUEUE = "full-before-alarm"


@pytest.fixture
def small_fs():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tempfile.mkdtemp(prefix="berth-enospc-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"mount -t tmpfs is not permitted here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)
        shutil.rmtree(d, ignore_errors=True)


def fill(path):
    """Another process fills the filesystem to the last byte."""
    filler = os.path.join(path, "filler")
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                   capture_output=True, check=False)  # ends with ENOSPC
    s = os.statvfs(path)
    assert s.f_bavail == 0, f"{s.f_bavail} blocks still free"
    return filler


def body(i):
    return f"message {i:05d} ".encode() * 40  # 600 bytes


def alarms(http_port):
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/health/checks/alarms")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


class Publisher:
    """A raw confirming publisher that tracks each delivery tag's outcome."""

    def __init__(self, broker):
        self.c = w.RawConnection(broker.host, broker.port)
        self.c.handshake()
        self.c.channel_open(1)
        self.c.confirm_select(1)
        self.sent = {}  # delivery tag -> message number
        self.outcome = {}  # delivery tag -> "ack" | "nack"

    def publish(self, i):
        self.c.send(w.method_frame(1, w.BASIC_PUBLISH, struct.pack(">H", 0) + w.shortstr("")
                                   + w.shortstr(QUEUE) + b"\x00")
                    + w.content_frames(1, body(i), frame_max=self.c.frame_max,
                                       properties=PERSISTENT))
        tag = len(self.sent) + 1
        self.sent[tag] = i
        return tag

    def settle(self, timeout_s=WAIT_S):
        """Reads confirms until every tag sent has an outcome."""
        deadline = time.monotonic() + timeout_s
        while len(self.outcome) < len(self.sent):
            f = self.c.recv_method(timeout_s=max(0.01, deadline - time.monotonic()))
            assert f.method_ids in (w.BASIC_ACK, w.BASIC_NACK), \
                f"expected basic.ack or basic.nack, got {f.method_ids}"
            a = f.args()
            tag, multiple = a.longlong(), a.octet() & 1
            kind = "ack" if f.method_ids == w.BASIC_ACK else "nack"
            if multiple:  # every tag up to it not settled yet
                for t in range(1, tag + 1):
                    self.outcome.setdefault(t, kind)
            else:
                assert tag not in self.outcome, f"tag {tag} settled twice"
                self.outcome[tag] = kind

    def numbers(self, kind):
        return sorted(self.sent[t] for t, k in self.outcome.items() if k == kind)


def resume(pub, n, broker):
    """Publishes one at a time until one is confirmed again (space came
    back); returns the next message number."""
    deadline = time.monotonic() + WAIT_S
    while True:
        tag = pub.publish(n)
        n += 1
        pub.settle()
        if pub.outcome[tag] == "ack":
            return n
        assert time.monotonic() < deadline, \
            "publishing did not resume after space returned:\n" + broker.log_tail()
        time.sleep(0.05)


def assert_exactly_the_confirmed_after_restart(flags, data, acked, nacked):
    """Restarts berth on `data` (after its kill -9) and reads the queue out:
    every confirmed message once, no nacked one."""
    proc = BerthProcess(flags, data_dir=data)
    try:
        conn = proc.broker.connect()
        ch = conn.channel()
        got = []
        while True:
            m, _p, b_ = ch.basic_get(QUEUE, auto_ack=True)
            if m is None:
                break
            got.append(b_)
        assert sorted(got) == [body(i) for i in acked], \
            f"after kill -9: {len(got)} messages, {len(acked)} confirmed, {len(nacked)} nacked"
        conn.close()
    finally:
        proc.stop()


def test_disk_filled_before_the_alarm_nacks_then_recovers_without_restart(small_fs):
    if external_uri():
        pytest.skip("needs a berth of its own on a small filesystem")
    data = os.path.join(small_fs, "data")
    # Preparation off: a prepared segment already holds its space, so
    # writes into it succeed on a full disk (durably) and only the next
    # roll would meet ENOSPC; this test is about the write that meets it.
    flags = ["--disk-free-bytes-min", "0", "--segment-size-bytes", str(1 << 20),
             "--log-groups", "1", "--segment-prepare", "false",
             "--http-listen", "127.0.0.1:0"]
    proc = BerthProcess(flags, data_dir=data)
    filler = None
    try:
        b = proc.broker
        other = b.connect()
        och = other.channel()
        och.queue_declare(QUEUE, durable=True)
        pub = Publisher(b)
        n = 0
        for _ in range(50):
            pub.publish(n)
            n += 1
        pub.settle()
        assert pub.numbers("ack") == list(range(50))

        filler = fill(small_fs)
        for _ in range(20):
            pub.publish(n)
            n += 1
        pub.settle()
        nacked = pub.numbers("nack")
        assert nacked, "a publish that cannot be stored must be nacked"
        assert proc.proc.poll() is None, "berth must not exit on a full disk"
        status, got = alarms(b.http_port)
        assert status == 503 and "disk full" in got["reason"] \
            and "free space" in got["reason"], (status, got)
        # Another connection is unaffected: it reads and declares.
        assert och.queue_declare(QUEUE, passive=True).method.message_count >= 50
        m, _p, got_body = och.basic_get(QUEUE)
        assert got_body == body(0)
        och.basic_reject(m.delivery_tag, requeue=True)

        os.unlink(filler)
        filler = None
        n = resume(pub, n, b)
        for _ in range(20):
            pub.publish(n)
            n += 1
        pub.settle()
        assert all(pub.outcome[t] == "ack" for t in list(pub.outcome)[-20:])
        status, got = alarms(b.http_port)
        assert status == 200, (status, got)
        acked = pub.numbers("ack")
        nacked = pub.numbers("nack")
        other.close()
        pub.c.close()
        # kill -9: nothing but what was fdatasynced may count.
        proc.proc.kill()
        proc.proc.wait(10)
    finally:
        if filler:
            os.unlink(filler)
        proc.stop()

    assert_exactly_the_confirmed_after_restart(flags, data, acked, nacked)


def prepared_on_disk(group_dir):
    return os.path.exists(os.path.join(group_dir, "next.seg.prep"))


def test_disk_filled_with_a_prepared_segment_acks_into_its_held_space_then_nacks(small_fs):
    """Preparation on (the default): a segment prepared before the disk
    filled already holds its space, so publishes go on into it and are
    confirmed; the roll past it meets ENOSPC and is nacked. Nothing
    confirmed is lost across kill -9, and nothing nacked comes back."""
    if external_uri():
        pytest.skip("needs a berth of its own on a small filesystem")
    data = os.path.join(small_fs, "data")
    group = os.path.join(data, "group-0000")
    seg = 1 << 20
    flags = ["--disk-free-bytes-min", "0", "--segment-size-bytes", str(seg),
             "--log-groups", "1", "--http-listen", "127.0.0.1:0"]
    per_segment = seg // len(body(0))
    proc = BerthProcess(flags, data_dir=data)
    filler = None
    try:
        b = proc.broker
        other = b.connect()
        och = other.channel()
        och.queue_declare(QUEUE, durable=True)
        pub = Publisher(b)
        n = 0
        # Past the first segment (created, not prepared), so that the one
        # written now is a prepared one, and a next one is prepared.
        while n < per_segment * 3 // 2:
            for _ in range(100):
                pub.publish(n)
                n += 1
            pub.settle()
        deadline = time.monotonic() + WAIT_S
        while not prepared_on_disk(group):
            assert time.monotonic() < deadline, \
                f"no prepared segment in {os.listdir(group)}:\n" + b.log_tail()
            time.sleep(0.02)
        assert pub.numbers("nack") == []
        before_fill = n

        filler = fill(small_fs)
        # Three segments' worth: the rest of this one and the prepared one
        # fit in held space; the roll after that cannot.
        for _ in range(3 * per_segment // 100):
            for _ in range(100):
                pub.publish(n)
                n += 1
            pub.settle()
        acked_after = [i for i in pub.numbers("ack") if i >= before_fill]
        nacked = pub.numbers("nack")
        assert len(acked_after) >= per_segment // 2, \
            f"only {len(acked_after)} confirmed after the disk filled: a prepared " \
            f"segment's held space should take about {per_segment}"
        assert nacked, "the roll past the prepared segment must meet ENOSPC and nack"
        assert min(nacked) > max(acked_after) - 100 * 2, \
            "confirms after the first nacks: the group should stay refused until space returns"
        assert proc.proc.poll() is None, "berth must not exit on a full disk"
        status, got = alarms(b.http_port)
        assert status == 503 and "disk full" in got["reason"], (status, got)

        os.unlink(filler)
        filler = None
        n = resume(pub, n, b)
        acked = pub.numbers("ack")
        other.close()
        pub.c.close()
        proc.proc.kill()
        proc.proc.wait(10)
    finally:
        if filler:
            os.unlink(filler)
        proc.stop()

    assert_exactly_the_confirmed_after_restart(flags, data, acked, nacked)
