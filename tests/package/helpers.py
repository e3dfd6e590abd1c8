"""What the packaging tests share: the paths, podman as the project runs
it, free ports and processes stopped by pid."""

import os
import re
import signal
import socket
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("BERTH_BIN", os.path.join(ROOT, "target", "release", "berth"))
IMAGE = os.environ.get("BERTH_IMAGE", "localhost/berth:test")
PODMAN = os.path.join(ROOT, "scripts", "podman.sh")


def podman(*args, check=True, timeout=120):
    """Runs scripts/podman.sh ARGS; returns the finished process."""
    p = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p


def free_port(ip="127.0.0.1"):
    """A port free on `ip` now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout_s=60.0, every_s=0.1):
    """Polls `check()` until it returns a true value, which it returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def ready_addrs(line):
    """{'amqp': 'IP:PORT', 'http': ...} from a `berth ready` log line."""
    return {k: v.split(",")[0] for k, v in re.findall(r"(\w+)=(\S+)", line.split("berth ready", 1)[1])}


def stop(proc, timeout_s=20):
    """SIGTERM to one process we started (by pid), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return proc.returncode
    os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(10)
