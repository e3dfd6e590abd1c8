"""The systemd unit (packaging/systemd/berth.service): it passes
`systemd-analyze verify`, its LimitNOFILE covers the connections its
berth.toml allows, and berth tells systemd READY=1 once it serves and
STOPPING=1 on SIGTERM (Type=notify). Also the BERTH_* variables a unit's
Environment= (or a container) sets."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import tomllib

import pytest

from helpers import BIN, ROOT, ready_addrs, stop

UNIT = os.path.join(ROOT, "packaging", "systemd", "berth.service")
UNIT_TOML = os.path.join(ROOT, "packaging", "systemd", "berth.toml")


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="berth-pkg-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def verify(unit_text, tmp):
    """What `systemd-analyze verify` says of the unit (empty when clean),
    with its ExecStart pointed at the binary under test (verify checks
    that the command exists)."""
    path = os.path.join(tmp, "berth.service")
    with open(path, "w") as f:
        f.write(unit_text.replace("/usr/bin/berth", BIN))
    p = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True)
    return f"exit {p.returncode}: {p.stdout}{p.stderr}" if p.returncode or p.stdout or p.stderr else ""


def test_the_unit_passes_systemd_analyze_verify(tmp):
    with open(UNIT) as f:
        text = f.read()
    assert verify(text, tmp) == ""
    # The check sees a mistake (verify only warns on an unknown key).
    assert "Unknown key" in verify(text.replace("NoNewPrivileges=", "NoNewPrivilege="), tmp)
    assert re.search(r"^Type=notify$", text, re.M)


def test_limit_nofile_covers_the_connections_allowed():
    with open(UNIT) as f:
        nofile = int(re.search(r"^LimitNOFILE=(\d+)$", f.read(), re.M).group(1))
    with open(UNIT_TOML, "rb") as f:
        connections = tomllib.load(f)["limits"]["connections_max"]
    # Two descriptors per plain connection, and at least 1024 for the store.
    assert nofile >= 2 * connections + 1024, (nofile, connections)


def start(tmp, env=None, args=()):
    return subprocess.Popen(
        [BIN, "serve", "--amqp-listen", "127.0.0.1:0", "--data-dir", os.path.join(tmp, "data"), *args],
        env={**os.environ, **(env or {})},
        stderr=subprocess.PIPE,
        text=True,
    )


def ready_line(proc):
    for line in proc.stderr:
        if "berth ready" in line:
            return line
    raise AssertionError(f"berth exited {proc.wait()} before its ready line")


def test_berth_tells_systemd_ready_and_stopping(tmp):
    path = os.path.join(tmp, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    proc = start(tmp, {"NOTIFY_SOCKET": path})
    try:
        assert sock.recv(64) == b"READY=1"
        assert "berth ready" in ready_line(proc), "READY=1 came before the listeners were bound"
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(64)  # nothing more while it serves
        sock.settimeout(30)
        os.kill(proc.pid, signal.SIGTERM)
        assert sock.recv(64) == b"STOPPING=1"
        assert proc.wait(30) == 0
    finally:
        stop(proc)
        sock.close()


def test_environment_variables_set_settings_and_flags_win(tmp):
    proc = start(
        tmp,
        {"BERTH_NET_HTTP_LISTEN": "127.0.0.1:0", "BERTH_NET_AMQP_LISTEN": "[::1]:0"},
        args=(),
    )
    try:
        addrs = ready_addrs(ready_line(proc))
        # The flag --amqp-listen (in start) wins over the variable.
        assert addrs["amqp"].startswith("127.0.0.1:"), addrs
        assert addrs["http"].startswith("127.0.0.1:"), addrs
    finally:
        assert stop(proc) == 0


def test_a_bad_variable_is_refused_naming_it(tmp):
    proc = start(tmp, {"BERTH_NET_HEARTBEAT_S": "often"})
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert "BERTH_NET_HEARTBEAT_S" in err and "often" in err, err
