"""berth's container image, black-box: a client publishes confirmed
persistent messages, the container is stopped (SIGTERM, then kill -9 in a
second test) and another is started on the same volume: every confirmed
message is there. Also: the image runs as a non-root user on a read-only
root, its health check passes, and a SIGTERM sends clients 320."""

import resource
import time
import uuid

import pika
import pytest

from helpers import IMAGE, free_port, podman, wait_for

MESSAGES = 2000
NOFILE = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
# podman's default and values near the hard limit are refused by runc
# here ("error setting rlimit"); a broker needs far fewer threads.
NPROC = 4096


class Container:
    """One `berth serve` container on the host's network, on `volume`."""

    def __init__(self, volume):
        self.name = f"berth-test-{uuid.uuid4().hex[:8]}"
        self.amqp = free_port()
        self.http = free_port()
        podman(
            "run", "-d", "--name", self.name, "--network", "host", "--read-only",
            # Explicit: podman's defaults are above what this machine allows.
            "--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", f"nproc={NPROC}:{NPROC}",
            "--health-interval", "disable",
            "-e", f"BERTH_URL=http://127.0.0.1:{self.http}",
            "-v", f"{volume}:/var/lib/berth", IMAGE,
            "serve", "--amqp-listen", f"127.0.0.1:{self.amqp}",
            "--http-listen", f"127.0.0.1:{self.http}",
        )
        wait_for(f"{self.name} to log berth ready", self._ready, timeout_s=60)

    def _ready(self):
        state = self.inspect("{{.State.Status}}")
        if state not in ("running", "created"):
            raise AssertionError(f"{self.name} is {state}: {self.logs()}")
        return "berth ready" in self.logs()

    def inspect(self, fmt):
        return podman("inspect", "--format", fmt, self.name).stdout.strip()

    def logs(self):
        p = podman("logs", self.name)
        return p.stdout + p.stderr

    def connect(self):
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp))

    def remove(self):
        podman("rm", "-f", "-v", "-t", "0", self.name, check=False)


@pytest.fixture
def volume():
    name = f"berth-test-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", name)
    started = []
    yield name, started
    for c in started:
        c.remove()
    podman("volume", "rm", "-f", name, check=False)


def publish_confirmed(container, queue, count):
    """Publishes `count` persistent messages, each confirmed; returns the bodies."""
    conn = container.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    bodies = set()
    for i in range(count):
        body = f"{queue}-{i}".encode()
        # Raises if the broker nacks; returns once confirmed.
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
        bodies.add(body)
    conn.close()
    return bodies


def drain(container, queue):
    conn = container.connect()
    ch = conn.channel()
    got = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    conn.close()
    return got


def test_sigterm_stops_cleanly_and_every_confirmed_message_survives(volume):
    vol, started = volume
    first = Container(vol)
    started.append(first)

    # Not root, on the read-only root file system the run asked for.
    pid = first.inspect("{{.State.Pid}}")
    with open(f"/proc/{pid}/status") as f:
        uid_line = next(line for line in f if line.startswith("Uid:"))
    assert uid_line.split()[1] == "10001", uid_line
    # The image's health check (berth health) passes on a single node.
    health = podman("exec", first.name, "/usr/bin/berth", "health", check=False)
    assert health.returncode == 0 and "ok: single node" in health.stdout, health
    assert podman("healthcheck", "run", first.name, check=False).returncode == 0

    bodies = publish_confirmed(first, "pkg-term", MESSAGES)
    idle = first.connect()
    started_stop = time.monotonic()
    podman("stop", "-t", "30", first.name)
    stop_s = time.monotonic() - started_stop
    assert first.inspect("{{.State.ExitCode}}") == "0", first.logs()
    assert stop_s < 15, f"SIGTERM took {stop_s:.1f} s (podman sends SIGKILL only after 30 s)"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        idle.process_data_events(time_limit=5)
    assert closed.value.reply_code == 320, closed.value
    print(f"stopped by SIGTERM in {stop_s:.2f} s")

    second = Container(vol)
    started.append(second)
    got = drain(second, "pkg-term")
    assert len(got) == len(bodies) and set(got) == bodies, (len(got), len(bodies))


def test_kill_9_of_the_container_loses_no_confirmed_message(volume):
    vol, started = volume
    first = Container(vol)
    started.append(first)
    bodies = publish_confirmed(first, "pkg-kill", MESSAGES)
    podman("kill", "--signal", "KILL", first.name)
    wait_for("the killed container to exit", lambda: first.inspect("{{.State.Status}}") == "exited")
    assert first.inspect("{{.State.ExitCode}}") == "137"

    second = Container(vol)
    started.append(second)
    got = drain(second, "pkg-kill")
    assert len(got) == len(bodies) and set(got) == bodies, (len(got), len(bodies))
