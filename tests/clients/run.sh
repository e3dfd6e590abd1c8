#!/usr/bin/env bash
# Client smoke tests in Node (amqplib), Go (amqp091-go) and Java
# (com.rabbitmq:amqp-client): publish with confirms, consume with manual
# acks, topic routing, mandatory return. Each language's run.sh installs
# what it lacks (idempotent; warm runs need no network) and starts its own
# berth on a free port, or uses the broker at BERTH_TEST_URI if that is set.
#
#   tests/clients/run.sh                      # all three against berth
#   CLIENTS="go java" tests/clients/run.sh    # a subset
#   BERTH_TEST_URI=amqp://guest:guest@127.0.0.1:5672/ tests/clients/run.sh
set -uo pipefail
tests=$(cd "$(dirname "$0")/.." && pwd)
CLIENTS=${CLIENTS:-"node go java"}

passed=0
failed=0
summary=()
for lang in $CLIENTS; do
  if [ ! -x "$tests/$lang/run.sh" ]; then
    echo "clients: no smoke test for '$lang'" >&2
    failed=$((failed + 1)); summary+=("$lang: FAIL (no such client test)")
    continue
  fi
  echo "--- client smoke test: $lang"
  start=$SECONDS
  if "$tests/$lang/run.sh"; then
    passed=$((passed + 1)); line="$lang: PASS ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1)); line="$lang: FAIL ($((SECONDS - start)) s)"
  fi
  echo "--- $line"
  summary+=("$line")
done

echo
printf '%s\n' "${summary[@]}"
echo "clients: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
