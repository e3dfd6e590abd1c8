#!/usr/bin/env bash
# Runs Python black-box test files against a private RabbitMQ 3.10.8
# (scripts/rabbitmq.sh, on free ports, stopped by pid at the end), to show
# that what they pin is RabbitMQ's behaviour and not our reading of it.
# Tests that need a berth of their own skip themselves (BERTH_TEST_URI is
# set); berth-only behaviour is marked `berth_only`. Not part of
# scripts/test.sh: it boots an Erlang VM (~10 s) and needs the package.
#
#   scripts/tests-on-rabbitmq.sh tests/python/test_streams.py [PYTEST_ARGS...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
read -r amqp http dist epmd <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
dir=$(mktemp -d /var/tmp/berth-tests-on-rabbitmq.XXXXXX)
trap 'scripts/rabbitmq.sh stop "$dir" >/dev/null 2>&1; rm -rf "$dir"' EXIT
scripts/rabbitmq.sh start "$dir" "$amqp" "$http" "$dist" "$epmd"
echo "RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server) on amqp $amqp, http $http" >&2
# run.sh makes the virtualenv (once) but always collects the whole
# directory; here only the files named are run.
[ -x tests/python/.venv/bin/python ] || tests/python/run.sh --collect-only -q >/dev/null
BERTH_TEST_URI="amqp://guest:guest@127.0.0.1:$amqp/" BERTH_TEST_HTTP_PORT=$http \
  tests/python/.venv/bin/python -m pytest -q -c tests/python/pytest.ini --rootdir tests/python "$@"
