"""Fixtures for berth's black-box tests with pika and raw sockets.

One broker serves the whole run: `target/release/berth` (or `$BERTH_BIN`)
started on a free loopback port with a fresh data directory, or the broker
named by `$BERTH_TEST_URI` (then nothing is started, and tests that need a
berth with special flags are skipped). Tests that need such flags start
their own short-lived berth through the `start_berth` fixture.

Every process started here is stopped (SIGTERM, then SIGKILL) when its
fixture ends, whatever the outcome of the tests.
"""

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pika
import pika.channel
import pika.connection
import pika.exceptions
import pytest

from helpers import unique

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
READY_TIMEOUT_S = 30
STOP_GRACE_S = 5
READY_RE = re.compile(r"berth ready amqp=([^\s,]+)")
READY_HTTP_RE = re.compile(r"berth ready amqp=\S+ http=([^\s,]+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")

# Processes not yet stopped; the atexit hook is a last resort if pytest
# itself is interrupted before fixtures finalise.
_live_procs = []

# --------------------------------------------------------------------------
# Directories of the tests' own
# --------------------------------------------------------------------------
# What a test makes under the system temp dir (data directories, logs,
# certificates) is removed when the test ends, passed or failed. With
# BERTH_KEEP_TEST_DIRS=1 a failed test's directories are kept, and named
# on stderr, to look at what it left.
KEEP_DIRS_ENV = "BERTH_KEEP_TEST_DIRS"
_failed = {"test": False, "run": False}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    if rep.when == "setup":
        _failed["test"] = rep.failed
    elif rep.failed:
        _failed["test"] = True
    if rep.failed:
        _failed["run"] = True


def current_test_failed(whole_run=False):
    """Whether the test now ending failed (in its setup or call), or, with
    `whole_run`, any test so far (for module and session fixtures)."""
    return _failed["run" if whole_run else "test"]


def remove_test_dir(path, failed=None):
    """Removes a test's directory, unless the test failed (`failed`, or
    else `current_test_failed()`) and BERTH_KEEP_TEST_DIRS=1 asks to keep
    it."""
    if failed is None:
        failed = current_test_failed()
    if failed and os.environ.get(KEEP_DIRS_ENV) == "1":
        print(f"{KEEP_DIRS_ENV}: kept {path}", file=sys.__stderr__)
        return
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def scratch_dir(prefix):
    """A new directory under the system temp dir for the `with` block,
    removed when it ends; an exception through it counts as a failure."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    except BaseException:
        remove_test_dir(d, failed=True)
        raise
    remove_test_dir(d)


# --------------------------------------------------------------------------
# pika: keep the class and method ids of Channel.Close / Connection.Close.
#
# pika's ChannelClosedByBroker / ConnectionClosedByBroker carry only the
# reply code and text; RabbitMQ also names the method that failed. Wrap the
# two handlers so the exception objects gain `class_id` and `method_id`.
# --------------------------------------------------------------------------
_orig_channel_close = pika.channel.Channel._on_close_from_broker


def _channel_close_keeping_ids(self, method_frame):
    _orig_channel_close(self, method_frame)
    reason = self._closing_reason
    if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
        reason.class_id = method_frame.method.class_id
        reason.method_id = method_frame.method.method_id


pika.channel.Channel._on_close_from_broker = _channel_close_keeping_ids


def _connection_close_keeping_ids(self, method_frame):
    error = pika.exceptions.ConnectionClosedByBroker(
        method_frame.method.reply_code, method_frame.method.reply_text)
    error.class_id = method_frame.method.class_id
    error.method_id = method_frame.method.method_id
    self._terminate_stream(error)


pika.connection.Connection._on_connection_close_from_broker = _connection_close_keeping_ids


# --------------------------------------------------------------------------
# Brokers
# --------------------------------------------------------------------------
@dataclass
class Broker:
    host: str
    port: int
    is_berth: bool
    log_path: str = ""
    # The HTTP (management API) port, when started with --http-listen.
    http_port: int = 0
    pid: int = 0  # of a berth this run started (for /proc/<pid>/status)

    @property
    def uri(self):
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def params(self, **overrides):
        kw = dict(host=self.host, port=self.port,
                  credentials=pika.PlainCredentials("guest", "guest"),
                  virtual_host="/", connection_attempts=1,
                  socket_timeout=10, blocked_connection_timeout=None,
                  heartbeat=0)
        kw.update(overrides)
        return pika.ConnectionParameters(**kw)

    def connect(self, **overrides):
        return pika.BlockingConnection(self.params(**overrides))

    def log_tail(self, lines=40):
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


class BerthProcess:
    """A berth child process on a free loopback port with its own data dir."""

    def __init__(self, extra_args=(), data_dir=None, shared=False):
        # `shared`: serves the whole run (its directory is kept on request
        # when any test failed, not only the last one).
        self.shared = shared
        binary = os.environ.get("BERTH_BIN") or os.path.join(ROOT, "target", "release", "berth")
        if not os.access(binary, os.X_OK):
            pytest.exit(f"berth binary {binary} not found (cargo build --release, "
                        "or set BERTH_TEST_URI to test another broker)", returncode=2)
        self.dir = tempfile.mkdtemp(prefix="berth-pytest-")
        self.log_path = os.path.join(self.dir, "berth.log")
        args = [binary, "serve", "--amqp-listen", "127.0.0.1:0",
                "--data-dir", data_dir or os.path.join(self.dir, "data"), *extra_args]
        env = dict(os.environ, NO_COLOR="1")
        env.setdefault("RUST_LOG", "info")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, env=env)
        _live_procs.append(self)
        try:
            host, port = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.broker = Broker(host, port, is_berth=True, log_path=self.log_path,
                             pid=self.proc.pid)
        with open(self.log_path, errors="replace") as f:
            m = READY_HTTP_RE.search(ANSI_RE.sub("", f.read()))
        if m:
            self.broker.http_port = int(m.group(1).rpartition(":")[2])

    def _wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                m = READY_RE.search(ANSI_RE.sub("", f.read()))
            if m:
                host, _, port = m.group(1).rpartition(":")
                return host.strip("[]"), int(port)
            if self.proc.poll() is not None:
                raise RuntimeError(f"berth exited ({self.proc.returncode}) before it was "
                                   f"ready; log:\n{open(self.log_path, errors='replace').read()}")
            time.sleep(0.05)
        raise RuntimeError(f"no 'berth ready' line after {READY_TIMEOUT_S}s; log:\n"
                           f"{open(self.log_path, errors='replace').read()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_GRACE_S)
        self._log.close()
        if self in _live_procs:
            _live_procs.remove(self)
        remove_test_dir(self.dir, failed=current_test_failed(whole_run=self.shared))


@atexit.register
def _stop_leftovers():
    for p in list(_live_procs):
        p.stop()


def external_uri():
    return os.environ.get("BERTH_TEST_URI") or None


@pytest.fixture(scope="session")
def broker():
    """The broker shared by the whole run."""
    uri = external_uri()
    if uri:
        p = pika.URLParameters(uri)
        yield Broker(p.host, p.port, is_berth=False)
        return
    proc = BerthProcess(shared=True)
    try:
        yield proc.broker
    finally:
        proc.stop()


@pytest.fixture
def start_berth(request):
    """Start a berth with extra flags (and optionally a data directory of the
    test's own, which survives the broker) for this test only (skipped
    against an external broker). Returns a Broker."""
    if external_uri():
        pytest.skip("needs a berth started with special flags (BERTH_TEST_URI is set)")
    started = []

    def start(*flags, data_dir=None):
        proc = BerthProcess([str(f) for f in flags], data_dir=data_dir)
        started.append(proc)
        return proc.broker

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def berth_only(broker):
    if not broker.is_berth:
        pytest.skip("berth-only behaviour (not in RabbitMQ 3.10)")


# --------------------------------------------------------------------------
# Connections and names
# --------------------------------------------------------------------------
class Connections:
    """Opens pika connections and closes them all at teardown."""

    def __init__(self, broker):
        self.broker = broker
        self.opened = []

    def open(self, **overrides):
        conn = self.broker.connect(**overrides)
        self.opened.append(conn)
        return conn

    def close_all(self):
        for conn in self.opened:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass


@pytest.fixture
def conns(broker):
    c = Connections(broker)
    yield c
    c.close_all()


@pytest.fixture
def conn(conns):
    return conns.open()


@pytest.fixture
def ch(conn):
    return conn.channel()


class Cleanup:
    """Deletes named queues/exchanges on a fresh connection after the test,
    so a shared broker is left as it was found."""

    def __init__(self, broker):
        self.broker = broker
        self.queues = []
        self.exchanges = []

    def queue(self, name):
        self.queues.append(name)
        return name

    def exchange(self, name):
        self.exchanges.append(name)
        return name

    def run(self):
        if not self.queues and not self.exchanges:
            return
        try:
            c = self.broker.connect()
        except Exception:
            return
        try:
            for kind, names in (("queue", self.queues), ("exchange", self.exchanges)):
                for name in names:
                    try:
                        ch = c.channel()
                        if kind == "queue":
                            ch.queue_delete(name)
                        else:
                            ch.exchange_delete(name)
                        ch.close()
                    except Exception:
                        pass
        finally:
            try:
                c.close()
            except Exception:
                pass


@pytest.fixture
def cleanup(broker):
    c = Cleanup(broker)
    yield c
    c.run()


@pytest.fixture
def names(cleanup):
    """names.queue() / names.exchange(): unique names, deleted after the test."""

    class Names:
        @staticmethod
        def queue(prefix="q"):
            return cleanup.queue(unique(prefix))

        @staticmethod
        def exchange(prefix="x"):
            return cleanup.exchange(unique(prefix))

    return Names
