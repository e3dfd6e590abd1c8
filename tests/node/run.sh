#!/usr/bin/env bash
# Node tests: amqplib against berth (or BERTH_TEST_URI), the smoke test and
# the interop programs of interop.test.js. Installs amqplib from
# package-lock.json into tests/node/node_modules if missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
. ../clients/broker.sh

if ! command -v node >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) ||
    { echo "node: cannot install nodejs/npm" >&2; exit 1; }
fi
# Reinstall only when the lock file is newer than what npm last installed.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error || { echo "node: npm ci failed" >&2; exit 1; }
fi

trap 'broker_stop' EXIT
trap 'exit 130' INT TERM
broker_start || exit 1
timeout -k 5 180 node --test --test-timeout=150000 smoke.test.js interop.test.js
rc=$?
[ $rc -ne 0 ] && broker_stop --show-log
exit $rc
