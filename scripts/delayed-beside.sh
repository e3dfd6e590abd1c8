#!/usr/bin/env bash
# Issue 19: do a million pending delayed messages slow publishing to other
# queues? Broker A holds N pending delayed persistent messages (delays of
# 10–20 minutes, published by scripts/delayed-rss.py --keep); broker B is
# the same binary, empty. `berth bench pagesize` (2 KB, 5 queues, confirms)
# then runs against both, alternating, and says whether they differ.
#
#   scripts/delayed-beside.sh [N] [RUNS]     # defaults 1000000 3
#
# Needs the test virtualenv (tests/python/run.sh makes it) and a release
# build. Every process started here is stopped on exit. Not part of
# scripts/test.sh (a benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000} runs=${2:-3}
bin=${BERTH_BIN:-target/release/berth}
py=${PYTHON:-tests/python/.venv/bin/python}
tmp=$(mktemp -d)
keeper="" empty=""
cleanup() {
  [ -n "$keeper" ] && kill "$keeper" 2>/dev/null && wait "$keeper" 2>/dev/null
  [ -n "$empty" ] && kill "$empty" 2>/dev/null && wait "$empty" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$py" scripts/delayed-rss.py "$n" --keep >"$tmp/keep.log" 2>&1 &
keeper=$!
until grep -q '^keep ' "$tmp/keep.log"; do
  kill -0 "$keeper" 2>/dev/null || { cat "$tmp/keep.log"; exit 1; }
  sleep 1
done
cat "$tmp/keep.log"
port_a=$(sed -n 's/^keep amqp=\([0-9]*\).*/\1/p' "$tmp/keep.log")
"$bin" serve --amqp-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$tmp/empty" >"$tmp/empty.log" 2>&1 &
empty=$!
until grep -q 'amqp=' "$tmp/empty.log"; do
  kill -0 "$empty" 2>/dev/null || { cat "$tmp/empty.log"; exit 1; }
  sleep 0.1
done
port_b=$(grep -o 'amqp=[^ ]*' "$tmp/empty.log" | head -1 | sed 's/.*://')
echo "x = broker with $n pending delayed messages (port $port_a), + = empty broker (port $port_b)"
"$bin" bench pagesize --uri "amqp://guest:guest@127.0.0.1:$port_a/%2f" \
  --vs "amqp://guest:guest@127.0.0.1:$port_b/%2f" --runs "$runs" --sizes 2048 --messages 5000 --quiet
