#!/usr/bin/env bash
# Black-box tests of berth with pika (Python) and raw sockets.
#
#   tests/python/run.sh                 # start target/release/berth, run every test
#   tests/python/run.sh -k exchange -x  # extra arguments go to pytest
#   tests/python/run.sh tests/python/test_basic.py   # one file (or FILE::test)
#   BERTH_TEST_URI=amqp://guest:guest@127.0.0.1:5672/ tests/python/run.sh
#                                       # test another broker (e.g. RabbitMQ)
#   BERTH_BIN=/path/to/berth tests/python/run.sh
#
# Idempotent: creates tests/python/.venv and installs the pinned packages
# only when they are missing; warm runs need no network.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv="$here/.venv"
requirements="$here/requirements.txt"

if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    dpkg -s python3-venv >/dev/null 2>&1 || {
      apt-get update -qq && apt-get install -y -qq python3-venv
    }
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
fi

# The TLS tests generate their CA and certificates with the openssl CLI.
command -v openssl >/dev/null 2>&1 || dpkg -s openssl >/dev/null 2>&1 || {
  apt-get update -qq && apt-get install -y -qq openssl
}

# Install only when a pinned requirement is not satisfied already.
if ! "$venv/bin/python" - "$requirements" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, pinned = line.partition("==")
    if version(name) != pinned:
        sys.exit(1)
PY
then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
fi

# The console test (test_console.py) drives Debian's chromium with
# Playwright (`playwright install` cannot download browsers here).
if ! dpkg -s chromium >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# rabbitmqadmin (test_management.py) ships in Debian's rabbitmq-server;
# the package starts the system service, which the tests do not want.
if ! dpkg -s rabbitmq-server >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  service rabbitmq-server stop >/dev/null 2>&1 || true
fi

cd "$root"
# The whole directory unless the arguments name tests of their own
# (a file or a node id: tests/python/run.sh tests/python/test_basic.py).
targets=("$here")
for a in "$@"; do
  case "$a" in
  -*) ;;
  *.py | *.py::*) targets=() ;;
  esac
done
set +e
"$venv/bin/python" -m pytest -q -c "$here/pytest.ini" --rootdir "$here" "${targets[@]}" "$@"
rc=$?
exit $rc
