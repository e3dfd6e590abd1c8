#!/usr/bin/env bash
# Go smoke test: amqp091-go against berth (or BERTH_TEST_URI). The module
# (pinned by go.mod and go.sum) comes from the Go module proxy into the
# default module cache the first time; later runs work offline from it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
. ../clients/broker.sh

command -v go >/dev/null 2>&1 || PATH=$PATH:/usr/local/go/bin
if ! command -v go >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null) ||
    { echo "go: cannot install golang-go" >&2; exit 1; }
fi
# Fetch only what the module cache lacks (a no-op when warm).
go mod download || { echo "go: module download failed" >&2; exit 1; }
# Compile before starting the broker, so build time is not counted in its life.
go test -count=1 -run '^$' . >/dev/null || { echo "go: build failed" >&2; go test -count=1 -run '^$' .; exit 1; }

trap 'broker_stop' EXIT
trap 'exit 130' INT TERM
broker_start || exit 1
timeout -k 5 180 go test -count=1 -timeout 120s -v .
rc=$?
[ $rc -ne 0 ] && broker_stop --show-log
exit $rc
